"""Peak device memory with CUDA graphs against without, per wrapgen target, one process.

    python -m benchmarks.graphs_memory [--models gpt2,llama] [--size b1x32] [--calls 5]

Measured as the model suite measures it (`torch.cuda.max_memory_allocated()` above the
inputs, from the compile on, cuBLAS's workspaces freed before each contender), each compile
in a fresh cache folder so the GEMM tuner runs as on a first compile. Prints the peak after
compiling, the peak over the calls, what stays held afterwards, and the ratio with graphs to
without: the number the graphs' memory cost is judged by (at most 1.1x).
"""

from __future__ import annotations

import argparse
import gc
import tempfile

import torch

import wrapgen
from benchmarks import measure, model_suite, models

MIB = 2**20


def peaks(model: torch.nn.Module, inputs: tuple, target: str, graphs: bool, calls: int) -> tuple[int, int, int]:
    """(peak after compiling, peak over `calls` calls, bytes held after them), above the inputs."""
    measure.release("cuda")
    base = measure.reset_peak_memory("cuda")
    with tempfile.TemporaryDirectory() as cache, torch.no_grad():
        with wrapgen.config.patch(cuda_graphs=graphs, cache_dir=cache):
            fn = wrapgen.compile(model, inputs, target=target)
        compiled = torch.cuda.max_memory_allocated() - base
        outputs = None
        for _ in range(calls):
            outputs = None  # the caller drops the last result before the next call, as a loop would
            outputs = fn(*inputs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        held = torch.cuda.memory_allocated() - base
        del fn, outputs
        gc.collect()
    return compiled, peak, held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.graphs_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--size", choices=models.SIZES, default="b1x32")
    parser.add_argument("--dtype", choices=tuple(model_suite.DTYPES), default="bf16")
    parser.add_argument("--targets", default="python,cpp")
    parser.add_argument("--calls", type=int, default=5, help="calls after compiling: warm-up, recording, replays")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.graphs_memory needs a CUDA device")
    print("| model | target | graphs | peak after compile | peak | held after | with / without |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name in args.models.split(","):
        model, inputs = models.FAMILIES[name].build("cuda", args.size, model_suite.DTYPES[args.dtype])
        for target in args.targets.split(","):
            without = None
            for graphs in (False, True):
                compiled, peak, held = peaks(model, inputs, target, graphs, args.calls)
                ratio = f"{peak / without:.3f}x" if graphs and without else "—"
                without = peak if not graphs else without
                print(f"| {name} | {target} | {'on' if graphs else 'off'} | {compiled / MIB:.1f} MiB | "
                      f"{peak / MIB:.1f} MiB | {held / MIB:.1f} MiB | {ratio} |", flush=True)
        del model, inputs


if __name__ == "__main__":
    main()
