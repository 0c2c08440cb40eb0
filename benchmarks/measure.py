"""Measurements: device-synchronized run time, peak device memory, copy bandwidth, and the
check of a contender's output against eager."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class TimingPlan:
    """How a run time is measured: `warmup` calls, then `repeats` samples, each the mean of as
    many back-to-back calls as fill `min_sample_s` (at least one, at most `max_calls`)."""

    repeats: int = 10
    warmup: int = 3
    min_sample_s: float = 0.02
    max_calls: int = 1000


def median_time(fn: Callable[[], Any], device: str, plan: TimingPlan) -> float:
    """Median seconds per call of `fn()` (synchronized before and after each sample)."""
    for _ in range(plan.warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    one = max(time.perf_counter() - start, 1e-7)
    calls = max(1, min(plan.max_calls, math.ceil(plan.min_sample_s / one)))
    samples = []
    for _ in range(plan.repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def timed_call(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """Run `fn()` once; its result and its synchronized wall time."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def reset_peak_memory(device: str) -> int | None:
    """Start a peak-memory measurement; the bytes allocated now (inputs, weights: the baseline a
    peak above the inputs is taken from), or None on CPU (not measured)."""
    if device != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_memory(device: str) -> int | None:
    """Peak bytes allocated on the device since `reset_peak_memory` (None on CPU: not measured)."""
    if device != "cuda":
        return None
    synchronize(device)
    return torch.cuda.max_memory_allocated()


def release(device: str) -> None:
    """Give freed device memory back between contenders (on CPU, Python frees it already)."""
    if device == "cuda":
        gc.collect()
        # cuBLAS keeps a workspace per handle in the caching allocator (32 MiB and more on Hopper);
        # freed here, every contender starts from the same baseline and pays for its own.
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()


def requested_memory(device: str) -> tuple[int, int] | None:
    """(current, peak) bytes requested from the caching allocator: what was allocated, without the
    allocator's rounding and the remainders of free blocks it hands out unsplit (a 4 MiB request can
    take a free 4.5 MiB block whole). Those depend on which blocks earlier allocations left free, not
    on the program, so two programs holding the same tensors can differ in `max_memory_allocated`.
    None on CPU (not measured)."""
    if device != "cuda":
        return None
    stats = torch.cuda.memory_stats()
    return stats.get("requested_bytes.all.current", 0), stats.get("requested_bytes.all.peak", 0)


def copy_bandwidth(device: str, nbytes: int, plan: TimingPlan) -> float:
    """Bytes per second of `dst.copy_(src)` over an `nbytes` buffer (counting read + write)."""
    numel = nbytes // 4
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device, plan)
    return 2 * numel * 4 / seconds


def tensor_bytes(*trees: Any) -> int:
    """Bytes of every tensor in the given (nested) structures, each storage counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tree in trees:
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                key = (leaf.untyped_storage().data_ptr(), leaf.untyped_storage().nbytes())
                if key not in seen:
                    seen.add(key)
                    total += leaf.numel() * leaf.element_size()
    return total


def _scale(t: torch.Tensor) -> float:
    """The largest finite magnitude of a tensor (1 for an empty or all-zero one)."""
    if t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return 1.0
    finite = t.detach().abs().float()
    finite = finite[torch.isfinite(finite)]
    return float(finite.max()) if finite.numel() and float(finite.max()) > 0 else 1.0


def check_close(actual: Any, expected: Any, rtol: float, atol: float, scaled: bool = False) -> str | None:
    """None when `actual` matches eager's `expected` (a host copy), else the reason (first lines).

    `scaled`: `atol` is relative to each expected tensor's largest magnitude. A real model's
    outputs and gradients span orders of magnitude from one tensor to the next, and a reduction
    order's rounding error is proportional to the tensor's scale, not to each element."""
    try:
        actual = host_copy(actual)
        if pytree.tree_structure(actual) != pytree.tree_structure(expected):
            return f"output structure differs: {pytree.tree_structure(actual)} vs {pytree.tree_structure(expected)}"
        if not scaled:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
            return None
        for index, (a, e) in enumerate(zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))):
            if isinstance(e, torch.Tensor):
                atol_here = atol * _scale(e)
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol_here,
                                           msg=lambda m, i=index, t=atol_here: f"output {i} (atol {t:.3g}): {m}")
            else:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
    except AssertionError as error:
        return " ".join(str(error).split("\n")[:3])
    return None


# (multiplier, tolerance) of PyTorch's benchmark runner's `same(..., fp64_ref)`, by the dtype compared
FLOAT64_CRITERION = {torch.float32: (2.0, 1e-3), torch.bfloat16: (3.0, 1e-2), torch.float16: (3.0, 1e-2)}


def rmse(actual: torch.Tensor, exact: torch.Tensor) -> float:
    """Root-mean-square distance, computed in float64."""
    return float((actual.double() - exact.double()).pow(2).mean().sqrt()) if exact.numel() else 0.0


def float64_check(actual: Any, eager: Any, exact: Any) -> str | None:
    """None when every floating output of `actual` is about as close to the float64 result
    `exact` as eager's (`eager`) is, else the first that is not: root-mean-square error at most
    the multiplier times eager's plus a tenth of the tolerance (PyTorch's benchmark runner's
    criterion). It decides where the direct comparison cannot: a gradient that is zero in exact
    arithmetic holds only rounding noise, different for every kernel order, which no tolerance
    scaled by the tensor's own magnitude admits."""
    actual, leaves = host_copy(actual), pytree.tree_leaves(eager)
    if pytree.tree_structure(actual) != pytree.tree_structure(eager):
        return "output structure differs"
    for index, (a, e, x) in enumerate(zip(pytree.tree_leaves(actual), leaves, pytree.tree_leaves(exact))):
        if not isinstance(e, torch.Tensor) or not e.is_floating_point():
            if isinstance(e, torch.Tensor) and not torch.equal(a, e):
                return f"output {index} differs"
            continue
        multiplier, tolerance = FLOAT64_CRITERION.get(e.dtype, FLOAT64_CRITERION[torch.float32])
        mine, eagers = rmse(a, x), rmse(e, x)
        if mine > multiplier * eagers + tolerance / 10:
            return f"output {index}: RMS error {mine:.2e} against float64's, eager's {eagers:.2e}"
    return None


def relative_error(actual: Any, expected: Any) -> float | None:
    """The largest |actual - expected| over the largest |expected|, the worst over the output
    tensors: how far from eager an output is, on the scale of that output (None: not comparable)."""
    actual = host_copy(actual)
    if pytree.tree_structure(actual) != pytree.tree_structure(expected):
        return None
    worst = 0.0
    leaves = zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))
    for a, e in leaves:
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor) or not e.is_floating_point():
            continue
        if a.shape != e.shape:
            return None
        if e.numel():
            try:
                difference = (a.float() - e.float()).abs().nan_to_num(float("inf"))
            except (RuntimeError, TypeError):  # not comparable (e.g. a device or layout it cannot copy)
                return None
            worst = max(worst, float(difference.max()) / _scale(e))
    return worst


def host_copy(tree: Any) -> Any:
    """A copy of the outputs in host memory: later calls cannot overwrite it (CUDA graphs reuse
    their output buffers) and it takes no device memory."""
    return pytree.tree_map(lambda t: t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t, tree)
