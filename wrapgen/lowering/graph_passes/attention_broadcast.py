"""Keys and values that broadcast against the query, expanded before attention.

`scaled_dot_product_attention` accepts a key and value with a size-1 batch or head dimension
(multi-query attention passes one key/value head for all query heads) and broadcasts them in its
math backend. Its fused backends (flash, memory-efficient, the CPU flash kernel) require the
query's sizes, so such a call falls to the math backend: the full S x S score matrix is written,
soft-maxed and read back, several times slower and that much more memory at its peak. Expanding
the key and value to the query's sizes is a view (stride 0 along the broadcast dimension) with
the same values, and the fused backends take it.

The rewrite is done on both graphs wrapgen sees: the ATen graph `wrapgen.compile` lowers, and
dynamo's torch-level graph before aot_autograd traces it, where torch picks the backend (and so
decomposes a broadcast call into the math backend's matmuls) for `torch.compile(backend=
"wrapgen")`. Sizes that are symbolic are left alone: a broadcast dimension is a head count, static
in practice.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, rewrite_nodes

aten = torch.ops.aten

_ATEN_ATTENTION = (aten.scaled_dot_product_attention.default,)
TRACED_ATTENTION = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)


def broadcast_sizes(query: object, other: object) -> list[int] | None:
    """The sizes `other` (a key or value) must be expanded to so its leading dimensions match the
    query's; None when they already match or the two are not a static broadcast of one another."""
    if not isinstance(query, torch.Tensor) or not isinstance(other, torch.Tensor):
        return None
    if query.dim() != other.dim() or query.dim() < 3:
        return None
    sizes = list(other.shape)
    changed = False
    for dim in range(query.dim() - 2):
        want, have = query.shape[dim], other.shape[dim]
        if not isinstance(want, int) or not isinstance(have, int):
            return None
        if have == want:
            continue
        if have != 1:
            return None
        sizes[dim] = want
        changed = True
    return sizes if changed else None


def _broadcast_arguments(node: torch.fx.Node, targets: tuple, meta_key: str) -> dict[int, list[int]] | None:
    """For an attention call whose key or value broadcasts against its query: the sizes each of
    those arguments (by position) must be expanded to; None for any other node."""
    if node.op != "call_function" or node.target not in targets or len(node.args) < 3:
        return None
    if node.kwargs.get("enable_gqa", False) or not all(isinstance(a, torch.fx.Node) for a in node.args[:3]):
        return None
    query = node.args[0].meta.get(meta_key)  # type: ignore[union-attr]
    found = {position: sizes for position in (1, 2)
             if (sizes := broadcast_sizes(query, node.args[position].meta.get(meta_key))) is not None}  # type: ignore[union-attr]
    return found or None


def _expand_arguments(graph: torch.fx.Graph, node: torch.fx.Node, found: dict[int, list[int]], meta_key: str,
                      aten_graph: bool) -> bool:
    args = list(node.args)
    for position, sizes in found.items():
        source = args[position]
        assert isinstance(source, torch.fx.Node)
        with graph.inserting_before(node):
            if aten_graph:
                expanded = graph.call_function(aten.expand.default, (source, sizes))
            else:
                expanded = graph.call_method("expand", (source, *sizes))
        expanded.meta[meta_key] = source.meta[meta_key].expand(*sizes)  # a view: a fake value stays in its mode
        args[position] = expanded
    node.args = tuple(args)
    return True


def expand_broadcast_attention(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with broadcast keys and values of its SDPA calls expanded (on a copy of the
    graph: the caller's graph module is never changed), or `captured` itself."""
    return rewrite_nodes(captured, lambda node: _broadcast_arguments(node, _ATEN_ATTENTION, "val"),
                         lambda graph, node, found, _: _expand_arguments(graph, node, found, "val", aten_graph=True))


def expand_traced_attention(gm: torch.fx.GraphModule) -> bool:
    """Rewrite dynamo's graph in place; True when an attention call changed."""
    calls = [(node, found) for node in gm.graph.nodes
             if (found := _broadcast_arguments(node, TRACED_ATTENTION, "example_value")) is not None]
    for node, found in calls:
        _expand_arguments(gm.graph, node, found, "example_value", aten_graph=False)
    if calls:
        gm.graph.lint()
        gm.recompile()
    return bool(calls)
