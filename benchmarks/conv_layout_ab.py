"""A/B of channels-last convolutions (wrapgen/lowering/graph_passes/conv_layout.py) on one model: wrapgen with
the rewrite off, on for every convolution, and as shipped (on the CPU: each convolution where it measured
faster, conv_choice.py), and eager NCHW vs channels-last, interleaved rounds, median per call.

    python -m benchmarks.conv_layout_ab [--device cpu|cuda] [--target cpp] [--dtype fp32|bf16]
                                        [--size small|full] [--rounds 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

import wrapgen
import wrapgen.lowering.graph_passes.conv_layout as conv_layout
from benchmarks import models

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _per_call_ms(fn: Callable[[], object], device: str, clock: Callable[[], float], calls: int = 5) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = clock()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) / calls * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--target", default="cpp")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--size", default=None, choices=("small", "full"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by process CPU time (CPU, steadier than wall time on a shared machine)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time and args.device == "cpu" else time.perf_counter
    size = args.size or models.default_size(args.device)
    torch.manual_seed(0)
    model, (x,) = models.FAMILIES["resnet50"].build(args.device, size, DTYPES[args.dtype])
    model.eval()
    channels_last_model = copy.deepcopy(model).to(memory_format=torch.channels_last)
    with wrapgen.config.patch(layout_optimization=False):
        off = wrapgen.compile(model, (x,), target=args.target)
    shipped = wrapgen.compile(model, (x,), target=args.target)
    devices = conv_layout.DEVICES
    conv_layout.DEVICES = frozenset({*devices, args.device})  # on for every convolution, on this device too
    try:
        with wrapgen.config.patch(layout_optimization=True):
            on = wrapgen.compile(model, (x,), target=args.target)
    finally:
        conv_layout.DEVICES = devices
    contenders: dict[str, Callable[[], object]] = {
        "eager NCHW": lambda: model(x),
        "eager channels-last": lambda: channels_last_model(x.contiguous(memory_format=torch.channels_last)),
        "wrapgen, rewrite off": lambda: off(x),
        "wrapgen, rewrite on": lambda: on(x),
        "wrapgen, as shipped": lambda: shipped(x),
    }
    tol = {"rtol": 5e-2, "atol": 5e-2} if args.dtype == "bf16" else {"rtol": 1e-3, "atol": 1e-3}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.inference_mode():
        expected = model(x)
        torch.testing.assert_close(off(x), expected, **tol)
        torch.testing.assert_close(on(x), expected, **tol)
        torch.testing.assert_close(shipped(x), expected, **tol)
        for fn in contenders.values():
            fn()
            fn()
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                times[name].append(_per_call_ms(fn, args.device, clock))
    print(f"resnet50 {size} {args.dtype} on {args.device}, target {args.target}, {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads, {'CPU' if clock is time.process_time else 'wall'} time")
    for name, samples in times.items():
        print(f"  {name:22s} median {statistics.median(samples):8.3f} ms   min {min(samples):8.3f} ms")
    on_off = statistics.median(times["wrapgen, rewrite on"]) / statistics.median(times["wrapgen, rewrite off"])
    cl_nchw = statistics.median(times["eager channels-last"]) / statistics.median(times["eager NCHW"])
    shipped_off = statistics.median(times["wrapgen, as shipped"]) / statistics.median(times["wrapgen, rewrite off"])
    print(f"  wrapgen shipped/off {shipped_off:.3f}   on/off {on_off:.3f}   eager channels-last/NCHW {cl_nchw:.3f}   (< 1: channels-last wins)")


if __name__ == "__main__":
    main()
