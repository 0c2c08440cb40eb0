"""Attention masks in the form SDPA's fused backends take, made once per mask by a generated kernel.

Given a boolean `attn_mask`, `scaled_dot_product_attention` converts it on every call
(`zeros_like(mask, dtype=q.dtype).masked_fill_(~mask, -inf)`: two full-size passes inside
the library call, for every layer that shares the mask). Rewriting the graph to pass that
float mask instead makes the conversion an ordinary pointwise op: it fuses with the kernel
that builds the mask (causal and padding masks are comparisons and `&`s) and runs once for
all layers.

A mask whose last dimension is not unit-stride (T5's relative position bias, permuted from
(batch, query, key, head)) rules out every fused backend: SDPA runs its math backend, a dozen
library kernels per call in float32. Such a mask is passed as a contiguous copy, which the kernel
that computes the mask writes directly. The values SDPA sees are the same either way. Under
`torch.compile` the copy goes into dynamo's graph (`contiguous_traced_masks`), before aot_autograd
traces the call and torch picks its backend (and decomposes a math call into matmuls).
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode

from wrapgen.lowering.capture import CapturedGraph, with_graph
from wrapgen.lowering.graph_passes.attention_broadcast import TRACED_ATTENTION

aten = torch.ops.aten

# Attention ops whose `attn_mask` may be boolean, with the mask's position in the arguments.
_MASK_POSITION = {
    aten.scaled_dot_product_attention.default: 3,
    aten._scaled_dot_product_flash_attention_for_cpu.default: None,  # keyword-only
}


def _mask_of(node: torch.fx.Node) -> tuple[torch.fx.Node | None, int | None]:
    position = _MASK_POSITION[node.target]  # type: ignore[index]
    if "attn_mask" in node.kwargs:
        mask = node.kwargs["attn_mask"]
    elif position is not None and len(node.args) > position:
        mask = node.args[position]
    else:
        return None, None
    if not isinstance(mask, torch.fx.Node):
        return None, None
    value = mask.meta.get("val")
    rewritten = isinstance(value, torch.Tensor) and (value.dtype == torch.bool or _strided_keys(value))
    return (mask, position) if rewritten else (None, None)


def _strided_keys(value: torch.Tensor) -> bool:
    """A mask whose key dimension is not unit-stride, and which a contiguous copy would not make
    larger (no broadcast dimension: an expanded mask is left as it is)."""
    strides = value.stride()
    if value.dim() == 0 or not all(isinstance(s, int) for s in (*strides, *value.shape)):
        return False
    return value.shape[-1] != 1 and strides[-1] != 1 and all(s != 0 or n == 1 for s, n in zip(strides, value.shape))


def _contiguous(graph: torch.fx.Graph, mask: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """A contiguous copy of `mask`, placed before its first reader `before` (not after the mask,
    which may be one of the graph's placeholders)."""
    value = mask.meta["val"]
    with graph.inserting_before(before):
        copy = graph.call_function(aten.clone.default, (mask,), {"memory_format": torch.contiguous_format})
    with detect_fake_mode([value]) or torch._subclasses.FakeTensorMode():
        copy.meta["val"] = aten.clone.default(value, memory_format=torch.contiguous_format)
    return copy


def _float_mask(graph: torch.fx.Graph, mask: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    """where(mask, 0, -inf) in `dtype`, placed right after the mask, with fake values."""
    value = mask.meta["val"]
    with graph.inserting_after(mask):
        additive = graph.call_function(aten.where.Scalar, (mask, 0.0, float("-inf")))
    with detect_fake_mode([value]) or torch._subclasses.FakeTensorMode():
        additive.meta["val"] = aten.where.Scalar(value, 0.0, float("-inf"))
    if additive.meta["val"].dtype == dtype:
        return additive
    with graph.inserting_after(additive):
        cast = graph.call_function(aten._to_copy.default, (additive,), {"dtype": dtype})
    with detect_fake_mode([value]) or torch._subclasses.FakeTensorMode():
        cast.meta["val"] = aten._to_copy.default(additive.meta["val"], dtype=dtype)
    return cast


def float_attention_masks(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with every boolean SDPA mask replaced by its additive float form and every mask
    with strided keys by a contiguous copy (on a copy of the graph: the caller's graph module is
    never changed), or `captured` itself."""
    gm = captured.graph_module
    if not any(n.op == "call_function" and n.target in _MASK_POSITION and _mask_of(n)[0] is not None for n in gm.graph.nodes):
        return captured
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    converted: dict[tuple[torch.fx.Node, torch.dtype], torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _MASK_POSITION:
            continue
        mask, position = _mask_of(node)
        if mask is None:
            continue
        dtype = node.args[0].meta["val"].dtype  # the query's
        key = (mask, dtype)
        if key not in converted:
            new = _float_mask(graph, mask, dtype) if mask.meta["val"].dtype == torch.bool else mask
            converted[key] = _contiguous(graph, new, node) if _strided_keys(new.meta["val"]) else new
        if "attn_mask" in node.kwargs:
            node.kwargs = {**node.kwargs, "attn_mask": converted[key]}
        else:
            node.args = (*node.args[:position], converted[key], *node.args[position + 1:])  # type: ignore[misc]
    graph.lint()
    return with_graph(captured, graph)



def contiguous_traced_masks(gm: torch.fx.GraphModule) -> bool:
    """Dynamo's graph with each SDPA mask whose keys are strided passed through `.contiguous()`
    (rewritten in place); True when a call changed."""
    copies: dict[torch.fx.Node, torch.fx.Node] = {}  # one copy of a mask for every call reading it
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in TRACED_ATTENTION:
            continue
        in_kwargs = "attn_mask" in node.kwargs
        mask = node.kwargs["attn_mask"] if in_kwargs else (node.args[3] if len(node.args) > 3 else None)
        value = mask.meta.get("example_value") if isinstance(mask, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not _strided_keys(value):
            continue
        if mask not in copies:  # placed before its first reader: the mask may be a placeholder
            with gm.graph.inserting_before(node):
                copies[mask] = gm.graph.call_method("contiguous", (mask,))
            copies[mask].meta["example_value"] = value.contiguous()  # computed in the value's own fake mode
        if in_kwargs:
            node.kwargs = {**node.kwargs, "attn_mask": copies[mask]}
        else:
            node.args = (*node.args[:3], copies[mask], *node.args[4:])
    if copies:
        gm.graph.lint()
        gm.recompile()
    return bool(copies)
