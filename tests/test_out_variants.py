"""Which ATen calls go through their out= overload (wrapgen/lowering/out_variants.py).

The FFT ops are denied: on CUDA their out= kernels scale the unscaled transform with mul_out
into `out`, where the functional op scales its own result in place, and for float16 inputs
(complex32 results) the two round differently, so a compiled fft.fft/fft.ifft with
norm="ortho" came out 1-2 ulp off eager (the CUDA float16 conformance run found it).
"""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.lowering.out_variants import find_out_variant
from wrapgen.wrapper_ir import ExternKernel

FFT_OPS = [torch.ops.aten._fft_r2c.default, torch.ops.aten._fft_c2c.default, torch.ops.aten._fft_c2r.default]


def _fft(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.fft(x, n=8, dim=1, norm="ortho")


@pytest.mark.parametrize("op", FFT_OPS, ids=lambda op: op._schema.name)
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_fft_ops_have_no_out_variant(op, device_type) -> None:
    assert find_out_variant(op, device_type) is None


def test_other_ops_keep_their_out_variant() -> None:
    found = find_out_variant(torch.ops.aten.addmm.default, "cpu")
    assert found is not None and found.op is torch.ops.aten.addmm.out


def test_fft_calls_the_functional_overload() -> None:
    x = torch.randn(2, 6, 16)
    program = wrapgen.lower(_fft, (x,))
    calls = [line.op for line in program.lines if isinstance(line, ExternKernel)]
    assert "aten::_fft_r2c.default" in calls, str(program)
    assert not any(op.startswith("aten::_fft") and op.endswith(".out") for op in calls), str(program)
    fn = wrapgen.compile(_fft, (x,), target="python")
    x2 = torch.randn(2, 6, 16)
    torch.testing.assert_close(fn(x2), _fft(x2))


@pytest.mark.cuda
@pytest.mark.parametrize("target", ["python", "cpp", "fx"])
@pytest.mark.parametrize("fft", [torch.fft.fft, torch.fft.ifft], ids=["fft", "ifft"])
def test_cuda_half_fft_matches_eager_bitwise(target, fft) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")

    def f(x: torch.Tensor) -> torch.Tensor:
        return fft(x, n=8, dim=1, norm="ortho")

    x = torch.randn(2, 8, 16, device="cuda", dtype=torch.float16)
    fn = wrapgen.compile(f, (x,), target=target)
    x2 = torch.randn(2, 8, 16, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(fn(x2), f(x2), rtol=0, atol=0)
