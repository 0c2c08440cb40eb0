"""Clones that only copy, removed from the joint forward-backward graph before it is partitioned.

In a functional graph, a clone at its source's sizes, strides and dtype gives a value no reader
can tell from the source. Left in the joint graph, the partitioner can save both for the
backward: BLOOM's attention keeps its softmax for the softmax backward and the softmax's clone
(made by `.to()` / dropout in eval) for the value product's, so each layer saved its attention
probabilities twice: a 12-layer bf16 step peaked 555 MiB above Inductor's, 12 x the 48 MiB of one
layer's probabilities. Removed, both backward readers take the one saved softmax.

A clone stays where removing it would make a graph output share storage with an input or with
another output (the caller could see one change through the other), and the pass does nothing
on a graph with an op that writes its argument.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils import _pytree as pytree

aten = torch.ops.aten


def _value(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _storage(node: object) -> int | None:
    """An identity of the node's (fake) storage: views share it."""
    value = _value(node)
    if value is None or not torch._C._has_storage(value):
        return None
    return value.untyped_storage()._cdata


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = _value(a), _value(b)
    if va is None or vb is None or va.layout != torch.strided or vb.layout != torch.strided:
        return False
    return (va.dtype == vb.dtype and va.device == vb.device and va.is_conj() == vb.is_conj()
            and va.is_neg() == vb.is_neg() and va.dim() == vb.dim()
            and all(statically_known_true(x == y) for x, y in zip(va.shape, vb.shape))
            and all(statically_known_true(x == y) for x, y in zip(va.stride(), vb.stride())))


def _writes_an_argument(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def remove_copy_only_clones(graph: torch.fx.Graph) -> int:
    """Replace each copy-only clone by its source, in place; the number removed."""
    if any(_writes_an_argument(node) for node in graph.nodes):
        return 0
    inputs = {_storage(n) for n in graph.nodes if n.op == "placeholder"} - {None}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outputs = {_storage(n) for n in pytree.tree_leaves(output.args) if isinstance(n, torch.fx.Node)} - {None}
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.clone.default:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or not _same_layout(node, source):
            continue
        if _storage(node) in outputs:
            if _storage(source) in inputs or _storage(source) in outputs:
                continue  # the output would alias an input or another output
            outputs.add(_storage(source))  # its source is an output now
        node.replace_all_uses_with(source)
        graph.erase_node(node)
        removed += 1
    return removed
