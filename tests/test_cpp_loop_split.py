"""Index-set splitting of C++ kernels' innermost loops (wrapgen/kernels/cpp/loop_split.py): a body
that selects by the loop index (a concatenation along the innermost dimension) runs as one loop
per range between the thresholds, each folding to contiguous loads; results equal eager's."""

from __future__ import annotations

import re

import pytest
import sympy
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.kernels.cpp.loop_split import MAX_RANGES, split_ranges
from wrapgen.loop_ir import Apply, Const, IndexValue, Load
from wrapgen.wrapper_ir.lines import KernelDefinition

TARGETS = ("python", "cpp")
x0 = sympy.Symbol("x0", integer=True)


def _sources(fn, args) -> str:
    program = wrapgen.lower(fn, args)
    return "\n".join(line.source for line in program.lines if isinstance(line, KernelDefinition))


def _loops(source: str, var: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(rf"for \(int64_t {var} = (\d+); {var} < (\d+);", source)]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotate-half: a concatenation along the last dimension, as a pointwise kernel."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1) * 2.0


def patch_merging(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Swin's patch merging: four strided slices concatenated, then a layer norm over them."""
    merged = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    return F.layer_norm(merged, (merged.shape[-1],), weight)


def argmax_of_cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat((a, b), -1).argmax(-1)


def many_pieces(*xs: torch.Tensor) -> torch.Tensor:
    return torch.cat(xs, -1) + 1.0


def test_split_ranges_from_comparisons_and_clamps():
    index = IndexValue(x0, torch.int64)
    select = Apply("where", (Apply("lt", (index, IndexValue(sympy.Integer(32), torch.int64)), torch.bool),
                             Load("a", sympy.Min(31, x0), torch.float32),
                             Load("b", sympy.Max(0, x0 - 32), torch.float32)), torch.float32)
    assert split_ranges([select], x0, 64) == [(0, 32), (32, 64)]
    flipped = Apply("gt", (Const(47, torch.int64), index), torch.bool)  # 47 > x0: x0 < 47
    assert split_ranges([flipped], x0, 64) == [(0, 47), (47, 64)]
    assert split_ranges([Load("a", sympy.Min(31, x0), torch.float32)], x0, 64) is None  # clamps alone
    assert split_ranges([select], x0, sympy.Symbol("s0", integer=True)) is None  # a size known at run time only
    assert split_ranges([select], x0, 32) is None  # the threshold is the end


@pytest.mark.parametrize("target", TARGETS)
def test_rotate_half_runs_in_two_loops(target):
    x = torch.randn(2, 3, 5, 16)
    assert _loops(_sources(rotate_half, (x,)), "x3") == [(0, 8), (8, 16)]
    compiled = wrapgen.compile(rotate_half, (x,), target=target)
    fresh = torch.randn_like(x)
    torch.testing.assert_close(compiled(fresh), rotate_half(fresh))


@pytest.mark.parametrize("target", TARGETS)
def test_patch_merging_layer_norm_splits_each_pass(target):
    x, weight = torch.randn(2, 8, 8, 16), torch.randn(64)
    loops = _loops(_sources(patch_merging, (x, weight)), "r0")
    assert loops.count((16, 32)) >= 2 and (0, 64) not in loops, loops  # the statistics' passes, in pieces
    compiled = wrapgen.compile(patch_merging, (x, weight), target=target)
    fresh = torch.randn_like(x)
    torch.testing.assert_close(compiled(fresh, weight), patch_merging(fresh, weight))


@pytest.mark.parametrize("target", TARGETS)
def test_an_argmax_over_the_pieces_keeps_the_first_index(target):
    a = torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 0.0]])
    b = torch.tensor([[5.0, 3.0], [0.0, float("nan")]])
    compiled = wrapgen.compile(argmax_of_cat, (a, b), target=target)
    torch.testing.assert_close(compiled(a, b), argmax_of_cat(a, b))


@pytest.mark.parametrize("target", TARGETS)
def test_more_pieces_than_the_limit_stay_one_loop(target):
    xs = tuple(torch.randn(3, 2) for _ in range(MAX_RANGES + 1))
    assert _loops(_sources(many_pieces, xs), "x1") == [(0, 2 * len(xs))]
    compiled = wrapgen.compile(many_pieces, xs, target=target)
    torch.testing.assert_close(compiled(*xs), many_pieces(*xs))
