"""Pooling windows (wrapgen/lowering/loop_ops/pooling.py): in Triton kernels a window of at most
UNROLLED_WINDOW_LIMIT taps is one pointwise value combining its taps, a larger one a window
reduction; C++ kernels keep the reduction (its column form). Both agree with eager on every target,
padding, count_include_pad, divisor_override and NaN included; Triton runs here under
TRITON_INTERPRET, as in CI."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.lowering.loop_ops.pooling import UNROLLED_WINDOW_LIMIT
from wrapgen.wrapper_ir.lines import KernelDefinition

TARGETS = ("python", "cpp", "fx")


def _reductions(program) -> list[str]:
    """Kernels that hold a window reduction: their `ops` name it by its origin (a pointwise pool
    appears under the ATen op's name, `aten::avg_pool2d.default`)."""
    ops = [dict(line.metadata).get("ops", "").split(",") for line in program.lines if isinstance(line, KernelDefinition)]
    return [o for names in ops for o in names if o in ("avg_pool2d", "max_pool2d")]


CASES = {
    "avg 3x3 s1 p1 excluding the padding": lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False) - x,
    "avg 3x3 s2 p1 ceil": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "avg 2x2 divisor 3": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "max 3x3 s2 p1 after relu": lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1),
    "max 2x3 s1 dilated": lambda x: F.max_pool2d(x, (2, 3), 1, 0, dilation=2),
    "avg 5x5 (a reduction)": lambda x: F.avg_pool2d(x, 5, 1, 2),
    "max 5x5 (a reduction)": lambda x: F.max_pool2d(x, 5, 2, 2),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_pools_match_eager(case, target):
    fn = CASES[case]
    for x in (torch.randn(2, 5, 11, 9), torch.randn(2, 5, 11, 9).to(memory_format=torch.channels_last)):
        compiled = wrapgen.compile(fn, (x,), target=target)
        fresh = torch.randn_like(x)
        torch.testing.assert_close(compiled(fresh), fn(fresh))


@pytest.mark.parametrize("case", list(CASES))
def test_small_windows_are_pointwise_in_triton_and_large_ones_reductions(case):
    x = torch.randn(2, 5, 11, 9)
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(CASES[case], (x,))
    large = "5x5" in case
    assert 25 > UNROLLED_WINDOW_LIMIT >= 9
    assert bool(_reductions(program)) == large, str(program)
    assert _reductions(wrapgen.lower(CASES[case], (x,))), "C++ kernels keep the window reduction"


@pytest.mark.parametrize("target", ["python", "interpret"])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_pools_match_eager(case, target):
    fn = CASES[case]
    x = torch.randn(2, 4, 9, 7).to(memory_format=torch.channels_last)
    with wrapgen.config.patch(cpu_kernels="triton"):
        compiled = wrapgen.compile(fn, (x,), target=target)
    fresh = torch.randn_like(x)
    torch.testing.assert_close(compiled(fresh), fn(fresh))


@pytest.mark.parametrize("language", ["cpp", "triton"])
def test_a_max_pool_propagates_nan_as_eager(language):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, 1, 1)

    x = torch.randn(1, 2, 6, 6)
    with wrapgen.config.patch(cpu_kernels=language):
        compiled = wrapgen.compile(fn, (x,), target="python")
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 0, 0] = float("-inf")
    torch.testing.assert_close(compiled(x), fn(x), equal_nan=True)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda(case, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fn = CASES[case]
    x = torch.randn(4, 32, 28, 28, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    compiled = wrapgen.compile(fn, (x,))
    tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(compiled(x), fn(x), **tolerance)
