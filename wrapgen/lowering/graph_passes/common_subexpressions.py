"""Common subexpressions of the ATen graph computed once.

aot_autograd removes them from the graphs it partitions for training, not from inference
graphs. A decoder's graph repeats per layer what depends only on the step: the CPU attention
decomposition turns the one boolean causal mask into an additive float mask once per layer
(`where(mask, 0, -inf)` with its two `scalar_tensor`s), and each layer's KV cache computes
the same write positions. Each repeat is a kernel launch and a buffer.

The elimination is aot_autograd's own (`torch._functorch.compile_utils.fx_graph_cse`): it
leaves random ops and `empty` alone and merges two calls only where no mutation lies between
them. A graph with collectives is left as it is: two identical collectives are two
communications every rank makes, which merging would change.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, with_graph

_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "c10d_functional", "_dtensor")


def eliminate_common_subexpressions(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with repeated pure calls merged (on a copy of the graph), or `captured` itself
    when nothing repeats."""
    from torch._functorch.compile_utils import fx_graph_cse

    graph = captured.graph_module.graph
    if any(_is_collective(node) for node in graph.nodes):
        return captured
    copy = torch.fx.Graph()
    copy.output(copy.graph_copy(graph, {}))  # fx_graph_cse marks the nodes it reads
    merged = fx_graph_cse(copy)
    if len(merged.nodes) == len(graph.nodes):
        return captured
    merged.lint()
    return with_graph(captured, merged)


def _is_collective(node: torch.fx.Node) -> bool:
    target = node.target
    namespace = getattr(target, "namespace", None) or getattr(getattr(target, "_schema", None), "name", "").partition("::")[0]
    return node.op == "call_function" and namespace in _COLLECTIVE_NAMESPACES
