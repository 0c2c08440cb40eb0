"""A CUDA convolution read only by generated kernels runs without its bias, which the reading
kernel adds (wrapgen/lowering/graph_passes/conv_bias.py). The rewrite is checked on CPU with fake
CUDA tensors (the graph is rewritten, never run); on a GPU every target runs the models against
eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import wrapgen
from tests.test_addmm_bias import TARGETS, _captured, _ops
from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.graph_passes.conv_bias import conv_bias_into_readers

aten = torch.ops.aten


def _biases(captured) -> list:
    """The bias argument of every convolution in the graph."""
    return [n.args[2] for n in captured.graph_module.graph.find_nodes(op="call_function", target=aten.convolution.default)]


def _conv_gelu(x, w, b):
    return F.gelu(F.conv2d(x, w, b, padding=1))


def _conv_group_norm(x, w, b):  # a reduction reads it (PoolFormer's stem)
    return F.group_norm(F.conv2d(x, w, b), 1)


def _conv1d_residual(x, w, b):
    return F.conv1d(x, w, b, padding=1) + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn, shapes", [
    (_conv_gelu, ((2, 8, 12, 12), (16, 8, 3, 3), (16,))),
    (_conv_group_norm, ((2, 8, 12, 12), (16, 8, 1, 1), (16,))),
    (_conv1d_residual, ((2, 8, 20), (8, 8, 3), (8,))),
])
def test_a_bias_read_by_generated_kernels_moves_into_them(fn, shapes, dtype):
    captured = _captured(fn, *shapes, dtype=dtype)
    assert all(b is not None for b in _biases(captured))
    rewritten = conv_bias_into_readers(captured)
    assert _biases(rewritten) == [None] and aten.add.Tensor in _ops(rewritten)
    (out,) = rewritten.graph_module.graph.find_nodes(op="output")
    before = captured.graph_module.graph.find_nodes(op="output")[0].args[0]
    first = out.args[0][0] if isinstance(out.args[0], (list, tuple)) else out.args[0]
    expected = before[0] if isinstance(before, (list, tuple)) else before
    assert first.meta["val"].shape == expected.meta["val"].shape and first.meta["val"].dtype == dtype


def test_the_sum_has_the_convolution_s_layout():
    def channels_last(n: int, c: int, h: int, w: int) -> torch.Tensor:
        return torch.empty_strided((n, c, h, w), (h * w * c, 1, w * c, c), device="cuda")

    with FakeTensorMode():
        gm = make_fx(lambda x, w, b: F.relu(F.conv2d(x, w, b)))(channels_last(2, 8, 12, 12), channels_last(16, 8, 3, 3),
                                                                torch.empty(16, device="cuda"))
    (conv,) = gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
    strides = conv.meta["val"].stride()  # channels-last where fake CUDA convolutions pick cuDNN's layout
    rewritten = conv_bias_into_readers(CapturedGraph(gm, [n.name for n in gm.graph.find_nodes(op="placeholder")]))
    (add,) = rewritten.graph_module.graph.find_nodes(op="call_function", target=aten.add.Tensor)
    (bare,) = rewritten.graph_module.graph.find_nodes(op="call_function", target=aten.convolution.default)
    assert add.meta["val"].stride() == bare.meta["val"].stride() == strides


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda x, w, b: F.conv2d(x, w, b), "the result is an output"),
        (lambda x, w, b: F.conv2d(F.conv2d(x, w, b), w), "another convolution reads it"),
        (lambda x, w, b: F.conv2d(x, w, None).relu(), "there is no bias"),
    ],
)
def test_a_convolution_not_read_by_generated_kernels_alone_keeps_its_bias(fn, why):
    captured = _captured(fn, (2, 8, 12, 12), (8, 8, 1, 1), (8,))
    assert conv_bias_into_readers(captured) is captured, why


def test_cpu_convolutions_keep_their_bias():
    captured = _captured(_conv_gelu, (2, 8, 12, 12), (16, 8, 3, 3), (16,), device="cpu")
    assert conv_bias_into_readers(captured) is captured


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_conv_mlp_matches_eager(target, dtype):
    """PoolFormer's MLP: 1x1 convolutions with biases, GELU between, a scaled residual after."""
    block = torch.nn.Sequential(torch.nn.Conv2d(64, 256, 1), torch.nn.GELU(), torch.nn.Conv2d(256, 64, 1))
    model = block.cuda().to(dtype).eval()
    x = torch.randn(4, 64, 14, 14, device="cuda", dtype=dtype)

    def residual(t):
        return t + 0.5 * model(t)

    with torch.no_grad():
        with wrapgen.config.patch(bias_in_kernels=True):
            compiled = wrapgen.compile(residual, (x,), target=target)
        with wrapgen.config.patch(bias_in_kernels=False):
            kept = wrapgen.lower(residual, (x,))
        assert str(compiled.program).count("convolution") == str(kept).count("convolution")
        fresh = torch.randn_like(x)
        tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
        torch.testing.assert_close(compiled(fresh), residual(fresh), **tolerance)
