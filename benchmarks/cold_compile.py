"""Cold compile, every cache fresh, each measurement in its own process, with wrapgen's phases.

python -m benchmarks.cold_compile --models llama,resnet50 [--device cuda] [--dtype bf16] [--size full]
       [--contenders torch.compile,wrapgen[python],wrapgen[cpp]] [--rounds 3]

A model is one of the five families (`llama`) or a suite entry (`timm/densenet121`,
benchmarks.suite.catalog), built as the suite builds it.

Each (model, contender, round) runs in a new Python process whose TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR and WRAPGEN_CACHE_DIR point at one new empty directory, so no contender
finds kernels another compiled (the in-process suite shares Triton's cache between wrapgen
contenders and rounds). In that process a tiny unrelated model is compiled and run first
(imports, compile workers, CUDA context are not charged), then the model: the build plus its
first synchronized call is the cold compile. For wrapgen the time is split by phase (capture,
lowering, passes, emission, Triton, g++ per kind of unit, load, first call; threads overlap,
so phases can add up to more than the total).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

CONTENDERS = ("torch.compile", "wrapgen[python]", "wrapgen[cpp]")


def _timed_phases() -> dict[str, float]:
    """Wrap wrapgen's build steps with timers; returns the dict they add their seconds to."""
    from wrapgen import api
    from wrapgen.backends.cpp import build as cpp_build
    from wrapgen.backends.cpp import emitter as cpp_emitter
    from wrapgen.kernels.cpp import build as kernel_build
    from wrapgen.kernels.triton import runtime as triton_runtime

    times: dict[str, float] = collections.defaultdict(float)
    lock = threading.Lock()

    def wrap(owner: object, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    times[label] += time.perf_counter() - start

        setattr(owner, name, timed)

    wrap(api, "_capture", "capture")
    wrap(api, "lower_captured", "lowering")
    wrap(api, "optimize", "passes")
    wrap(cpp_emitter.CppEmitter, "emit", "emit (cpp)")
    wrap(triton_runtime, "kernel_binaries", "triton (cpp)")
    wrap(triton_runtime, "unaligned_binary", "triton (cpp: unaligned variants, first call)")
    wrap(triton_runtime.TritonKernels, "__init__", "triton (python)")
    wrap(cpp_build, "build_model", "build_model (after triton)")
    run = kernel_build._run

    def run_timed(cmd, what, source=None):
        start = time.perf_counter()
        try:
            return run(cmd, what, source)
        finally:
            with lock:
                times[f"g++: {what}"] += time.perf_counter() - start

    kernel_build._run = run_timed
    return times


def _build(contender: str) -> Callable:
    import torch

    import wrapgen

    if contender == "torch.compile":
        return lambda model, inputs: torch.compile(model)
    target = contender.removeprefix("wrapgen[").removesuffix("]")
    return lambda model, inputs: wrapgen.compile(model, inputs, target=target)


def _model(model_name: str, device: str, size: str, dtype: str) -> tuple:
    """A family (`llama`) or a suite entry (`timm/densenet121`), with its example inputs."""
    from benchmarks import model_suite, models

    if "/" not in model_name:
        return models.FAMILIES[model_name].build(device, size, model_suite.DTYPES[dtype])
    from benchmarks.suite import catalog

    (entry,) = catalog.select(None, model_name)
    model, inputs = entry.build(device, catalog.DTYPES[dtype], size)
    return model.eval(), inputs


def child(model_name: str, contender: str, device: str, dtype: str, size: str) -> dict:
    """One cold compile in this (fresh) process: returns seconds and wrapgen's phases."""
    import torch

    from benchmarks import measure

    times = _timed_phases() if contender.startswith("wrapgen") else {}
    build = _build(contender)
    with torch.no_grad():
        tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(device)
        x = torch.randn(4, 8, device=device)
        build(tiny, (x,))(x)
        measure.synchronize(device)
        torch._dynamo.reset()
        times.clear()
        model, inputs = _model(model_name, device, size, dtype)
        start = time.perf_counter()
        fn = build(model, inputs)
        built = time.perf_counter() - start
        fn(*inputs)
        measure.synchronize(device)
        total = time.perf_counter() - start
    return {"total": total, "build": built, "first call": total - built, "phases": dict(times)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,resnet50")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--size", default=None, help="default: full on cuda, small on cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("WG_COLD " + json.dumps(child(*args.child)), flush=True)
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = args.size or ("full" if device == "cuda" else "small")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for model_name in args.models.split(","):
        for contender in args.contenders.split(","):
            results = []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory(prefix="wg-cold-") as fresh:
                    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": fresh, "TRITON_CACHE_DIR": os.path.join(fresh, "triton"),
                           "WRAPGEN_CACHE_DIR": os.path.join(fresh, "wrapgen")}
                    cmd = [sys.executable, "-m", "benchmarks.cold_compile", "--child", model_name, contender, device,
                           args.dtype, size]
                    done = subprocess.run(cmd, env=env, cwd=repo, capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("WG_COLD ")]
                if done.returncode != 0 or not lines:
                    print(f"{model_name} {contender}: failed\n{done.stderr[-3000:]}")
                    break
                results.append(json.loads(lines[-1].removeprefix("WG_COLD ")))
            if not results:
                continue
            totals = [r["total"] for r in results]
            print(f"{model_name:24s} {contender:16s} cold {statistics.median(totals):6.2f} s (median of "
                  f"{len(totals)}: {', '.join(f'{t:.2f}' for t in totals)}); first call "
                  f"{statistics.median(r['first call'] for r in results):.2f} s")
            median_of = {k: statistics.median(r["phases"].get(k, 0.0) for r in results) for k in results[0]["phases"]}
            for phase, seconds in sorted(median_of.items(), key=lambda kv: -kv[1]):
                print(f"    {phase:34s} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
