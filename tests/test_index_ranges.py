"""Gathered positions a kernel's own clamp keeps in range are not checked again (no device assert,
no debug build); every other position still is."""

from __future__ import annotations

import math

import pytest
import torch

import wrapgen
from wrapgen.kernels.index_ranges import always_inside, bounds
from wrapgen.kernels.triton import compat
from wrapgen.loop_ir import Apply, Const, Load
from wrapgen.wrapper_ir.lines import KernelDefinition

I64 = torch.int64
data = Load("idx", 0, I64)


def test_bounds_follow_clamps_and_distrust_floats() -> None:
    clamped = Apply("clamp_max", (Apply("clamp_min", (data, Const(0, I64)), I64), Const(511, I64)), I64)
    assert bounds(clamped) == (0, 511)
    assert always_inside(clamped, 512) and not always_inside(clamped, 511)
    assert bounds(data) == (-math.inf, math.inf)
    shifted = Apply("add", (clamped, Const(1, I64)), I64)
    assert bounds(shifted) == (1, 512) and not always_inside(shifted, 512)
    chosen = Apply("where", (Load("m", 0, torch.bool), clamped, Const(3, I64)), I64)
    assert always_inside(chosen, 512)
    as_float = Apply("clamp_max", (Apply("clamp_min", (Load("f", 0, torch.float32), Const(0.0, torch.float32)),
                                          torch.float32), Const(511.0, torch.float32)), torch.float32)
    assert not always_inside(Apply("cast", (as_float,), I64), 512)  # a NaN passes a float clamp
    assert not always_inside(clamped, "s0")  # a size known only at run time


def _relative_gather(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    span = scores.shape[-1]
    index = torch.clamp(positions + span // 2, 0, span - 1).expand(scores.shape[0], -1, -1)
    return torch.gather(scores, -1, index).softmax(-1)


def _raw_gather(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return torch.gather(scores, -1, positions.expand(scores.shape[0], -1, -1)).softmax(-1)


@pytest.mark.skipif(not (compat.available() and compat.interpreting()), reason="needs Triton's interpreter")
def test_a_clamped_gather_is_not_checked_and_a_raw_one_is() -> None:
    scores = torch.randn(2, 8, 16)
    offsets = torch.arange(8)[:, None] - torch.arange(16)[None, :]
    with wrapgen.config.patch(cpu_kernels="triton"):
        for fn, checked in ((_relative_gather, False), (_raw_gather, True)):
            positions = offsets if fn is _relative_gather else offsets.abs()
            program = wrapgen.lower(fn, (scores, positions))
            sources = [line.source for line in program.lines if isinstance(line, KernelDefinition)]
            assert any("device_assert" in s for s in sources) == checked
            assert any("debug=True" in s for s in sources) == checked
            compiled = wrapgen.compile(fn, (scores, positions), target="python")
            fresh = torch.randn(2, 8, 16)
            torch.testing.assert_close(compiled(fresh, positions), fn(fresh, positions))
