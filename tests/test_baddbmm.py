"""`baddbmm` keeps its batched product in the inputs' dtype (torch's decomposition upcasts a
half-precision call to a float32 GEMM), through both entry points, with eager's results."""

from __future__ import annotations

import pytest
import torch

import wrapgen
import wrapgen.dynamo
from wrapgen.lowering.decompositions import baddbmm_in_input_dtype
from wrapgen.wrapper_ir import ExternKernel

TARGETS = ("python", "cpp", "fx", "interpret")


def scores(bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """ALiBi-style scores (BLOOM): a per-head bias broadcast over rows, then a softmax in float32."""
    return torch.softmax(bias.baddbmm(q, k, beta=1.0, alpha=0.125), dim=-1, dtype=torch.float32)


def inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(6, 1, 16, dtype=dtype), torch.randn(6, 16, 8, dtype=dtype), torch.randn(6, 8, 16, dtype=dtype)]


def tolerance(dtype: torch.dtype) -> dict:
    return {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def test_the_half_precision_product_is_not_upcast():
    program = wrapgen.lower(scores, inputs(torch.bfloat16))
    products = [line for line in program.lines if isinstance(line, ExternKernel) and "bmm" in line.op]
    assert [line.op for line in products] == ["aten::bmm.out"]
    (written,) = products[0].writes
    assert f"{written} = allocate bf16" in str(program)
    assert " f32[6, 16, 8]" not in str(program) and " f32[6, 8, 16]" not in str(program)  # no upcast copies


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_results_match_eager(target, dtype):
    compiled = wrapgen.compile(scores, inputs(dtype), target=target)
    for _ in range(2):
        args = inputs(dtype)
        torch.testing.assert_close(compiled(*args), scores(*args), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_dynamo_entry_matches_eager(dtype):
    wrapgen.dynamo.ensure_registered()
    compiled = torch.compile(scores, backend="wrapgen")
    args = inputs(dtype)
    torch.testing.assert_close(compiled(*args), scores(*args), **tolerance(dtype))


@pytest.mark.parametrize(("beta", "alpha"), [(0.0, 1.0), (1.0, 1.0), (0.5, 2.0)])
def test_the_decomposition_is_the_op(beta, alpha):
    bias, q, k = inputs(torch.float32)
    bias[0, 0, 0] = float("nan")  # beta 0 ignores it
    expected = torch.baddbmm(bias, q, k, beta=beta, alpha=alpha)
    torch.testing.assert_close(baddbmm_in_input_dtype(bias, q, k, beta=beta, alpha=alpha), expected, equal_nan=True)
    integers = [torch.randint(-4, 4, t.shape) for t in (bias, q, k)]
    assert torch.equal(baddbmm_in_input_dtype(*integers, beta=2, alpha=3), torch.baddbmm(*integers, beta=2, alpha=3))
