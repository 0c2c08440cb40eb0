"""Contenders side by side, alternating: the real models' per-call times where the machine's speed drifts.

`benchmarks.run` builds, measures and drops one contender at a time, which keeps one contender's
memory out of another's figures; but on a shared machine whose speed drifts between contenders
(the 2-core VM moved torch.compile's GPT-2 time between 17.9 and 22.2 ms across two runs), the
ratios move with the drift. Here every contender is built once and kept; then each round times a
batch of calls of every contender, in an order that rotates from round to round, and the
per-contender medians over the rounds give ratios the drift cannot bias. Warm calls only: cold
compiles and peak memory are `benchmarks.run`'s.

    python -m benchmarks.interleaved --device cpu --models gpt2,llama --tasks inference,training \\
        --contenders 'torch.compile,wrapgen[python],wrapgen[cpp]' --rounds 11 --calls 5 \\
        [--out-dir benchmarks/results | --out FILE]

--out-dir writes `interleaved-<dtype>[-<size>][-<models>][-<task>]-<device>-<date>-<machine>-<commit>.md`
(the scheme of benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import machine, measure, model_suite, models
from benchmarks.contenders import Contender
from benchmarks.harness import build_callable
from benchmarks.workloads import Workload


def interleave(calls: dict[str, Callable[[], Any]], device: str, rounds: int, per_batch: int) -> dict[str, list[float]]:
    """Seconds per call of each entry of `calls`, one batch of `per_batch` calls per round, the
    order rotated by one every round."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            measure.synchronize(device)
            start = time.perf_counter()
            for _ in range(per_batch):
                calls[name]()
            measure.synchronize(device)
            times[name].append((time.perf_counter() - start) / per_batch)
    return times


def _calls(workload: Workload, contenders: list[Contender], device: str, size: str) -> dict[str, Callable[[], Any]]:
    """Each contender's warm call of the workload (built, then called three times)."""
    model, inputs = workload.build(device, size)
    calls = {}
    for contender in contenders:
        if workload.training and contender.train_build is None:
            continue
        with torch.no_grad():
            fn = build_callable(workload, contender, model, inputs)

        def call(fn: Callable[..., Any] = fn) -> Any:
            with torch.no_grad():
                return fn(*inputs)

        for _ in range(3):
            call()
        calls[contender.name] = call
    return calls


def table(results: dict[str, dict[str, list[float]]], reference: str = "torch.compile") -> str:
    """Markdown: per workload and contender, the median ms per call, the spread over rounds and
    the ratio reference / contender."""
    lines = ["| model | contender | ms per call (median) | min - max | vs " + reference + " |", "|---|---|---:|---:|---:|"]
    for workload, times in results.items():
        base = statistics.median(times[reference]) if reference in times else None
        for name, values in times.items():
            median = statistics.median(values)
            ratio = f"{base / median:.3f}x" if base is not None and name != reference else "—"
            lines.append(f"| {workload} | {name} | {median * 1e3:.2f} | {min(values) * 1e3:.2f} - {max(values) * 1e3:.2f} | {ratio} |")
    return "\n".join(lines)


def provenance(device: str, argv: list[str], info: machine.MachineInfo | None = None) -> str:
    """Where and from what a table was measured: a result file read later needs the machine,
    the versions and the commit (a modified checkout names its tree), and the command."""
    info = info or machine.collect(device)
    return (f"Measured {info.date} {info.time} on {info.machine} ({info.cores} cores); torch {info.torch}, "
            f"Triton {info.triton}, wrapgen {info.wrapgen} (commit {info.wrapgen_commit}). "
            f"Command: `python -m benchmarks.interleaved {' '.join(argv)}`.")


def suite_name(args: argparse.Namespace, size: str) -> str:
    """`interleaved-<dtype>`, then the size, models and task words of `model_suite.suite_name`."""
    words = argparse.Namespace(device=args.device, dtype=args.dtype, models=args.models, tasks=args.tasks,
                               threads=None, quick=False)
    return "interleaved-" + model_suite.suite_name(words, size).removeprefix("models-")


def page(args: argparse.Namespace, argv: list[str], text: str, info: machine.MachineInfo) -> str:
    """The result file: a title, the provenance line, the table."""
    title = (f"# Real models, interleaved — {args.device.upper()} — {info.date}, {info.machine}, "
             f"{machine.commit_tag(info)}")
    return title + "\n\n" + provenance(args.device, argv, info) + "\n\n" + text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--tasks", default="inference")
    parser.add_argument("--dtype", default="fp32", choices=sorted(model_suite.DTYPES))
    parser.add_argument("--size", default=None, help="size profile (default: full on CUDA, small on CPU)")
    parser.add_argument("--contenders", default="torch.compile,wrapgen[python],wrapgen[cpp]")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=5, help="calls per batch")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.add_argument("--out-dir", default=None,
                        help="also write it to this folder, named by the results scheme (e.g. benchmarks/results)")
    args = parser.parse_args(argv)
    size = args.size or models.default_size(args.device)
    chosen = [c for c in model_suite.model_contenders(args.device, args.contenders) if c.name != "eager"]
    workloads = model_suite.model_workloads(models.select(args.models), size, args.dtype,
                                            tasks=model_suite.parse_tasks(args.tasks))
    results = {}
    for workload in workloads:
        print(f"{workload.name}: building {len(chosen)} contenders", file=sys.stderr, flush=True)
        calls = _calls(workload, chosen, args.device, size)
        print(f"{workload.name}: {args.rounds} rounds of {args.calls} calls each", file=sys.stderr, flush=True)
        results[workload.name] = interleave(calls, args.device, args.rounds, args.calls)
    text = table(results)
    print(text)
    if args.out or args.out_dir:
        info = machine.collect(args.device)
        content = page(args, list(sys.argv[1:] if argv is None else argv), text, info)
        paths = [args.out] if args.out else []
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            paths.append(os.path.join(args.out_dir, machine.file_stem(info, suite_name(args, size)) + ".md"))
        for path in paths:
            with open(path, "w") as handle:
                handle.write(content)
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
