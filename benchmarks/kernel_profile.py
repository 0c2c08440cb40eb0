"""Kernels per step: each contender's step profiled with torch.profiler, beside its wall time.

    python -m benchmarks.kernel_profile --model gpt2 [--device cpu|cuda] [--dtype fp32|bf16] [--size S] [--train]
        [--contenders 'torch.compile,wrapgen[python],wrapgen[cpp]'] [--steps N] [--rounds N] [--top K] [--tag W]
        [--out-dir DIR] [--threads N] [--warmup N]
    python -m benchmarks.kernel_profile --optimizer adamw [--size gpt2|small] ...   one optimizer step
    python -m benchmarks.kernel_profile --decode [--size full|small] ...            one Llama decode step

--model: a family of benchmarks.models (gpt2, llama, bert, resnet50, vit_b16; --size full, small, b1x32), a
model of benchmarks.suite by its row name (timm/convnext_tiny, huggingface/opt; --size full, small) or a
micro workload of benchmarks.workloads (--size cuda, cpu, quick); --train: its training step. --optimizer:
benchmarks.optimizer's case and contenders; --decode: benchmarks.decode's Llama and StaticCache (a step: the next
token's forward and argmax, after an eager prefill of 16 tokens). `wrapgen-python` means `wrapgen[python]`;
`wrapgen-dynamo[python]` is torch.compile(model, backend="wrapgen") (suite and family models); the reference
(eager) always runs. Every contender is built and warmed up in one process, then:

- **ms/step**: wall time without the profiler, `--steps` steps per round, contenders interleaved (the order
  rotating), median over `--rounds`. **host µs/step**: a call without waiting for the device (CUDA). On CUDA,
  **peak MiB** above what was allocated before: the build and first step's, a warm step's.
- `--steps` more steps under torch.profiler (one more before them warms it up). On CUDA, **kernels** are the
  device activities (kernels, memcpy, memset), **kernel µs** their summed durations. On CPU the profiler sees
  ATen ops, not generated code: kernels are the outermost ATen calls that compute (views and allocations left
  out) and the generated C++ kernels a Python wrapper calls by module-level name (wrapgen's python target,
  Inductor), wrapped in record_function for the profiled steps only; kernel µs is their CPU time on the calling
  thread (the profiler's few µs per event included). wrapgen[cpp]'s CPU kernels run inside its library: its
  rows count library calls only. **library calls**: the outermost ATen calls (none inside CUDA-graph replays).

An option's A/B: every option in wrapgen/config.py has an environment variable, read at import, so it is the
same command run twice, e.g. `WRAPGEN_CONSTANT_MASKS=0 python -m benchmarks.kernel_profile --model llama --tag
masks-off` and without the variable; the page lists the WRAPGEN_* variables set. --out-dir writes
`kernel-profile-<case>-<dtype>[-<tag>]-<device>-<date>-<machine>-<commit>.{md,json}`.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import statistics
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

from benchmarks import decode, machine, model_suite, models, optimizer, step_rounds, workloads
from benchmarks.harness import build_callable
from benchmarks.interleaved import interleave
from benchmarks.suite import catalog as suite_catalog

Step = Callable[[], Any]
NOT_KERNELS = frozenset(  # ATen calls that only allocate, view or read metadata: not library work
    "empty empty_strided empty_like new_empty new_empty_strided as_strided view _unsafe_view reshape _reshape_alias to "
    "flatten unflatten expand t transpose permute squeeze unsqueeze slice select split narrow split_with_sizes chunk "
    "unbind detach detach_ alias lift_fresh resolve_conj resolve_neg contiguous set_ resize_ item _local_scalar_dense"
    .split())


def case_builders(args: argparse.Namespace) -> tuple[str, str, dict[str, Callable[[], Step]]]:
    """(case name, description, contender -> a function building its warm-able step)."""
    cuda, names = args.device == "cuda", ",".join(  # `wrapgen-python+graphs` is `wrapgen[python+graphs]`
        f"wrapgen[{n[8:]}]" if n.startswith("wrapgen-") and "[" not in n else n for n in args.contenders.replace(" ", "").split(","))
    if args.optimizer:
        case = optimizer.OPTIMIZERS[args.optimizer]
        set_name = args.size or ("gpt2" if cuda else "small")
        shapes = optimizer.gpt2_shapes(**optimizer.PARAMETER_SETS[set_name])
        values, grads = optimizer.make_tensors(shapes, args.device)
        known = [c for c in optimizer.CONTENDERS if (cuda or not c.cuda_only) and not (c.capturable_only and
                                                                                       not case.capturable)]
        wanted = step_rounds.select([c.name for c in known], names, optimizer.REFERENCE)
        builds = {c.name: (lambda c=c: optimizer.build(case, c, values, grads).step) for c in known if c.name in wanted}
        return f"optimizer-{case.name}-{set_name}", f"{case.describe()} on `{set_name}` ({len(shapes)} tensors)", builds
    if args.decode:
        size, dtype = args.size or ("full" if cuda else "small"), decode.DTYPES[args.dtype]
        model = decode.build_model(size, args.device, dtype)
        prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
        known = [c for c in decode.CONTENDERS if cuda or not c.cuda_only]
        wanted = step_rounds.select([c.name for c in known], names, decode.REFERENCE)

        def make_decode(c: decode.Contender) -> Step:
            forward = model.forward if c.compile is None else c.compile(model.forward)
            mark = torch.compiler.cudagraph_mark_step_begin if c.mark_steps else None
            tokens = 4 + args.warmup + args.steps * (args.rounds + 3)  # every step of this run, each a new position
            generation = decode.Generation(model, forward, prompt.to(args.device), tokens, args.device, dtype, mark)
            positions, last = iter(range(tokens)), [generation.prefill()]

            def step() -> Any:
                logits = generation.step(next(positions), last[0])
                last[0] = logits[:, -1:].argmax(-1)
                return logits
            return step

        builds = {c.name: (lambda c=c: make_decode(c)) for c in known if c.name in wanted}
        return f"llama-decode-{size}", f"one decode step of benchmarks.decode's `{size}` Llama", builds
    if args.model in models.FAMILIES:
        size = args.size or models.default_size(args.device)
        tasks = ("training",) if args.train else ("inference",)
        found = model_suite.model_workloads([models.FAMILIES[args.model]], size, args.dtype, tasks=tasks)
        if not found:
            raise SystemExit(f"{args.model} has no {tasks[0]} workload at size {size}")
        workload = found[0]
    elif "/" in args.model:  # a model of benchmarks.suite (timm/convnext_tiny, huggingface/opt)
        size = args.size or ("full" if cuda else "small")
        try:
            found = suite_catalog.workloads(suite_catalog.select(None, args.model), size, args.dtype, args.train)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        if args.train and not found[-1].training:
            raise SystemExit(f"{args.model} has no training step in benchmarks.suite")
        workload = found[-1]
    elif args.model in workloads.WORKLOADS:
        if args.train or args.dtype != "fp32":
            raise SystemExit("micro workloads are float32 inference only")
        size, workload = args.size or ("cuda" if cuda else "cpu"), workloads.WORKLOADS[args.model]
    else:
        raise SystemExit(f"unknown model {args.model!r}: one of {', '.join([*models.FAMILIES, *workloads.WORKLOADS])}, "
                         "or a benchmarks.suite model as suite/name")
    model, inputs = workload.build(args.device, size)

    def make_model(contender: Any) -> Step:  # called under no_grad (main): a training step enables grad itself
        fn = build_callable(workload, contender, model, inputs)
        return lambda: fn(*inputs)

    builds = {c.name: (lambda c=c: make_model(c)) for c in model_suite.model_contenders(args.device, names)
              if not workload.training or c.train_build is not None}
    return f"{workload.name}-{size}", f"{workload.description}: {workload.size_text(size)}", builds


def _namespaces() -> dict[int, dict[str, Any]]:
    """Every module's globals (a generated module's object may be gone while its functions keep them)."""
    return {id(d): d for d in gc.get_objects() if type(d) is dict and "__name__" in d and "__builtins__" in d}


@contextmanager
def visible_kernels(namespaces: list[dict[str, Any]]) -> Iterator[set[str]]:
    """Generated CPU kernels that wrappers call by module-level name (`cpp_*`, not Python code)
    wrapped in record_function for the block, so the profiler sees them; yields their names."""
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            if name.startswith("cpp_") and callable(value) and not isinstance(value, (type, types.FunctionType)):
                def kernel(*args: Any, _fn: Any = value, _name: str = name) -> Any:
                    with torch.profiler.record_function(_name):
                        return _fn(*args)
                swapped.append((namespace, name, value))
                namespace[name] = kernel
    try:
        yield {name for _, name, _ in swapped}
    finally:
        for namespace, name, value in swapped:
            namespace[name] = value


def analyse(events: list[Any], steps: int, device: str, generated: set[str]) -> dict[str, Any]:
    """Per step: kernel time (µs), kernels, library calls, and kernels by name (calls, µs)."""
    def counted(e: Any) -> bool:
        return e.name in generated or (e.name.startswith("aten::") and e.name[6:] not in NOT_KERNELS)

    def outermost(e: Any) -> bool:
        parent = e.cpu_parent
        while parent is not None and not counted(parent):
            parent = parent.cpu_parent
        return parent is None

    host = [e for e in events if e.device_type == DeviceType.CPU and counted(e) and outermost(e)]
    # record_function ranges (ProfilerStep#, Optimizer.step#...) show on the device timeline too: not kernels
    kernels = ([e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
               if device == "cuda" else host)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_name[e.name][0] += 1
        by_name[e.name][1] += e.time_range.end - e.time_range.start
    return {"kernel_us": sum(v[1] for v in by_name.values()) / steps, "kernels": len(kernels) / steps,
            "library_calls": sum(e.name.startswith("aten::") for e in host) / steps,
            "top": [{"name": n, "calls": c / steps, "us": us / steps}
                    for n, (c, us) in sorted(by_name.items(), key=lambda item: -item[1][1])]}


def _peak_of(device: str, fn: Callable[[], Any]) -> float | None:
    """Runs fn; on CUDA, the MiB its peak rose above what was allocated before it."""
    if device != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def profile_case(args: argparse.Namespace, builds: dict[str, Callable[[], Step]]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    calls: dict[str, Step] = {}
    generated: dict[str, list[dict[str, Any]]] = {}
    for name, build in builds.items():
        print(f"{name}: build, first step and warm-up", file=sys.stderr, flush=True)
        seen = _namespaces()
        try:
            built: list[Step] = []
            first_peak = _peak_of(args.device, lambda b=built, f=build: b.append(f()) or b[0]())
            step = built[0]
            for _ in range(args.warmup):
                step()
        except Exception as error:  # noqa: BLE001 - one contender's failure is its row's
            rows[name] = {"status": "error", "detail": step_rounds.first_line(error)}
            continue
        rows[name] = {"status": "ok", "first_step_peak_mib": first_peak}
        calls[name] = step
        generated[name] = [d for i, d in _namespaces().items() if i not in seen] if args.device == "cpu" else []
    times = interleave(calls, args.device, args.rounds, args.steps) if calls else {}
    activities = [torch.profiler.ProfilerActivity.CPU, *[torch.profiler.ProfilerActivity.CUDA] * (args.device == "cuda")]
    for name, step in calls.items():
        row = rows[name]
        row["wall_ms"] = statistics.median(times[name]) * 1e3
        row["round_ms"] = [t * 1e3 for t in times[name]]
        host = []
        for _ in range(args.steps):
            begin = time.perf_counter()
            step()
            host.append(time.perf_counter() - begin)
            step_rounds.synchronize(args.device)
        row["host_us"] = statistics.median(host) * 1e6
        row["warm_step_peak_mib"] = _peak_of(args.device, step)
        with visible_kernels(generated[name]) as names, torch.profiler.profile(activities=activities, schedule=(
                torch.profiler.schedule(wait=0, warmup=1, active=args.steps, repeat=1))) as prof:  # 1 step warms up
            for _ in range(args.steps + 1):
                step()
                step_rounds.synchronize(args.device)
                prof.step()
        row.update(analyse(list(prof.events()), args.steps, args.device, names))
        row["generated_visible"] = args.device == "cuda" or bool(names) or name.startswith("eager")
    return rows


def tables(rows: dict[str, dict[str, Any]], top: int, device: str) -> str:
    lines = ["| contender | ms/step | host µs/step | kernel µs/step | kernels/step | library calls/step "
             "| first-step peak MiB | warm-step peak MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        if r["status"] != "ok":
            lines.append(f"| {name} | ERROR: {step_rounds.cell(r['detail'])[:200]} |||||||")
            continue
        note = "" if r["generated_visible"] else " (library calls only)"
        lines.append(f"| {name} | {r['wall_ms']:.3f} | {r['host_us']:.1f} | {r['kernel_us']:.1f}{note} "
                     f"| {r['kernels']:.1f} | {r['library_calls']:.1f} | "
                     + " | ".join("—" if r[k] is None else f"{r[k]:.1f}" for k in ("first_step_peak_mib",
                                                                                 "warm_step_peak_mib")) + " |")
    for name, r in rows.items():
        if r["status"] == "ok":
            lines += ["", f"### {name}: top {top} kernels by {'device' if device == 'cuda' else 'CPU'} time", "",
                      "| kernel | calls/step | µs/step |", "|---|---:|---:|"]
            lines += [f"| `{step_rounds.cell(k['name'])[:120]}` | {k['calls']:.1f} | {k['us']:.1f} |"
                      for k in r["top"][:top]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_profile", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a benchmarks.models family, a benchmarks.suite model (suite/name) or a "
                      "benchmarks.workloads workload")
    what.add_argument("--optimizer", choices=sorted(optimizer.OPTIMIZERS), help="one benchmarks.optimizer step")
    what.add_argument("--decode", action="store_true", help="one decode step of benchmarks.decode's Llama")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(model_suite.DTYPES), default="fp32")
    parser.add_argument("--size", default=None, help="size profile or parameter set (default: the device's)")
    parser.add_argument("--train", action="store_true", help="the model's training step (forward + backward)")
    parser.add_argument("--contenders", default="torch.compile,wrapgen[python],wrapgen[cpp]",
                        help="comma-separated; the case's reference (eager) always runs")
    for flag, default, text in (("--steps", 10, "steps per timed round, and profiled"), ("--rounds", 5, "timed rounds"),
                                ("--warmup", 3, "untimed steps after the first"), ("--top", 10, "kernels listed")):
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default {default})")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    parser.add_argument("--tag", default="", help="a word for the file name (the side of an A/B)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the .md and .json pages here")
    args = parser.parse_args(argv)
    if min(args.steps, args.rounds, args.top) < 1 or args.warmup < 0:
        parser.error("--steps, --rounds and --top must be at least 1, --warmup at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    with torch.no_grad(), step_rounds.raised_recompile_limits():  # a training step enables grad itself
        case, description, builds = case_builders(args)
        rows = profile_case(args, builds)
    print(text := tables(rows, args.top, args.device))
    command = "python -m benchmarks.kernel_profile " + shlex.join(sys.argv[1:] if argv is None else argv)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("WRAPGEN_")}
    info = machine.collect(args.device)
    settings = {"case": f"`{case}`: {description}, {args.dtype}" + (", training step" if args.train else ""),
                "steps": f"{args.rounds} timed rounds × {args.steps} steps; {args.steps} profiled steps",
                "WRAPGEN_ environment": ", ".join(f"`{k}={v}`" for k, v in env.items()) or "none"}
    payload = {"machine": info.as_dict(), "case": case, "description": description, "command": command,
               "environment": env, "settings": vars(args), "results": rows}
    if args.out_dir is not None:
        page = "\n".join(step_rounds.header(info, f"wrapgen benchmarks: kernels per step, {case}", settings,
                                            command)) + "\n" + text + "\n\nMethod: `benchmarks/kernel_profile.py`.\n"
        suite = f"kernel-profile-{case}-{args.dtype}" + (f"-{args.tag}" if args.tag else "")
        for path in step_rounds.write(args.out_dir, machine.file_stem(info, suite), page, payload):
            print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
