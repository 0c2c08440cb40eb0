"""Multi-kernel acceptance measurement (wrapgen issue 20): softmax and layer norm compiled once
with dynamic=True and config.multi_kernel, run at row lengths 64, 1024, 16384 and 131072,
against the two single-variant programs at each length:

    looped      the same program with every choice replaced by its looped kernel
                (what wrapgen generates for a dynamic row without multi_kernel)
    persistent  the same program with every choice replaced by the persistent kernel of the
                length's bucket (the looped one where no persistent variant exists: > 16384)

The multi-kernel program should be within 3% of the better of the two at each length.

    python -m benchmarks.multi_kernel [--target python|fx|cpp] [--lengths 64,1024,16384,131072]
                                      [--elements 16777216] [--rounds 5] [--out-dir DIR]

Writes `multi-kernel-<target>-cuda-<date>-<machine>-<commit>.{json,md}` under benchmarks/results/
(or DIR; the scheme of benchmarks/results/README.md) and prints the table. Needs a CUDA device (Triton).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import wrapgen
from benchmarks import machine
from wrapgen.wrapper_ir import KernelCall, MultiKernelCall, Program
from wrapgen.wrapper_ir.multi_kernel import bucket

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TOLERANCE = 0.03


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)


WORKLOADS: dict[str, tuple[Callable, Callable[[int, int], tuple]]] = {
    "softmax": (softmax, lambda rows, n: (torch.randn(rows, n, device="cuda"),)),
    "layer_norm": (layer_norm, lambda rows, n: (torch.randn(rows, n, device="cuda"), torch.randn(n, device="cuda"),
                                                torch.randn(n, device="cuda"))),
}


def single_variant(program: Program, length: int | None) -> Program:
    """`program` with each choice replaced by one candidate: the persistent kernel serving
    `length`'s bucket (None: always the looped kernel)."""
    lines = []
    for line in program.lines:
        if isinstance(line, MultiKernelCall):
            index = 0
            if length is not None and line.serves and bucket(length) in line.serves:
                index = line.serves.index(bucket(length))
            chosen = line.candidates[index]
            lines.append(KernelCall(chosen.kernel, chosen.args, chosen.grid, chosen.writes))
        else:
            lines.append(line)
    return dataclasses.replace(program, lines=tuple(lines))


def time_ms(fn: Callable[[], object], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def measure(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median milliseconds per call of each contender; contenders take turns each round."""
    for call in calls.values():  # warm up (and let the multi-kernel program choose)
        call()
        call()
    torch.cuda.synchronize()
    estimate = max(time_ms(next(iter(calls.values())), 3), 1e-3)
    reps = int(min(max(50.0 / estimate, 5), 2000))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(time_ms(call, reps))
    return {name: statistics.median(values) for name, values in samples.items()}


def _caller(built, args: tuple) -> Callable[[], object]:
    return lambda: built.call(list(args))


def run(target: str, lengths: Sequence[int], elements: int, rounds: int) -> list[dict]:
    rows_out = []
    for workload, (fn, make_args) in WORKLOADS.items():
        with wrapgen.config.patch(multi_kernel=True, kernels=True):
            program = wrapgen.lower(fn, make_args(64, 1024), dynamic=True)
        multi = wrapgen.build(program, target)
        looped = wrapgen.build(single_variant(program, None), target)
        for n in lengths:
            rows = max(1, elements // n)
            args = make_args(rows, n)
            persistent = wrapgen.build(single_variant(program, n), target)
            expected = fn(*args)
            for built in (multi, looped, persistent):
                out = built.call(list(args))
                torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, expected, atol=1e-4, rtol=1e-4)
            contenders = {"multi_kernel": multi, "looped": looped, "persistent": persistent}
            times = measure({name: _caller(built, args) for name, built in contenders.items()}, rounds)
            best = min(times["looped"], times["persistent"])
            ratio = times["multi_kernel"] / best
            rows_out.append({"workload": workload, "length": n, "rows": rows, **{f"{k}_ms": v for k, v in times.items()},
                             "ratio_to_best": ratio, "within_3pct": ratio <= 1 + TOLERANCE})
            print(f"{workload:10s} n={n:7d} rows={rows:7d}  multi {times['multi_kernel']:.4f} ms  looped "
                  f"{times['looped']:.4f} ms  persistent {times['persistent']:.4f} ms  ratio {ratio:.3f}", flush=True)
    return rows_out


def markdown(results: list[dict], header: dict) -> str:
    lines = [f"# Multi-kernel reductions ({header['device']}, target {header['target']})", "",
             f"torch {header['torch']}, triton {header['triton']}, {header['date']}, commit {header.get('commit')}; "
             f"{header['elements']} elements per "
             f"input, median of {header['rounds']} rounds. Ratio: multi-kernel / better single variant (pass: <= 1.03).",
             "", "| workload | row length | rows | multi-kernel ms | looped ms | persistent ms | ratio | within 3% |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['workload']} | {r['length']} | {r['rows']} | {r['multi_kernel_ms']:.4f} | {r['looped_ms']:.4f} | "
                     f"{r['persistent_ms']:.4f} | {r['ratio_to_best']:.3f} | {'yes' if r['within_3pct'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multi_kernel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="python", choices=("python", "fx", "cpp"))
    parser.add_argument("--lengths", default="64,1024,16384,131072")
    parser.add_argument("--elements", type=int, default=2**24, help="elements per input (rows = elements // length)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    options = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    import triton

    lengths = [int(v) for v in options.lengths.split(",") if v]
    results = run(options.target, lengths, options.elements, options.rounds)
    info = machine.collect("cuda")
    header = {"device": torch.cuda.get_device_name(), "target": options.target, "torch": torch.__version__,
              "triton": triton.__version__, "date": info.date, "commit": info.wrapgen_commit,
              "elements": options.elements, "rounds": options.rounds}
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / machine.file_stem(info, f"multi-kernel-{options.target}")
    Path(f"{stem}.json").write_text(json.dumps({"header": header, "results": results}, indent=2) + "\n")
    Path(f"{stem}.md").write_text(markdown(results, header))
    print(markdown(results, header))
    print(f"wrote {stem}.json and {stem}.md")
    return 0 if all(r["within_3pct"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
