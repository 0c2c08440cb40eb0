"""When a generated C++ kernel runs its rows in parallel: its elements, each costly function
(erf, exp, ...) weighted, against PARALLEL_THRESHOLD; results match eager either way."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.kernels.cpp.codegen import PARALLEL_THRESHOLD
from wrapgen.kernels.cpp.parallel_work import COSTLY_WEIGHT
from wrapgen.wrapper_ir.lines import KernelDefinition


def gelu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    cdf = 0.5 * (1 + torch.erf(x * 0.7071067811865476))
    return grad * (cdf + x * torch.exp(-0.5 * x * x) * 0.3989422804014327)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def parallel_kernels(fn, args) -> list[bool]:
    program = wrapgen.lower(fn, args)
    return ["omp parallel" in k.source for k in program.lines if isinstance(k, KernelDefinition)]


@pytest.mark.parametrize(("fn", "elements", "parallel"), [
    (gelu_backward, PARALLEL_THRESHOLD // 2, True),  # two costly functions: work 9x its elements
    (gelu_backward, PARALLEL_THRESHOLD // 16, False),
    (add, PARALLEL_THRESHOLD // 2, False),
    (add, PARALLEL_THRESHOLD, True),
])
def test_costly_functions_weigh_in_the_parallel_decision(fn, elements: int, parallel: bool) -> None:
    assert COSTLY_WEIGHT > 1
    args = (torch.randn(2, elements // 2), torch.randn(2, elements // 2))
    assert parallel_kernels(fn, args) == [parallel]
    compiled = wrapgen.compile(fn, args, target="python")
    fresh = tuple(torch.randn_like(a) for a in args)
    torch.testing.assert_close(compiled(*fresh), fn(*fresh))


def test_a_softmax_over_short_rows_runs_them_in_parallel() -> None:
    """64 rows of 128: 8192 elements, an exp each."""
    x = torch.randn(64, 128)
    assert any(parallel_kernels(lambda t: torch.softmax(t, -1), (x,)))


def test_with_symbolic_sizes_the_threshold_is_divided_by_the_weight() -> None:
    """The element count stays the kernel's size argument (shared by kernels of one iteration
    space); the GELU backward compares it with the threshold over its weight, at every size."""
    args = (torch.randn(4, 64), torch.randn(4, 64))
    program = wrapgen.lower(gelu_backward, args, dynamic=True)
    compiled = wrapgen.compile(gelu_backward, args, target="python", dynamic=True)
    (source,) = [k.source for k in program.lines if isinstance(k, KernelDefinition)]
    weight = 1 + 2 * COSTLY_WEIGHT
    assert f">= {-(-PARALLEL_THRESHOLD // weight)})" in source, source
    for rows in (3, 2 * PARALLEL_THRESHOLD // 64):  # serial, then parallel
        fresh = (torch.randn(rows, 64), torch.randn(rows, 64))
        torch.testing.assert_close(compiled(*fresh), gelu_backward(*fresh))
