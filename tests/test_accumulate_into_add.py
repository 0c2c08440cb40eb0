"""`a + index_put(zeros, [index], values, accumulate=True)` lowered as one accumulate into `a`
(`wrapgen/lowering/graph_passes/accumulate_into_add.py`): the tied-embedding gradient of GPT-2's backward."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir.lines import ExternKernel, KernelCall


def tied_gradient(a, index, values):
    return a + torch.index_put(torch.zeros(50, 16), (index,), values, accumulate=True)


def also_returns_the_rows(a, index, values):
    rows = torch.index_put(torch.zeros(50, 16), (index,), values, accumulate=True)
    return a + rows, rows


def ones_not_zeros(a, index, values):
    return a + torch.index_put(torch.ones(50, 16), (index,), values, accumulate=True)


def _inputs():
    # 40 rows into 50, with repeats: duplicates must accumulate
    return torch.randn(50, 16), torch.randint(0, 10, (40,)), torch.randn(40, 16)


def _ops(program) -> list[str]:
    names = []
    for line in program.lines:
        if isinstance(line, ExternKernel):
            names.append(line.op)
        elif isinstance(line, KernelCall):
            names.append(line.kernel)
    return names


@pytest.mark.parametrize("kernels", [True, False])
def test_the_rows_are_accumulated_into_the_other_addend(kernels) -> None:
    with wrapgen.config.patch(kernels=kernels):
        program = wrapgen.lower(tied_gradient, _inputs())
    ops = " ".join(_ops(program))
    assert ops.count("index_put") == (2 if kernels else 1)  # C++: the copy of `a` and the accumulate
    assert "add" not in ops and "zeros" not in ops and "full" not in ops


@pytest.mark.parametrize("target", ["python", "cpp", "fx"])
@pytest.mark.parametrize("fn", [tied_gradient, also_returns_the_rows, ones_not_zeros])
def test_every_target_matches_eager(target, fn) -> None:
    compiled = wrapgen.compile(fn, _inputs(), target=target)
    for _ in range(2):
        inputs = _inputs()
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def test_rows_another_reader_needs_keep_their_own_tensor() -> None:
    for fn in (also_returns_the_rows, ones_not_zeros):
        with wrapgen.config.patch(kernels=False):
            ops = _ops(wrapgen.lower(fn, _inputs()))
        assert any("add" in op for op in ops), fn.__name__
