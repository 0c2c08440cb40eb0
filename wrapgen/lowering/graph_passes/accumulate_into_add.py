"""`a + index_put(zeros, [index], values, accumulate=True)` as `index_put(a, [index], values, accumulate=True)`.

A model whose output layer shares the embedding's weight (GPT-2's tied `wte`) sums two weight
gradients in its backward: the output layer's, a matrix product, and the embedding's, which core
ATen's decomposition of `embedding_dense_backward` makes by accumulating the output gradient's
rows into a tensor of zeros. So the step writes the zeros, the functional `index_put` copies
them, the rows are accumulated, and the product's gradient is added: four passes over a
[50257 x 768] tensor. Accumulated into the product's gradient, two are left (the copy of it the
functional op makes, and the rows). The sum is the same but for the order of the additions (the
zeros form adds the rows, then the product's gradient), which the library's accumulate does not
fix either.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, fake_value, rewrite_calls

aten = torch.ops.aten
_ZEROS = (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.full.default, aten.full_like.default)


def accumulate_into_add(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each such add made one accumulating `index_put` (on a copy of the
    graph), or `captured` itself when there is none."""
    return rewrite_calls(captured, aten.add.Tensor, _accumulated, _rewrite)


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_zeros(node: object) -> bool:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _ZEROS:
        return False
    if node.target in (aten.full.default, aten.full_like.default):
        fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        return isinstance(fill, (int, float)) and not isinstance(fill, bool) and fill == 0
    return True


def _accumulated(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(the accumulating index_put, the other addend) when `node` adds one into a tensor of the
    same shape, dtype and device, and nothing else reads the index_put or its zeros."""
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    result = _val(node)
    for scattered, other in (node.args, node.args[::-1]):
        if not (isinstance(scattered, torch.fx.Node) and scattered.target is aten.index_put.default):
            continue
        accumulate = scattered.args[3] if len(scattered.args) > 3 else scattered.kwargs.get("accumulate", False)
        if accumulate is not True or len(scattered.users) != 1:
            continue
        zeros = scattered.args[0]
        if not _is_zeros(zeros) or len(zeros.users) != 1:
            continue
        values = [_val(n) for n in (other, scattered)]
        if result is None or any(v is None for v in values):
            continue
        if all((v.shape, v.dtype, v.device) == (result.shape, result.dtype, result.device) for v in values):
            return scattered, other
    return None


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, found: object, fake_mode) -> bool:
    """Put `index_put(other, index, values, True)` in place of the add; False (the graph as it
    was) when its result's layout is not the add's."""
    scattered, other = found  # type: ignore[misc]
    with graph.inserting_before(node):
        new = graph.create_node("call_function", aten.index_put.default,
                                (other, scattered.args[1], scattered.args[2], True), name=f"{node.name}_accumulated")
    try:
        new.meta["val"] = fake_value(new, fake_mode)
    except Exception:  # noqa: BLE001 - fake tensors refuse the call: keep the add
        graph.erase_node(new)
        return False
    if tuple(new.meta["val"].stride()) != tuple(node.meta["val"].stride()):
        graph.erase_node(new)
        return False
    node.replace_all_uses_with(new)
    zeros = scattered.args[0]
    graph.erase_node(node)
    graph.erase_node(scattered)
    graph.erase_node(zeros)
    return True
