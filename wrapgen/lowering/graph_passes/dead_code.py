"""Values nothing reads, removed before lowering.

Captured graphs arrive without dead code, but the rewrites before lowering leave some: a mask or an
index folded into a constant (`constant_masks`, `input_free`) leaves the ops that built it, and
transformers' packed-sequence check (a `cumsum` over positions compared and summed) lost its only
reader that way in GPT-J. Lowered, such ops still become kernels and launches whose results nothing
reads. Ops that write an argument, touch the random generator or have other side effects stay;
an `_assert_tensor_metadata` whose check the traced metadata proves is no side effect (on CUDA
DeBERTa-v2 computed a CPU `sqrt` per layer for such an assert alone).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, with_graph
from wrapgen.lowering.kernel_lowering import holds_statically


def _impure(node: torch.fx.Node) -> bool:
    """What must stay even unread: side effects fx knows of (a mutable schema, asserts), random
    draws, and anything that is not a core ATen op (user Triton kernels, whose higher-order op
    writes its arguments; collectives, which every rank must issue; custom ops)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return node.is_impure()
    if holds_statically(node):
        return False
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return True
    return node.is_impure() or torch.Tag.nondeterministic_seeded in target.tags


def _dead(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and not node.users and not _impure(node)


def remove_dead_code(captured: CapturedGraph) -> CapturedGraph:
    """`captured` without the pure values nothing reads (on a copy of the graph: the caller's graph
    module is never changed), or `captured` itself."""
    gm = captured.graph_module
    if not any(_dead(n) for n in gm.graph.nodes):
        return captured
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in reversed(list(graph.nodes)):  # readers before what they read: a dead chain goes whole
        if _dead(node):
            graph.erase_node(node)
    graph.lint()
    return with_graph(captured, graph)
