"""Launch-bound decoding latency, one process, contenders interleaved: Inductor's
reduce-overhead (CUDA graphs) against wrapgen's python and cpp targets with `cuda_graphs`.

    python -m benchmarks.graphs_latency [--models gpt2,llama] [--rounds 7] [--calls 300]

The decoders run at batch 1 × 32 tokens in bf16 (`models.py`, size b1x32), where the host's
launch cost would be the whole run time without graphs. Each round times `calls` calls of every
contender in turn, each round starting with the next contender (synchronized around each
contender's calls); the median over rounds is printed, with the
fastest and slowest round, as µs per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import wrapgen
from benchmarks import model_suite, models


def contenders(model: torch.nn.Module, inputs: tuple) -> dict:
    """Each contender's compiled callable, warmed up (recorded) already."""
    fns = {"torch.compile[reduce-overhead]": torch.compile(model, mode="reduce-overhead")}
    for target in ("python", "cpp"):
        with wrapgen.config.patch(cuda_graphs=True):
            fns[f"wrapgen[{target}+graphs]"] = wrapgen.compile(model, inputs, target=target)
    for fn in fns.values():
        for _ in range(5):  # warm-up, recording, first replays
            fn(*inputs)
    return fns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.graphs_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.graphs_latency needs a CUDA device")
    for name in args.models.split(","):
        model, inputs = models.FAMILIES[name].build("cuda", "b1x32", model_suite.DTYPES["bf16"])
        with torch.no_grad():
            fns = contenders(model, inputs)
            times: dict[str, list[float]] = {k: [] for k in fns}
            order = list(fns.items())
            for round_index in range(args.rounds):
                shift = round_index % len(order)  # each round starts with the next contender
                for key, fn in order[shift:] + order[:shift]:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        fn(*inputs)
                    torch.cuda.synchronize()
                    times[key].append((time.perf_counter() - start) / args.calls * 1e6)
        for key, samples in times.items():
            print(f"{name:6s} {key:32s} median {statistics.median(samples):7.1f} µs  "
                  f"(min {min(samples):.1f}, max {max(samples):.1f})", flush=True)
        del fns
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
