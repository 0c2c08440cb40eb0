"""Column sums as C++ kernels that run along memory (wrapgen/kernels/cpp/column_reduction.py):
one pass for plain column sums (bias gradients), a pass per dependent sum where a sum reads an
earlier one (batch-norm statistics of an NHWC activation: the variance after its mean)."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir.lines import KernelDefinition

TARGETS = ["python", "cpp"]


def _kernels(program) -> list[str]:
    return [line.source for line in program.lines if isinstance(line, KernelDefinition) and line.language == "cpp"]


def _nhwc_statistics(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    return mean, var, torch.rsqrt(var + 1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(8, 32, 16, 16), (3, 20, 5, 7)], ids=["blocks", "tail"])
def test_statistics_of_an_nhwc_activation_run_in_two_passes_along_memory(target, shape):
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last) * 3 + 1
    program = wrapgen.lower(_nhwc_statistics, (x,))
    columns = [s for s in _kernels(program) if "xb +=" in s]
    assert columns, "\n".join(_kernels(program))
    assert any(s.count("#pragma omp simd") >= 2 and "blk" in s for s in columns), columns  # two passes
    compiled = wrapgen.compile(_nhwc_statistics, (x,), target=target)
    fresh = torch.randn(shape).contiguous(memory_format=torch.channels_last) * 2 - 1
    for got, expected in zip(compiled(fresh), _nhwc_statistics(fresh)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("target", TARGETS)
def test_plain_column_sums_keep_one_pass(target):
    def fn(g, x):
        return g.sum(0), (g * x).sum(0)

    args = (torch.randn(64, 40), torch.randn(64, 40))
    program = wrapgen.lower(fn, args)
    columns = [s for s in _kernels(program) if "xb +=" in s]
    assert columns and not any("blk" in s for s in columns), _kernels(program)
    compiled = wrapgen.compile(fn, args, target=target)
    fresh = tuple(torch.randn_like(a) for a in args)
    for got, expected in zip(compiled(*fresh), fn(*fresh)):
        torch.testing.assert_close(got, expected)


class NormRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(x))


def test_batch_norm_training_on_nhwc_matches_eager():
    """Train-mode batch norm + ReLU on a channels-last activation: outputs and running stats."""
    model, reference = NormRelu().train(), NormRelu().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 24, 9, 9).contiguous(memory_format=torch.channels_last)
    compiled = wrapgen.compile(model, (x,), target="cpp")
    fresh = torch.randn(4, 24, 9, 9).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(compiled(fresh), reference(fresh))
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)


def _norm_relu_pool(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.relu(x * torch.rsqrt(scale + 1e-5)[:, None, None] + shift[:, None, None])
    return torch.max_pool2d(y, 3, 2, 1), torch.amin(y, dim=(0, 2))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_nhwc_max_pool_and_min_run_along_channels(target, nan):
    """A channels-last max pool (its window's index clamped, not contiguous along the window)
    and a min over rows: blocks of channels with a NaN flag each; a NaN in a window wins."""
    x = torch.randn(2, 20, 9, 11).contiguous(memory_format=torch.channels_last)
    args = (x, torch.rand(20) + 0.5, torch.randn(20))
    program = wrapgen.lower(_norm_relu_pool, args)
    columns = [s for s in _kernels(program) if "xb +=" in s]
    assert any("std::max" in s and "quiet_NaN" in s for s in columns), "\n".join(_kernels(program))
    assert any("std::min" in s for s in columns), "\n".join(_kernels(program))
    compiled = wrapgen.compile(_norm_relu_pool, args, target=target)
    fresh = (torch.randn_like(x).contiguous(memory_format=torch.channels_last) * 2, *args[1:])
    if nan:
        fresh[0][1, 3, 4, 5] = float("nan")
    for got, expected in zip(compiled(*fresh), _norm_relu_pool(*fresh)):
        torch.testing.assert_close(got, expected, equal_nan=True)
        assert got.stride() == expected.stride()


@pytest.mark.parametrize("target", TARGETS)
def test_nchw_pool_computes_the_norm_once_per_window(target):
    """Per-channel work under an NCHW pooling window (a fused batch norm's scale, a square root
    and a division) is computed before the window's loops, not once per tap."""
    x = torch.randn(2, 6, 10, 10)
    args = (x, torch.rand(6) + 0.5, torch.randn(6))
    program = wrapgen.lower(_norm_relu_pool, args)
    pool = next(s for s in _kernels(program) if "std::max" in s and "r1" in s)
    before_window = pool.split("for (int64_t r0")[0]
    assert "std::sqrt" in before_window, pool
    compiled = wrapgen.compile(_norm_relu_pool, args, target=target)
    fresh = (torch.randn_like(x), *args[1:])
    for got, expected in zip(compiled(*fresh), _norm_relu_pool(*fresh)):
        torch.testing.assert_close(got, expected)
