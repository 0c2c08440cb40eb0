"""Group norm and average pooling as generated kernels (PoolFormer's token mixer and norms).

Group norm is generated on CUDA only (norms.GROUP_NORM_DEVICES: on the CPU ATen's kernel measured
faster); the CPU tests add the CPU to that set, so the C++ and Triton (interpreter) codegen of the
same lowering runs here. A group norm with few (sample, group) rows sums in two stages; both
layouts of the input (contiguous, channels-last) are read in memory order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import wrapgen
from wrapgen.kernels.triton import compat
from wrapgen.lowering.loop_ops import norms
from wrapgen.wrapper_ir import ExternKernel, KernelDefinition

TARGETS = ["python", "cpp", "fx", "interpret", "triton"]


def _compile(fn, inputs: tuple, target: str):
    """(program, compiled callable); `triton`: the python target with Triton kernels (interpreter)."""
    if target == "triton":
        if not (compat.available() and compat.interpreting()):
            pytest.skip("needs triton in interpreter mode (CPU machines)")
        with wrapgen.config.patch(cpu_kernels="triton"):
            return wrapgen.lower(fn, inputs), wrapgen.compile(fn, inputs, target="python")
    return wrapgen.lower(fn, inputs), wrapgen.compile(fn, inputs, target=target)


def _library_ops(program) -> list[str]:
    return [line.op for line in program.lines if isinstance(line, ExternKernel)]


@pytest.fixture
def group_norm_on_cpu(monkeypatch):
    monkeypatch.setattr(norms, "GROUP_NORM_DEVICES", norms.GROUP_NORM_DEVICES | {"cpu"})


def _group_norm(groups: int, channels: int, dtype: torch.dtype = torch.float32) -> nn.GroupNorm:
    module = nn.GroupNorm(groups, channels)
    nn.init.normal_(module.weight)
    nn.init.normal_(module.bias)
    return module.to(dtype)


# (groups, input shape, channels-last, two-stage sums)
GROUP_NORMS = [
    pytest.param(4, (2, 16, 9, 7), False, False, id="4-groups"),
    pytest.param(1, (2, 8, 32, 32), False, True, id="1-group-split"),
    pytest.param(1, (2, 8, 32, 32), True, True, id="1-group-split-channels-last"),
    pytest.param(2, (3, 8, 40, 16), True, False, id="2-groups-channels-last"),
    pytest.param(2, (2, 6, 10), False, False, id="1-d"),
]


@pytest.mark.usefixtures("group_norm_on_cpu")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("groups, shape, channels_last, split", GROUP_NORMS)
def test_group_norm_is_generated(target, groups, shape, channels_last, split):
    module = _group_norm(groups, shape[1])
    x = torch.randn(shape) * 3 + 2  # a mean far from 0: a one-pass variance would lose digits
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        program, compiled = _compile(module, (x,), target)
        assert _library_ops(program) == []
        kernels = sum(isinstance(line, KernelDefinition) for line in program.lines)
        assert kernels == (4 if split else 2)  # each sum in one kernel, or two
        fresh = torch.randn_like(x) * 3 + 2
        torch.testing.assert_close(compiled(fresh), module(fresh))


@pytest.mark.usefixtures("group_norm_on_cpu")
def test_group_norm_statistics_and_half_precision():
    def fn(x, weight, bias):
        return torch.ops.aten.native_group_norm(x, weight, bias, 2, 16, 63, 4, 1e-5)

    x, weight, bias = torch.randn(2, 16, 9, 7) * 2 + 1, torch.randn(16), torch.randn(16)
    got = wrapgen.compile(fn, (x, weight, bias))(x, weight, bias)
    for g, e in zip(got, fn(x, weight, bias)):  # the output, the mean and the inverse std
        torch.testing.assert_close(g, e)
    module = _group_norm(1, 8, torch.bfloat16)
    xb = torch.randn(2, 8, 32, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(wrapgen.compile(module, (xb,))(xb), module(xb), atol=3e-2, rtol=2e-2)


def test_group_norm_stays_a_library_call_on_the_cpu():
    program = wrapgen.lower(_group_norm(2, 4), (torch.randn(2, 4, 5, 5),))
    assert _library_ops(program) == ["aten::native_group_norm.default"]


POOLS = [
    pytest.param(dict(kernel_size=3, stride=1, padding=1, count_include_pad=False), id="poolformer"),
    pytest.param(dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), id="ceil-include-pad"),
    pytest.param(dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True, count_include_pad=False),
                 id="ceil-exclude-pad"),
    pytest.param(dict(kernel_size=2, divisor_override=3), id="divisor-override"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("options", POOLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_avg_pool_is_a_window_sum(target, options, dtype):
    def fn(x, y):
        return F.avg_pool2d(x, **options) * 2, F.avg_pool2d(y, **options)

    inputs = (torch.randn(2, 3, 10, 11, dtype=dtype), torch.randn(3, 9, 8, dtype=dtype))
    with torch.no_grad():
        program, compiled = _compile(fn, inputs, target)
        assert _library_ops(program) == []
        fresh = tuple(torch.randn_like(x) for x in inputs)
        tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}
        torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tolerance)


@pytest.mark.usefixtures("group_norm_on_cpu")
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_a_poolformer_block(target):
    """norm, pool(x) - x, residual; norm, 1x1 convolutions: one library call per convolution."""

    class Block(nn.Module):
        def __init__(self, channels: int = 16) -> None:
            super().__init__()
            self.norm1, self.norm2 = _group_norm(1, channels), _group_norm(1, channels)
            self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.fc1, self.fc2 = nn.Conv2d(channels, 2 * channels, 1), nn.Conv2d(2 * channels, channels, 1)

        def forward(self, x):
            y = self.norm1(x)
            x = x + (self.pool(y) - y)
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    block, x = Block().eval(), torch.randn(2, 16, 24, 24)
    with torch.no_grad():
        program, compiled = _compile(block, (x,), target)
        assert sorted(_library_ops(program)) == ["aten::convolution.default"] * 2
        fresh = torch.randn_like(x)
        torch.testing.assert_close(compiled(fresh), block(fresh))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_group_norm_after_channels_last_convolutions_is_generated(dtype):
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), _group_norm(1, 16), nn.GELU(),
                          nn.AvgPool2d(3, 1, 1, count_include_pad=False), nn.Conv2d(16, 8, 1), _group_norm(4, 8))
    model = model.to("cuda", dtype).eval()
    x = torch.randn(4, 3, 64, 64, device="cuda", dtype=dtype)
    # full-precision fp32 convolutions: cuDNN's TF32 ones, channels-last here and NCHW in eager,
    # differ by ~1e-3 after two normalizations
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        program = wrapgen.lower(model, (x,))
        assert sorted(_library_ops(program)) == ["aten::convolution.default"] * 2, str(program)
        tolerance = {"atol": 5e-2, "rtol": 5e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
        for target in ("python", "cpp"):
            torch.testing.assert_close(wrapgen.compile(model, (x,), target=target)(x), model(x), **tolerance)


@pytest.mark.usefixtures("group_norm_on_cpu")
def test_group_norm_with_a_dynamic_batch():
    """A symbolic batch (symbolic strides too): one-stage sums, the reduced dimensions in logical order."""
    from benchmarks.suite.run import recorded_programs

    module = _group_norm(2, 8)
    x = torch.randn(2, 8, 6, 5)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="wrapgen")
    with torch.no_grad(), recorded_programs() as programs:
        torch.testing.assert_close(compiled(x), module(x))
    assert [_library_ops(p) for p in programs] == [[]]
    for batch in (3, 5):
        x = torch.randn(batch, 8, 6, 5) * 2 + 1
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x))
