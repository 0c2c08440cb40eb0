"""A batched product whose second operand is one matrix broadcast over the batch, as one product.

`nn.MultiheadAttention` (torchvision's ViT) transposes its batch-first input to sequence-first
and projects it with `linear`; that view does not flatten, so `matmul` traces `bmm` against the
weight expanded over the sequence: on ViT-B/16, 197 products of [16 x 768] by the same
[768 x 2304] weight per projection, each too short to keep the matrix units busy. The batch and
row dims of the first operand fold into one row dim in one order or the other (the view was made
by a transpose), so one `mm` of the folded rows by the weight computes every product at once:

    bmm(a, w.expand(B, K, N))  ==  mm(a folded to [B*M, K], w) unfolded to [B, M, N]

When the rows fold batch-major the result is the bmm's own contiguous layout; folded row-major
it is a transpose of it, copied back to contiguous (a copy that fuses into the kernel reading
it), so every node after keeps the layout it was traced with.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, fake_value, rewrite_calls

aten = torch.ops.aten


def fold_broadcast_bmm(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each `bmm` against a batch-broadcast matrix made one `mm` (on a copy of
    the graph), or `captured` itself when there is none."""
    return rewrite_calls(captured, aten.bmm.default, _foldable, _rewrite)


def _static(value: object) -> tuple[list[int], list[int]] | None:
    if not isinstance(value, torch.Tensor) or value.dim() != 3 or value.layout != torch.strided:
        return None
    sizes, strides = list(value.shape), list(value.stride())
    return (sizes, strides) if all(isinstance(v, int) for v in (*sizes, *strides)) else None


def _foldable(node: torch.fx.Node) -> str | None:
    """How `bmm(a, b)`'s first operand folds when `b` is one matrix broadcast over a batch of
    more than one: "batch" (batch-major rows: a's batch stride spans its rows), "rows" (row-major:
    a's row stride spans the batch), or None (no broadcast, or rows that do not fold)."""
    a, b = (arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None for arg in node.args[:2])
    a_static, b_static = _static(a), _static(b)
    if a_static is None or b_static is None:
        return None
    (batch, rows, _), (batch_stride, row_stride, _) = a_static
    if batch < 2 or rows < 1 or b_static[1][0] != 0:
        return None
    if rows == 1 or batch_stride == rows * row_stride:
        return "batch"
    if row_stride == batch * batch_stride:
        return "rows"
    return None


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, order: object, fake_mode) -> bool:
    """Put the one-product form in place of `node`; False (and the graph as it was) when fake
    tensors do not give it exactly the bmm's result layout."""
    a, b = node.args[0], node.args[1]
    expected = node.meta["val"]
    batch, rows, depth = a.meta["val"].shape
    columns = b.meta["val"].shape[2]
    added: list[torch.fx.Node] = []

    def call(target: object, *args: object, **kwargs: object) -> torch.fx.Node:
        new = graph.create_node("call_function", target, args, kwargs, name=f"{node.name}_folded")
        added.append(new)
        new.meta["val"] = fake_value(new, fake_mode)
        return new

    with graph.inserting_before(node):
        try:
            matrix = call(aten.select.int, b, 0, 0)
            if order == "batch":
                product = call(aten.mm.default, call(aten.view.default, a, [batch * rows, depth]), matrix)
                result = call(aten.view.default, product, [batch, rows, columns])
            else:
                by_rows = call(aten.permute.default, a, [1, 0, 2])
                product = call(aten.mm.default, call(aten.view.default, by_rows, [rows * batch, depth]), matrix)
                unfolded = call(aten.permute.default, call(aten.view.default, product, [rows, batch, columns]), [1, 0, 2])
                result = call(aten.clone.default, unfolded, memory_format=torch.contiguous_format)
        except Exception:  # noqa: BLE001 - a view fake tensors refuse: keep the bmm
            result = None
    if result is None or tuple(result.meta["val"].stride()) != tuple(expected.stride()):
        for new in reversed(added):
            graph.erase_node(new)
        return False
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True
