"""Timing a kernel at compile or first-call time: the one timer behind run-time kernel choice
(`choice.py`) and GEMM autotuning (`templates/autotune.py`).

One warm-up call, one timed call for an estimate, then `rounds` batches of back-to-back calls
sized to fill about `batch_seconds` each; the median batch's time per call. On CUDA, events
bracket each batch, so launch overhead hides behind the queue and only device time counts;
on the host (C++ kernels, Triton's interpreter) the wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def seconds_per_call(run: Callable[[], object], cuda: bool, batch_seconds: float, rounds: int = 3,
                     min_calls: int = 1, max_calls: int = 100) -> float:
    """Median seconds per call of `run` (see the module docstring); exceptions propagate."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    estimate = max(time.perf_counter() - start, 1e-7)
    calls = int(min(max(batch_seconds / estimate, min_calls), max_calls))
    batches = []
    if cuda:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(rounds):
            begin.record()
            for _ in range(calls):
                run()
            end.record()
            end.synchronize()
            batches.append(begin.elapsed_time(end) / 1e3 / calls)
    else:
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                run()
            batches.append((time.perf_counter() - start) / calls)
    return sorted(batches)[len(batches) // 2]


__all__ = ["seconds_per_call"]
