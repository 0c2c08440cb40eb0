"""Run-time choice between kernels (a MultiKernelCall line): time each candidate once per key,
keep the fastest. Used by the Python and FX targets; the C++ target does the same in C++.

Timing runs the candidates on the program's real buffers. A candidate may write buffers it
also reads (a user kernel that accumulates into its output), so the buffers the choice
writes are saved first and restored after each candidate; the caller then launches the
winner once on the restored data. A candidate that fails to launch (a config that needs more
shared memory than the device has) loses, as in Triton's autotuner; if all fail, the first
error is raised.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from wrapgen.kernels.timing import seconds_per_call

# How many times each choice has benchmarked its candidates (tests check "once per key").
BENCHMARKS: Counter[str] = Counter()

# Timing budget per candidate: enough repetitions to fill this many seconds, within bounds.
_TARGET_SECONDS = 0.003
_MIN_REPS, _MAX_REPS = 3, 100


def bucket(value: int) -> int:
    """The power-of-two size bucket of a key value (wrapper_ir.multi_kernel.bucket, for generated code)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


class KernelChoice:
    """The choices of one `choice` name in one program: key -> index of the chosen candidate."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.chosen: dict[tuple, int] = {}
        self.timings: dict[tuple, list[float]] = {}

    def choose(self, key: tuple, launches: Sequence[Callable[[], object]], writes: Sequence[torch.Tensor],
               serves: Sequence[int | None] = ()) -> int:
        """Time each launch that may run for `key` (`serves`: see MultiKernelCall), restore
        `writes`, remember and return the fastest one's index."""
        saved = [w.clone() for w in writes]
        timings: list[float] = []
        first_error: BaseException | None = None
        for index, launch in enumerate(launches):
            if serves and serves[index] is not None and serves[index] != key[0]:
                timings.append(math.inf)
                continue
            try:
                timings.append(_time(launch, writes))
            except Exception as error:  # noqa: BLE001 - a candidate that cannot run loses
                first_error = first_error or error
                timings.append(math.inf)
            for target, copy in zip(writes, saved):
                target.copy_(copy)
        if all(math.isinf(t) for t in timings):
            if first_error is not None:
                raise first_error
            raise RuntimeError(f"choice {self.name}: no candidate serves key {key}")
        best = min(range(len(timings)), key=timings.__getitem__)
        self.chosen[key] = best
        self.timings[key] = timings
        BENCHMARKS[self.name] += 1
        return best


def _time(launch: Callable[[], object], writes: Sequence[torch.Tensor]) -> float:
    """Seconds per launch: device time on CUDA; on the host a launch is long enough to time alone."""
    cuda = any(w.is_cuda for w in writes) or torch.cuda.is_available() and not writes
    return seconds_per_call(launch, cuda, _TARGET_SECONDS, min_calls=_MIN_REPS if cuda else 1, max_calls=_MAX_REPS)
