"""Boolean SDPA masks become additive float masks made by a generated kernel (once per mask)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.lowering.capture import capture
from wrapgen.lowering.graph_passes.attention_masks import contiguous_traced_masks, float_attention_masks
from wrapgen.wrapper_ir import ExternKernel

TARGETS = ("python", "cpp", "fx")


def two_layers_sharing_a_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A causal mask and a padding mask, combined with `&`, used by two attention calls."""
    n = q.shape[-2]
    positions = torch.arange(n, device=q.device)
    causal = positions[None, :] <= positions[:, None]
    padding = positions[None, :] < lengths[:, None]
    mask = (causal[None] & padding[:, None, :])[:, None]
    first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(first, k, v, attn_mask=mask) + first


def inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=dtype) for _ in range(3))
    return [q, k, v, torch.tensor([16, 9])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_mask_reaches_attention_as_a_float_made_by_a_kernel(dtype):
    program = wrapgen.lower(two_layers_sharing_a_mask, inputs(dtype))
    attention = [line for line in program.lines if isinstance(line, ExternKernel) and "scaled_dot_product" in line.op]
    assert len(attention) == 2
    masks = {line.args[3].name for line in attention}
    assert len(masks) == 1  # one conversion serves both calls
    externs = {line.op for line in program.lines if isinstance(line, ExternKernel)}
    assert not any("where" in op or "_to_copy" in op for op in externs)
    assert f"{masks.pop()} = allocate {'f32' if dtype == torch.float32 else 'bf16'}" in str(program)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_results_match_eager(target, dtype):
    compiled = wrapgen.compile(two_layers_sharing_a_mask, inputs(dtype), target=target)
    for _ in range(2):
        args = inputs(dtype)
        tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
        torch.testing.assert_close(compiled(*args), two_layers_sharing_a_mask(*args), **tolerance)


def test_the_callers_graph_is_not_changed():
    captured = capture(two_layers_sharing_a_mask, inputs(torch.float32), False)
    before = str(captured.graph_module.graph)
    rewritten = float_attention_masks(captured)
    assert rewritten.graph_module is not captured.graph_module
    assert str(captured.graph_module.graph) == before
    assert "where" in str(rewritten.graph_module.graph) and "where" not in before


def test_a_graph_without_boolean_masks_is_returned_as_is():
    captured = capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), inputs(torch.float32)[:3], False)
    assert float_attention_masks(captured) is captured


def test_dynamic_sizes():
    compiled = wrapgen.compile(two_layers_sharing_a_mask, inputs(torch.float32), dynamic=True)
    for n in (16, 24):
        q, k, v = (torch.randn(3, 2, n, 8) for _ in range(3))
        args = [q, k, v, torch.tensor([n, 5, 2])]
        torch.testing.assert_close(compiled(*args), two_layers_sharing_a_mask(*args))


def attention_with_a_permuted_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A relative-position bias computed as (batch, query, key, head) and permuted to SDPA's
    (batch, head, query, key), as T5's is: its key dimension is strided."""
    bias = (table[None] * 2).permute(0, 3, 1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias) + F.scaled_dot_product_attention(k, q, v, attn_mask=bias)


@pytest.mark.parametrize("target", TARGETS)
def test_a_mask_with_strided_keys_reaches_attention_contiguous(target):
    """Strided keys rule out SDPA's fused backends: the kernel computing the mask writes it contiguous."""
    q, k, v = (torch.randn(1, 3, 16, 8) for _ in range(3))
    table = torch.randn(16, 16, 3)
    program = wrapgen.lower(attention_with_a_permuted_bias, (q, k, v, table))
    attention = [line for line in program.lines if isinstance(line, ExternKernel) and "scaled_dot_product" in line.op]
    masks = {line.args[3].name for line in attention}
    assert len(attention) == 2 and len(masks) == 1
    assert f"{masks.pop()} = allocate f32[1, 3, 16, 16] strides [768, 256, 16, 1]" in str(program)
    compiled = wrapgen.compile(attention_with_a_permuted_bias, (q, k, v, table), target=target)
    fresh = (*(torch.randn(1, 3, 16, 8) for _ in range(3)), torch.randn(16, 16, 3))
    torch.testing.assert_close(compiled(*fresh), attention_with_a_permuted_bias(*fresh))


def test_a_broadcast_mask_is_not_copied_to_full_size():
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))

    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.t().expand(2, 3, 16, 16))

    captured = capture(fn, [q, k, v, torch.randn(16, 16)], False)
    assert float_attention_masks(captured) is captured


def test_dynamos_graph_passes_a_mask_with_strided_keys_contiguous():
    """Under torch.compile the copy is made in dynamo's graph, before aot_autograd traces the call
    and torch picks its backend (on CUDA the fused ones refuse strided keys)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    q, k, v = (torch.randn(1, 3, 16, 8) for _ in range(3))
    table = torch.randn(16, 16, 3)
    torch._dynamo.reset()
    torch.compile(attention_with_a_permuted_bias, backend=keep)(q, k, v, table)
    gm = graphs[0]
    assert contiguous_traced_masks(gm)
    copies = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "contiguous"]
    assert len(copies) == 1 and copies[0].meta["example_value"].stride() == (768, 256, 16, 1)
    assert not contiguous_traced_masks(gm)  # nothing left to copy
    torch._dynamo.reset()
    compiled = torch.compile(attention_with_a_permuted_bias, backend="wrapgen")
    torch.testing.assert_close(compiled(q, k, v, table), attention_with_a_permuted_bias(q, k, v, table))


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
def test_a_strided_mask_that_is_an_input(entry):
    """The copy goes before the attention call, not among the graph's placeholders."""

    def fn(q, k, v, bias, scale):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias) * scale

    q, k, v = (torch.randn(1, 3, 16, 8) for _ in range(3))
    bias, scale = torch.randn(1, 16, 16, 3).permute(0, 3, 1, 2), torch.randn(8)
    if entry == "compile":
        compiled = wrapgen.compile(fn, (q, k, v, bias, scale))
    else:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="wrapgen")
    torch.testing.assert_close(compiled(q, k, v, bias, scale), fn(q, k, v, bias, scale))
