"""Boolean attention masks as additive float masks, made once per mask by a generated kernel.

Given a boolean `attn_mask`, `scaled_dot_product_attention` converts it on every call
(`zeros_like(mask, dtype=q.dtype).masked_fill_(~mask, -inf)`: two full-size passes inside
the library call, for every layer that shares the mask). Rewriting the graph to pass that
float mask instead makes the conversion an ordinary pointwise op: it fuses with the kernel
that builds the mask (causal and padding masks are comparisons and `&`s) and runs once for
all layers. The values SDPA sees are the same, so results are too.
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode

from wrapgen.lowering.capture import CapturedGraph, with_graph

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
    return (mask, position) if isinstance(value, torch.Tensor) and value.dtype == torch.bool else (None, None)


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
    """`captured` with every boolean SDPA mask replaced by its additive float form (on a copy
    of the graph: the caller's graph module is never changed), or `captured` itself."""
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
            converted[key] = _float_mask(graph, mask, dtype)
        if "attn_mask" in node.kwargs:
            node.kwargs = {**node.kwargs, "attn_mask": converted[key]}
        else:
            node.args = (*node.args[:position], converted[key], *node.args[position + 1:])  # type: ignore[misc]
    graph.lint()
    return with_graph(captured, graph)
