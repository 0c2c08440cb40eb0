"""A CUDA addmm read only by pointwise ops becomes mm + bias in the reading kernel
(wrapgen/lowering/graph_passes/addmm_bias.py). The rewrite itself is checked on CPU with fake CUDA tensors
(the graph is rewritten, never run); on a GPU every target runs the models against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import wrapgen
from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.graph_passes.addmm_bias import bias_into_readers

aten = torch.ops.aten
TARGETS = ["python", "cpp", "fx"]


def _captured(fn, *shapes: tuple[int, ...], device: str = "cuda", dtype=torch.float32) -> CapturedGraph:
    """`fn` traced on fake tensors of `device` (no GPU needed to trace for CUDA)."""
    with FakeTensorMode():
        args = [torch.empty(s, device=device, dtype=dtype) for s in shapes]
        gm = make_fx(fn)(*args)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    return CapturedGraph(gm, names)


def _ops(captured: CapturedGraph) -> list:
    return [n.target for n in captured.graph_module.graph.nodes if n.op == "call_function"]


def _linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _linear_residual_3d(x, w, b):  # a linear layer on [batch, tokens, features]: read through a view
    return F.linear(x, w, b) + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_bias_read_by_pointwise_ops_moves_into_their_kernel(dtype):
    captured = _captured(_linear_gelu, (64, 32), (48, 32), (48,), dtype=dtype)
    assert aten.addmm.default in _ops(captured)
    rewritten = bias_into_readers(captured)
    ops = _ops(rewritten)
    assert aten.addmm.default not in ops and aten.mm.default in ops and aten.add.Tensor in ops
    (out,) = rewritten.graph_module.graph.find_nodes(op="output")
    value = out.args[0].meta["val"] if not isinstance(out.args[0], (list, tuple)) else out.args[0][0].meta["val"]
    assert value.shape == (64, 48) and value.dtype == dtype


def test_a_linear_layer_read_through_a_view_is_rewritten():
    captured = _captured(_linear_residual_3d, (4, 16, 32), (32, 32), (32,))
    assert aten.addmm.default not in _ops(bias_into_readers(captured))


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda x, w, b: F.linear(x, w, b), "the product is an output: the epilogue saves a pass"),
        (lambda x, w, b: F.linear(x, w, b).sum(1), "a reduction reads it"),
        (lambda x, w, b: F.linear(x, w, b) @ w, "another product reads it"),
        (lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5).relu(), "beta is not 1"),
    ],
)
def test_an_addmm_not_read_by_pointwise_work_alone_is_kept(fn, why):
    captured = _captured(fn, (64, 32), (32, 32), (32,))
    assert bias_into_readers(captured) is captured, why


def test_cpu_products_are_kept():
    captured = _captured(_linear_gelu, (64, 32), (48, 32), (48,), device="cpu")
    assert bias_into_readers(captured) is captured


def test_a_full_bias_matrix_is_kept():
    captured = _captured(lambda x, w, c: torch.addmm(c, x, w.t()).relu(), (64, 32), (48, 32), (64, 48))
    assert bias_into_readers(captured) is captured


def test_a_cpu_program_keeps_addmm():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU())  # a library product
    x = torch.randn(64, 256)
    with wrapgen.config.patch(bias_in_kernels=True):
        program = str(wrapgen.lower(model, (x,)))
    assert "addmm" in program  # the pass is measured on CUDA only


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_mlp_block_matches_eager(target, dtype):
    block = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    model = block.cuda().to(dtype).eval()
    x = torch.randn(4, 96, 256, device="cuda", dtype=dtype)

    def residual(t):
        return model(t) + t

    with torch.no_grad():
        with wrapgen.config.patch(bias_in_kernels=True):
            compiled = wrapgen.compile(residual, (x,), target=target)
        with wrapgen.config.patch(bias_in_kernels=False):
            kept = wrapgen.lower(residual, (x,))
        assert "addmm" not in str(compiled.program) and "addmm" in str(kept)
        fresh = torch.randn_like(x)
        tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
        torch.testing.assert_close(compiled(fresh), residual(fresh), **tolerance)
