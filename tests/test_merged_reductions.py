"""Adjacent reduced dimensions that run through memory as one are one loop in C++ kernels
(kernels/cpp/merged_reductions.py): spatial means, sums over leading dimensions (column
reductions), two-dimensional layer norms, flattened argmax; dimensions whose strides do not
chain (a strided view) stay a nest. Results equal eager's."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.kernels.cpp.merged_reductions import merge_reduced
from wrapgen.loop_ir import FusionGroup
from wrapgen.wrapper_ir import KernelDefinition


def _sources(compiled) -> list[str]:
    return [line.source for line in compiled.program.lines if isinstance(line, KernelDefinition)]


def _reduced_loops(source: str) -> int:
    return source.count("for (int64_t r1 ")


CASES = {
    "spatial mean": (lambda x: x.mean((2, 3)) * 2.0, (2, 24, 7, 7), True),
    "column sum": (lambda x: x.sum((0, 1)), (4, 5, 16), True),
    "2-d layer norm": (lambda x: torch.nn.functional.layer_norm(x, (8, 20)), (6, 8, 20), True),
    "flattened argmax": (lambda x: x.flatten(1).argmax(1), (3, 5, 7), True),
    "three dims": (lambda x: x.sum((1, 2, 3)), (3, 4, 5, 6), True),
    "strided view": (lambda x: x[:, :, :, ::2].sum((2, 3)), (2, 6, 5, 7), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_merged_reductions_equal_eager(name: str) -> None:
    fn, shape, merged = CASES[name]
    compiled = wrapgen.compile(fn, (torch.randn(shape),), target="cpp")
    sources = _sources(compiled)
    nested = any(_reduced_loops(s) for s in sources)
    assert nested != merged, sources
    for _ in range(2):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))


def test_a_group_without_reductions_is_unchanged() -> None:
    group = FusionGroup(rows=(4,))
    assert merge_reduced(group) is group


def test_dynamic_extents_stay_nested_and_correct() -> None:
    fn = lambda x: x.sum((1, 2))  # noqa: E731
    compiled = wrapgen.compile(fn, (torch.randn(3, 4, 9),), target="cpp", dynamic=True)
    for shape in ((3, 4, 9), (2, 6, 5)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))
