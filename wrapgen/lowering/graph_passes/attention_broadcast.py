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

import dataclasses
from collections.abc import Sequence

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, graph_module

aten = torch.ops.aten

_ATEN_ATTENTION = (aten.scaled_dot_product_attention.default,)
_TRACED_ATTENTION = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)


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


def _gqa(node: torch.fx.Node) -> bool:
    return bool(node.kwargs.get("enable_gqa", False))


def _expand(graph: torch.fx.Graph, node: torch.fx.Node, source: torch.fx.Node, sizes: Sequence[int],
            meta_key: str, aten_graph: bool) -> torch.fx.Node:
    value = source.meta[meta_key]
    with graph.inserting_before(node):
        if aten_graph:
            expanded = graph.call_function(aten.expand.default, (source, list(sizes)))
        else:
            expanded = graph.call_method("expand", (source, *sizes))
    expanded.meta[meta_key] = value.expand(*sizes)  # a view: a fake value stays in its own mode
    return expanded


def _rewrite(graph: torch.fx.Graph, targets: tuple, meta_key: str, aten_graph: bool) -> bool:
    """Expand the broadcast key/value of every attention call in `graph`; True when one changed."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in targets or len(node.args) < 3 or _gqa(node):
            continue
        if not all(isinstance(a, torch.fx.Node) for a in node.args[:3]):
            continue
        query, key, value = node.args[:3]
        args = list(node.args)
        for position, source in ((1, key), (2, value)):
            sizes = broadcast_sizes(query.meta.get(meta_key), source.meta.get(meta_key))  # type: ignore[union-attr]
            if sizes is not None:
                args[position] = _expand(graph, node, source, sizes, meta_key, aten_graph)  # type: ignore[arg-type]
        if args != list(node.args):
            node.args = tuple(args)
            changed = True
    return changed


def _has_broadcast_attention(graph: torch.fx.Graph, targets: tuple, meta_key: str) -> bool:
    for node in graph.nodes:
        if node.op == "call_function" and node.target in targets and len(node.args) >= 3 and not _gqa(node):
            query, key, value = (a.meta.get(meta_key) if isinstance(a, torch.fx.Node) else None for a in node.args[:3])
            if broadcast_sizes(query, key) is not None or broadcast_sizes(query, value) is not None:
                return True
    return False


def expand_broadcast_attention(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with broadcast keys and values of its SDPA calls expanded (on a copy of the
    graph: the caller's graph module is never changed), or `captured` itself."""
    gm = captured.graph_module
    if not _has_broadcast_attention(gm.graph, _ATEN_ATTENTION, "val"):
        return captured
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    _rewrite(graph, _ATEN_ATTENTION, "val", aten_graph=True)
    graph.lint()
    return dataclasses.replace(captured, graph_module=graph_module(gm, graph))


def expand_traced_attention(gm: torch.fx.GraphModule) -> bool:
    """Rewrite dynamo's graph in place; True when an attention call changed."""
    if not _has_broadcast_attention(gm.graph, _TRACED_ATTENTION, "example_value"):
        return False
    _rewrite(gm.graph, _TRACED_ATTENTION, "example_value", aten_graph=False)
    gm.graph.lint()
    gm.recompile()
    return True
