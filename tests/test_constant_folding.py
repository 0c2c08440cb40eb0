"""Constants built from Python numbers (scalar_tensor, full, zeros, ones, arange) become program
constants where nothing can tell they are shared between runs; every target runs them,
including the C++ target, whose stable shim has no way to pass scalar_tensor's Scalar."""

from __future__ import annotations

import pytest
import torch

import wrapgen

TARGETS = ["python", "fx", "cpp"]


def where_zero(m, x):
    return torch.where(m, x, 0)


def bias_and_scale(m, x):
    ramp = torch.arange(8, dtype=x.dtype)
    ones = torch.ones(4, 1, dtype=x.dtype)
    half = torch.full((1, 8), 0.5, dtype=x.dtype)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype)) * half + ramp - ones


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [where_zero, bias_and_scale])
def test_scalar_constants_run_on_every_target(fn, target, dtype):
    x = torch.randn(4, 8, dtype=dtype)
    compiled = wrapgen.compile(fn, (x > 0, x), target=target)
    # eager rounds each bf16 intermediate (values up to 8 here), the fused kernel only its result
    tolerance = {"atol": 4 * torch.finfo(dtype).eps, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {}
    for _ in range(3):
        x = torch.randn(4, 8, dtype=dtype)
        torch.testing.assert_close(compiled(x > 0, x), fn(x > 0, x), **tolerance)


def test_library_call_constants_become_program_constants():
    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(bias_and_scale, (torch.ones(4, 8, dtype=torch.bool), torch.randn(4, 8, dtype=torch.bfloat16)))
    text = str(program)
    for op in ("arange", "ones", "full", "zeros"):
        assert f"aten::{op}" not in text.split("lines:")[1], text
    assert len([c for c in program.constants if "folded" in c.origin]) == 4


def test_a_returned_constant_stays_an_op():
    """Returned, the caller could write it, and the next run would return the write."""

    def returned(x):
        return x + 1, torch.zeros(3)

    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(returned, (torch.randn(3),))
    assert not [c for c in program.constants if "folded" in c.origin], str(program)
    for target in TARGETS:
        compiled = wrapgen.compile(returned, (torch.randn(3),), target=target)
        compiled(torch.ones(3))[1].add_(5)  # the caller writes what it got back
        torch.testing.assert_close(compiled(torch.ones(3)), returned(torch.ones(3)))


def test_a_constant_written_in_place_is_fresh_every_run():
    """torch.export functionalizes `z = zeros(3); z.add_(x)` into `add(zeros, x)`: the folded
    constant is only read, and no run sees another's write."""

    def written(x):
        z = torch.zeros(3)
        z.add_(x)
        return z * 2

    for target in TARGETS:
        compiled = wrapgen.compile(written, (torch.randn(3),), target=target)
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(compiled(x), written(x))


def test_large_constants_are_not_folded():
    def big(x):
        return x + torch.full((64, 64), 2.0, dtype=torch.bfloat16)

    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(big, (torch.randn(64, 64, dtype=torch.bfloat16),))
    assert not program.constants, str(program)
