"""Optimizer steps: `torch.compile(opt.step)` with Inductor and with wrapgen, against eager.

    python -m benchmarks.optimizer [--device cpu|cuda] [--optimizers adamw,adam,sgd,sgd-nesterov]
        [--contenders eager,torch.compile,wrapgen] [--rounds N] [--steps N] [--check-steps N]
        [--small | --no-small] [--threads N] [--out-dir DIR]

The parameters are shaped like GPT-2 small's (148 tensors, 124.4M parameters; on CUDA) or a
scaled-down copy of it (`--small`, the default on CPU: 40 tensors, 3.0M parameters), in float32,
each with a fixed gradient. Contenders, every one on its own copy of the parameters, gradients
and optimizer state, built from the same seed:

    eager[foreach]            the optimizer with foreach=True: the reference
    eager[fused]              fused=True, where torch supports it for that optimizer and device
    torch.compile             torch.compile(opt.step) (Inductor), on the foreach optimizer
    wrapgen[python|cpp]       torch.compile(opt.step, backend="wrapgen", options={"target": t})
    wrapgen[python|cpp+graphs]  the same with "cuda_graphs": True (CUDA, capturable optimizers only)

Each contender first takes `--check-steps` steps from the same start (the first compiles); its
parameters and optimizer state must then equal the reference's (torch.testing.assert_close,
float32 tolerances), else its check column says MISMATCH. (sgd-nesterov has weight decay: see
OPTIMIZERS for why.) After a short warm-up, every round
times `--steps` steps of each contender in turn (the order rotating by one each round); the
median over rounds is reported as µs per step. A contender that raises is reported with the
exception's first line, and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import machine, step_rounds
from benchmarks.report import fmt_time
from benchmarks.step_rounds import Row

REFERENCE = "eager[foreach]"
SEED = 0


# -- the parameter sets ----------------------------------------------------------------------------


def gpt2_shapes(vocab: int, positions: int, hidden: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """GPT-2's parameters by name and shape (the LM head is tied to `wte`: not a tensor of its own)."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("wte", (vocab, hidden)), ("wpe", (positions, hidden))]
    for i in range(layers):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", (hidden,)), (h + "ln_1.bias", (hidden,)),
            (h + "attn.c_attn.weight", (hidden, 3 * hidden)), (h + "attn.c_attn.bias", (3 * hidden,)),
            (h + "attn.c_proj.weight", (hidden, hidden)), (h + "attn.c_proj.bias", (hidden,)),
            (h + "ln_2.weight", (hidden,)), (h + "ln_2.bias", (hidden,)),
            (h + "mlp.c_fc.weight", (hidden, 4 * hidden)), (h + "mlp.c_fc.bias", (4 * hidden,)),
            (h + "mlp.c_proj.weight", (4 * hidden, hidden)), (h + "mlp.c_proj.bias", (hidden,)),
        ]
    return shapes + [("ln_f.weight", (hidden,)), ("ln_f.bias", (hidden,))]


PARAMETER_SETS = {
    "gpt2": dict(vocab=50257, positions=1024, hidden=768, layers=12),  # GPT-2 small
    "small": dict(vocab=8192, positions=256, hidden=192, layers=3),
}


def make_tensors(shapes: Sequence[tuple[str, tuple[int, ...]]], device: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Starting values and fixed gradients, from SEED (made on the CPU: the same on every device)."""
    generator = torch.Generator().manual_seed(SEED)
    values, grads = [], []
    for name, shape in shapes:
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            value = torch.ones(shape)
        elif name.endswith("bias"):
            value = torch.zeros(shape)
        else:
            value = torch.randn(shape, generator=generator) * 0.02
        values.append(value.to(device))
        grads.append((torch.randn(shape, generator=generator) * 1e-3).to(device))
    return values, grads


# -- the optimizers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerCase:
    name: str
    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any]
    cuda_only: bool = False

    @property
    def capturable(self) -> bool:
        return bool(self.kwargs.get("capturable"))

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.cls.__name__}({args})"


OPTIMIZERS = {
    case.name: case
    for case in (
        OptimizerCase("adamw", torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}),
        OptimizerCase("adam", torch.optim.Adam, {"lr": 1e-3}),
        OptimizerCase("adamw-capturable", torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01, "capturable": True},
                      cuda_only=True),
        OptimizerCase("adam-capturable", torch.optim.Adam, {"lr": 1e-3, "capturable": True}, cuda_only=True),
        OptimizerCase("sgd", torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
        # weight_decay > 0: without it, torch's foreach SGD adds momentum * buf into p.grad in place when
        # nesterov=True (`_multi_tensor_sgd`, torch 2.11-2.13), which the for-loop and fused SGD do not; with
        # the benchmark's fixed gradients every foreach contender would then drift from eager[fused].
        OptimizerCase("sgd-nesterov", torch.optim.SGD,
                      {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}),
    )
}


# -- the contenders --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    name: str
    implementation: str  # "foreach" | "fused": the optimizer's own flag
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None  # wraps opt.step
    cuda_only: bool = False
    capturable_only: bool = False


def _wrapgen(target: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def compile_step(step: Callable[..., Any]) -> Callable[..., Any]:
        import wrapgen.dynamo

        wrapgen.dynamo.ensure_registered()  # run from a checkout, the entry point may be missing
        return torch.compile(step, backend="wrapgen", options={"target": target, **options})

    return compile_step


CONTENDERS = [
    Contender(REFERENCE, "foreach"),
    Contender("eager[fused]", "fused"),
    Contender("torch.compile", "foreach", torch.compile),
    Contender("wrapgen[python]", "foreach", _wrapgen("python")),
    Contender("wrapgen[cpp]", "foreach", _wrapgen("cpp")),
    Contender("wrapgen[python+graphs]", "foreach", _wrapgen("python", cuda_graphs=True), cuda_only=True,
              capturable_only=True),
    Contender("wrapgen[cpp+graphs]", "foreach", _wrapgen("cpp", cuda_graphs=True), cuda_only=True,
              capturable_only=True),
]


@dataclass
class Instance:
    """One contender's parameters (with their gradients), optimizer and step function."""

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    step: Callable[[], Any]


def build(case: OptimizerCase, contender: Contender, values: list[torch.Tensor], grads: list[torch.Tensor]) -> Instance:
    params = [torch.nn.Parameter(v.clone()) for v in values]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    flags = {"fused": True} if contender.implementation == "fused" else {"foreach": True}
    optimizer = case.cls(params, **case.kwargs, **flags)
    step = optimizer.step if contender.compile is None else contender.compile(optimizer.step)
    return Instance(params, optimizer, step)


# -- the check -------------------------------------------------------------------------------------


def tensors_of(instance: Instance, names: Sequence[str]) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and every tensor of its optimizer state, by name."""
    out = []
    for name, p in zip(names, instance.params):
        out.append((name, p.detach()))
        for key, value in sorted(instance.optimizer.state[p].items()):
            if isinstance(value, torch.Tensor):
                out.append((f"{name}.{key}", value))
    return out


def compare(actual: Instance, expected: Instance, names: Sequence[str]) -> tuple[str | None, float]:
    """(None, largest |difference|) when every parameter and state tensor matches the reference's
    with float32 tolerances, else (the first differing tensor and how, largest |difference|)."""
    mine, theirs = tensors_of(actual, names), tensors_of(expected, names)
    if [n for n, _ in mine] != [n for n, _ in theirs]:
        missing = sorted({n for n, _ in theirs} ^ {n for n, _ in mine})[:3]
        return f"optimizer state differs in its entries: {', '.join(missing)}", float("nan")
    worst, reason = 0.0, None
    for (name, a), (_, e) in zip(mine, theirs):
        a = a.to(e.device)
        if a.shape == e.shape and a.is_floating_point() and e.is_floating_point():
            worst = max(worst, float((a.float() - e.float()).abs().max()) if a.numel() else 0.0)
        if reason is None:
            try:
                torch.testing.assert_close(a, e, check_device=False)
            except AssertionError as error:
                lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                reason = f"{name}: " + "; ".join(lines[1:3] or lines[:1])
    return reason, worst


# -- the run ---------------------------------------------------------------------------------------


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_case(case: OptimizerCase, contenders: list[Contender], values: list[torch.Tensor], grads: list[torch.Tensor],
             names: Sequence[str], args: argparse.Namespace) -> list[Row]:
    device = args.device
    rows: dict[str, Row] = {}
    instances: dict[str, Instance] = {}
    reference: Instance | None = None
    for contender in contenders:  # the reference first
        if contender.capturable_only and not case.capturable:
            continue  # CUDA graphs need the step count on the device: no row
        row = rows[contender.name] = Row(case.name, contender.name)
        try:
            instance = build(case, contender, values, grads)
        except Exception as error:  # noqa: BLE001 - e.g. fused=True for a device or optimizer torch lacks
            if contender.implementation == "fused":
                row.status, row.check, row.detail = "skipped", "skipped", f"build: {step_rounds.first_line(error)}"
            else:
                row.fail("build", error)
            continue
        _progress(f"{case.name}: {contender.name}: {args.check_steps} steps (the first compiles)")
        try:
            graphs = step_rounds.dynamo_graphs()
            _, row.first_call_s = step_rounds.wall_time(instance.step, device)
            for _ in range(args.check_steps - 1):
                instance.step()
            step_rounds.synchronize(device)
            if contender.compile is not None:
                row.graphs = step_rounds.dynamo_graphs() - graphs
        except Exception as error:  # noqa: BLE001 - the row says what broke; the run goes on
            row.fail("compile and check steps", error)
            continue
        if contender.name == REFERENCE:
            reference, row.check = instance, "ok"
        elif reference is None:
            row.detail = f"not checked: {REFERENCE} failed"
        else:
            try:
                reason, worst = compare(instance, reference, names)
                row.extra["max_abs_diff"] = worst
                row.check, row.detail = ("ok", "") if reason is None else ("mismatch", reason)
            except Exception as error:  # noqa: BLE001
                row.check, row.detail = "error", f"check: {step_rounds.first_line(error)}"
        instances[contender.name] = instance

    measures: dict[str, Callable[[], float]] = {}
    for name, instance in instances.items():
        row = rows[name]
        try:
            for _ in range(args.warmup):
                instance.step()
            step_rounds.synchronize(device)
        except Exception as error:  # noqa: BLE001
            row.fail("warm-up", error)
            continue

        def measure(instance: Instance = instance) -> float:
            def steps() -> None:
                for _ in range(args.steps):
                    instance.step()

            return step_rounds.time_block(steps, device) / args.steps

        measures[name] = measure
    _progress(f"{case.name}: {args.rounds} rounds of {args.steps} steps per contender")
    step_rounds.run_rounds(rows, measures, args.rounds)
    return list(rows.values())


# -- the report ------------------------------------------------------------------------------------


def markdown(rows: list[Row], info: machine.MachineInfo, settings: dict[str, Any], command: str) -> str:
    lines = step_rounds.header(info, "wrapgen benchmarks: optimizer steps", settings, command)
    lines += ["## µs per optimizer step", "",
              "| optimizer | contender | status | µs/step (median) | min - max | vs eager[foreach] | vs torch.compile "
              "| first step | graphs | check |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ref = next((x.median_s for x in rows if x.case == r.case and x.contender == REFERENCE), None)
        inductor = next((x.median_s for x in rows if x.case == r.case and x.contender == "torch.compile"), None)
        median = r.median_s
        spread = f"{min(r.round_times) * 1e6:.1f} - {max(r.round_times) * 1e6:.1f}" if median else "—"
        check = step_rounds.CHECK_TEXT[r.check]
        lines.append("| " + " | ".join(step_rounds.cell(c) for c in [
            r.case, r.contender, r.status, step_rounds.fmt(median and median * 1e6, ".1f"), spread,
            step_rounds.fmt(ref / median if ref and median else None, ".2f", "x"),
            step_rounds.fmt(inductor / median if inductor and median and r.contender != "torch.compile" else None,
                            ".2f", "x"),
            fmt_time(r.first_call_s), step_rounds.fmt(r.graphs, "d"), check,
        ]) + " |")
    lines.append("")
    lines += step_rounds.failures(rows)
    lines += [
        "## Method", "",
        "- Each contender has its own parameters, gradients and optimizer state, made from the same seed; the",
        "  gradients stay fixed. It takes `check steps` steps first (the first compiles: **first step** is its",
        "  synchronized wall time, with the compile caches as found), then its parameters and every optimizer",
        "  state tensor are compared with eager[foreach]'s by `torch.testing.assert_close` (float32 defaults:",
        "  rtol 1.3e-6, atol 1e-5): **check** ok or MISMATCH (the first differing tensor is under Failures).",
        "- **graphs**: graphs dynamo compiled for the contender during those steps.",
        "- Then each round times `steps` back-to-back steps of every contender, the order rotating by one each",
        "  round (CUDA events on a GPU, the wall clock on CPU, synchronized before and after); reported: the",
        "  median over rounds of µs per step, and the fastest and slowest round.",
        "",
    ]
    return "\n".join(lines)


def grid(rows: list[Row]) -> str:
    """The printed summary: optimizer x contender, µs per step (or why not)."""
    names = list(dict.fromkeys(r.contender for r in rows))
    lines = ["| optimizer | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for case in dict.fromkeys(r.case for r in rows):
        cells = []
        for name in names:
            r = next((x for x in rows if x.case == case and x.contender == name), None)
            if r is None or r.status == "skipped":
                cells.append("—")
            elif r.status != "ok":
                cells.append("ERROR")
            else:
                cells.append(f"{r.median_s * 1e6:.1f}" + ("" if r.check == "ok" else f" ({r.check})"))
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optimizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--optimizers", default=None,
                        help=f"comma-separated subset of {', '.join(OPTIMIZERS)} (default: all the device runs)")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated subset of {', '.join(c.name for c in CONTENDERS)}; 'wrapgen' names "
                             f"every wrapgen[...] ({REFERENCE} always runs)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 11 on CUDA, 5 on CPU)")
    parser.add_argument("--steps", type=int, default=None, help="steps per contender per round (default 20; 10 on CPU)")
    parser.add_argument("--check-steps", type=int, default=10, help="steps before the correctness check (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the check (default 2)")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=None,
                        help="the scaled-down parameter set (default: on CPU; GPT-2 small's shapes on CUDA)")
    args = step_rounds.parse_common(parser, argv)
    on_cuda = args.device == "cuda"
    args.rounds = args.rounds or (11 if on_cuda else 5)
    args.steps = args.steps or (20 if on_cuda else 10)
    for name in ("rounds", "steps", "check_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    chosen = args.optimizers.split(",") if args.optimizers else [
        n for n, c in OPTIMIZERS.items() if on_cuda or not c.cuda_only]
    for name in chosen:
        if name not in OPTIMIZERS:
            parser.error(f"unknown optimizer {name!r}; optimizers are: {', '.join(OPTIMIZERS)}")
        if OPTIMIZERS[name].cuda_only and not on_cuda:
            parser.error(f"{name} runs on CUDA only")
    args.cases = [OPTIMIZERS[n] for n in chosen]
    available = [c.name for c in CONTENDERS if on_cuda or not c.cuda_only]
    try:
        wanted = step_rounds.select(available, args.contenders, REFERENCE)
    except ValueError as error:
        parser.error(str(error))
    args.chosen = [c for c in CONTENDERS if c.name in wanted]
    return args


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    set_name = "small" if args.small else "gpt2"
    shapes = gpt2_shapes(**PARAMETER_SETS[set_name])
    values, grads = make_tensors(shapes, args.device)
    names = [n for n, _ in shapes]
    count = sum(v.numel() for v in values)
    _progress(f"{set_name}: {len(shapes)} tensors, {count / 1e6:.2f}M parameters on {args.device}")
    rows: list[Row] = []
    with step_rounds.raised_recompile_limits():
        for case in args.cases:
            rows += run_case(case, args.chosen, values, grads, names, args)
            torch._dynamo.reset()
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    info = machine.collect(args.device)
    command = "python -m benchmarks.optimizer " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = {
        "parameters": f"`{set_name}`: {len(shapes)} float32 tensors, {count:,} parameters"
                      + (" (GPT-2 small's shapes)" if set_name == "gpt2" else " (GPT-2's structure, scaled down)"),
        "optimizers": "; ".join(f"{c.name}: `{c.describe()}`" for c in args.cases),
        "rounds × steps": f"{args.rounds} × {args.steps} (after {args.check_steps} checked + {args.warmup} warm-up steps)",
        "run took": f"{(time.perf_counter() - started) / 60:.1f} min",
    }
    text = markdown(rows, info, settings, command)
    payload = {"machine": info.as_dict(), "settings": settings | {
        "parameter_set": set_name, "tensors": len(shapes), "parameters": count, "rounds": args.rounds,
        "steps": args.steps, "check_steps": args.check_steps, "warmup": args.warmup,
        "optimizers": {c.name: c.describe() for c in args.cases}}, "command": command,
        "results": step_rounds.rows_json(rows)}
    suite = f"optimizer-{set_name}" + (f"-threads{args.threads}" if args.threads else "")
    paths = step_rounds.write(args.out_dir, machine.file_stem(info, suite), text, payload)
    print(grid(rows))
    print()
    print("\n".join(step_rounds.failures(rows)))
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
