"""`constant_pad_nd` and `repeat` are loop bodies (index arithmetic fused with their neighbours),
not library calls, on every target and kernel language; results equal eager's, crops and
fills of every dtype included; what a kernel cannot do stays the library's call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.wrapper_ir import ExternKernel

TARGETS = ["python", "cpp", "fx", "interpret"]


def _library_ops(fn, inputs) -> list[str]:
    with torch.no_grad():
        program = wrapgen.lower(fn, inputs)
    return [line.op for line in program.lines if isinstance(line, ExternKernel)]


class WindowPad(torch.nn.Module):
    """Swin's padding of a feature map up to a multiple of its window, between two pointwise ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(torch.relu(x), (0, 0, 1, 2, 0, 3))  # channels-last map (B, H, W, C): pad W then H
        return y * 2.0 + 1.0


class Crop(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x.sin(), (-1, 2, 3, -2), value=-0.5)


class Tile(torch.nn.Module):
    """A table tiled over heads and a new leading dimension (ALiBi's slopes, DeBERTa's positions)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.exp().repeat(2, 3, 1) + y


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model,make", [
    (WindowPad, lambda: (torch.randn(2, 5, 6, 4),)),
    (Crop, lambda: (torch.randn(3, 7, 8),)),
    (Tile, lambda: (torch.randn(4, 5), torch.randn(2, 12, 5))),
], ids=["window-pad", "crop-and-fill", "repeat"])
def test_pad_and_repeat_are_kernels_equal_to_eager(target: str, model, make, kernels) -> None:
    module, inputs = model(), make()
    assert not [op for op in _library_ops(module, inputs) if "pad" in op or "repeat" in op]
    compiled = wrapgen.compile(module, inputs, target=target)
    fresh = make()
    torch.testing.assert_close(compiled(*fresh), module(*fresh))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.bool])
def test_pad_fills_with_the_value_converted_to_the_dtype(dtype: torch.dtype) -> None:
    x = (torch.randn(3, 4) * 5).to(dtype)
    fn = lambda t: F.pad(t, (2, 1, 1, 0), value=1)  # noqa: E731
    assert not [op for op in _library_ops(fn, (x,)) if "pad" in op]
    compiled = wrapgen.compile(fn, (x,), target="python")
    torch.testing.assert_close(compiled(x), fn(x))


def test_what_a_kernel_cannot_pad_stays_the_library_call() -> None:
    empty = torch.randn(0, 4)
    fn = lambda t: F.pad(t, (1, 1, 1, 1))  # noqa: E731 - an empty dimension: nothing to clamp into
    assert any("constant_pad_nd" in op for op in _library_ops(fn, (empty,)))
    compiled = wrapgen.compile(fn, (empty,), target="python")
    torch.testing.assert_close(compiled(empty), fn(empty))
