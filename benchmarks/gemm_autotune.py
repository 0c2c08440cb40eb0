"""max_autotune side by side on one matmul-bound model, at a chosen dtype (the micro suite is fp32).

python -m benchmarks.gemm_autotune --device cuda --dtype bf16            # MLP 4096 x 1024 x 4096
python -m benchmarks.gemm_autotune --device cpu --dtype fp32 --rows 512 --dim 512 --hidden 2048

For each contender: the cold compile (fresh caches), the time per call (median), the largest
difference from eager; for wrapgen[python+max_autotune] also a second, warm compile into the
same cache with the number of GEMMs it measured (0: the winners came from the disk cache).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import wrapgen
from benchmarks import contenders as contenders_mod
from benchmarks.measure import TimingPlan, median_time, synchronize
from benchmarks.workloads import MLP
from wrapgen.kernels.templates import autotune

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = ("eager", "torch.compile", "torch.compile[max-autotune-no-cudagraphs]", "wrapgen[python]",
         "wrapgen[python+max_autotune]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    model = MLP(args.dim, args.hidden).to(args.device, dtype).eval()
    x = torch.randn(args.rows, args.dim, device=args.device, dtype=dtype)
    every = {c.name: c for c in contenders_mod.default_contenders(args.device)}
    print(f"MLP {args.rows}x{args.dim}x{args.hidden} {args.dtype} on {args.device}")
    with torch.no_grad():
        expected = model(x)
        for name in NAMES:
            contender = every[name]
            with tempfile.TemporaryDirectory() as root:
                with contender.caches(root):
                    synchronize(args.device)
                    start = time.perf_counter()
                    fn = contender.build(model, (x,))
                    out = fn(x)
                    synchronize(args.device)
                    cold = time.perf_counter() - start
                    seconds = median_time(lambda f=fn: f(x), args.device, TimingPlan())
                    warm = _warm_compile(model, x) if name == "wrapgen[python+max_autotune]" else ""
            error = (out.float() - expected.float()).abs().max().item()
            print(f"{name:45s} {seconds * 1e3:9.3f} ms/call  cold compile {cold:7.1f} s  max |diff| {error:.3g}{warm}")


def _warm_compile(model: torch.nn.Module, x: torch.Tensor) -> str:
    """A second compile into the cache the cold one filled: its time and how many GEMMs it measured."""
    before = autotune.stats["benchmarked"]
    start = time.perf_counter()
    with wrapgen.config.patch(max_autotune=True):
        wrapgen.compile(model, (x,), target="python")(x)
    return f"  warm compile {time.perf_counter() - start:.1f} s, measured {autotune.stats['benchmarked'] - before}"


if __name__ == "__main__":
    main()
