"""Which CPU convolutions run faster channels-last: measured, one convolution at a time.

On CUDA channels-last pays for every ordinary 2-d convolution (cuDNN transposes NCHW operands
itself), so the layout pass rewrites them all. On the CPU it depends on the shape: mkldnn's NHWC
kernels are 1.5-5x faster for the early, wide-image layers of a ResNet (a 64->256 1x1 over
16x16 pixels: 2.6 ms NCHW, 0.47 ms NHWC on a 2-core Xeon), and slower for the late ones, where
the image is a few pixels and the weight is large (512x512x3x3 over 4x4: 3.6 ms against 5.5,
plus 1.7 ms to copy the weight into NHWC on every call, as it must be without freezing). No
rule of thumb on sizes holds across CPUs, so the pass asks the machine: each distinct
convolution of the graph runs both ways on random data of its shapes, the NHWC side paying its
weight copy, and goes channels-last unless NCHW measured faster by more than `MARGIN` (25%).
Near-ties go to NHWC because what runs between the convolutions does better there: a max-pool
window or a batch norm vectorizes along the contiguous channel. A ResNet stem's fused
norm-ReLU-pool took 49 us NHWC against 335 us NCHW, beside a convolution that measured 0-15%
slower NHWC from one process to the next.

Timings are cached per shape and thread count for the process; a compile measures each distinct
convolution once, for about twenty times its run time. A choice within the machine's noise of
the margin can still differ between processes (it is not kept on disk yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.fx

MARGIN = 1.25  # NHWC goes unless it takes more than this multiple of NCHW's time
_SAMPLE_S = 0.002  # a timing runs the convolution until this long, at least twice
ROUNDS = 5  # samples per layout, the fastest counts
_cache: dict[tuple, bool] = {}


def faster_channels_last(node: torch.fx.Node) -> bool:
    """Whether the 2-d convolution `node` (traced values in its meta) measured faster with
    channels-last operands, its weight copied each call, than as traced."""
    x, w = (a.meta["val"] for a in node.args[:2])  # type: ignore[union-attr]
    bias = node.args[2]
    bias_shape = tuple(bias.meta["val"].shape) if isinstance(bias, torch.fx.Node) else None
    rest = tuple(node.args[3:])
    key = (tuple(x.shape), tuple(x.stride()), tuple(w.shape), tuple(w.stride()), x.dtype, bias_shape, rest,
           torch.get_num_threads())
    if key not in _cache:
        _cache[key] = _measure(x, w, bias_shape, rest)
    return _cache[key]


def _measure(x: torch.Tensor, w: torch.Tensor, bias_shape: tuple | None, rest: tuple) -> bool:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # a backend may be called inside its tracer's fake mode
        return _measure_real(x, w, bias_shape, rest)


def _measure_real(x: torch.Tensor, w: torch.Tensor, bias_shape: tuple | None, rest: tuple) -> bool:
    def real(value: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).normal_()

    image, weight = real(x), real(w)
    bias = torch.randn(bias_shape, dtype=x.dtype) if bias_shape is not None else None
    image_nhwc = image.contiguous(memory_format=torch.channels_last)
    weight_nhwc = weight.contiguous(memory_format=torch.channels_last)
    copies_weight = weight.stride() != weight_nhwc.stride() and not weight.is_contiguous(
        memory_format=torch.channels_last)  # a 1x1 weight is NHWC as it is: a free view

    def traced() -> object:
        return torch.ops.aten.convolution.default(image, weight, bias, *rest)

    def channels_last() -> object:
        operand = weight.contiguous(memory_format=torch.channels_last) if copies_weight else weight_nhwc
        return torch.ops.aten.convolution.default(image_nhwc, operand, bias, *rest)

    with torch.no_grad():
        nhwc, nchw = _best_of((channels_last, traced))
        return nhwc <= MARGIN * nchw


def _best_of(fns: tuple[Callable[[], object], ...], rounds: int = ROUNDS) -> list[float]:
    """Each of `fns`'s fastest time per call over `rounds` samples, the samples taken in turn
    (A, B, A, B, ...) so that a slow stretch of a shared machine falls on both."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for position, fn in enumerate(fns):
            calls, start = 0, time.perf_counter()
            while True:
                fn()
                calls += 1
                elapsed = time.perf_counter() - start
                if calls >= 2 and elapsed >= _SAMPLE_S:
                    break
            best[position] = min(best[position], elapsed / calls)
    return best
