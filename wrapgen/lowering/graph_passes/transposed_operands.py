"""Copies made only to feed a matrix product written in their source's order, not transposed.

`q @ k.transpose(-1, -2)` on a permuted `k` (eager attention: GPT-J, Swin, BEiT) decomposes into a
contiguous `clone` of the transposed view, reshaped to 3-d, then `bmm`. The clone's output runs
along what was the source's second-to-last dimension, so a generated kernel writing it in order
reads its source a full row apart per element: on an H200, GPT-J's rotary key copy (3 M elements)
took 81 us where a copy in order takes under 10. A library product reads a transposed operand as
well as a row-major one (cuBLAS, MKL and the generated matmul take the strides), so the copy may be
made in its source's order instead: `clone(x.transpose(-1, -2)).transpose(-1, -2)`, same values,
the last two dimensions' strides swapped. The rewrite applies only when every reader of the copy is
a view the swapped strides still allow, read only by `mm`/`bmm`, so no other op sees the layout.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, rewrite_nodes

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_PRODUCTS = (aten.mm.default, aten.bmm.default)


def _value(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _transposed_copy(node: torch.fx.Node) -> bool:
    """A contiguous clone whose source is innermost along its second-to-last dimension."""
    if node.op != "call_function" or node.target != aten.clone.default:
        return False
    if node.kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format:
        return False
    source, out = _value(node.args[0]), _value(node)
    if source is None or out is None or source.dim() < 2 or any(not isinstance(s, int) for s in source.shape):
        return False
    rows, columns = source.shape[-2], source.shape[-1]
    return rows > 1 and columns > 1 and source.stride(-2) == 1 and source.stride(-1) != 1 and out.is_contiguous()


def _product_operand(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return (user.op == "call_function" and user.target in _PRODUCTS and not user.kwargs
            and node in user.args[:2] and user.args.count(node) == 1)


def _swapped_views(node: torch.fx.Node, swapped: torch.Tensor) -> dict[torch.fx.Node, torch.Tensor] | None:
    """The new values of the views reading `node` once it holds `swapped`, when every reader is a
    product operand or a view (still a view at the swapped strides) read only by products."""
    values: dict[torch.fx.Node, torch.Tensor] = {}
    for user in node.users:
        if _product_operand(node, user):
            continue
        if user.op != "call_function" or user.target not in _VIEWS or user.args[0] is not node or user.kwargs:
            return None
        if not user.users or not all(_product_operand(user, reader) for reader in user.users):
            return None
        size = list(user.args[1])  # type: ignore[arg-type]
        try:
            values[user] = aten.view.default(swapped, size)  # raises where the strides forbid a view
        except (RuntimeError, ValueError):  # C++ meta kernels raise the one, torch's Python references the other
            return None
    return values


def _plan(node: torch.fx.Node) -> tuple[torch.Tensor, dict[torch.fx.Node, torch.Tensor]] | None:
    """For a transposed copy only products read: the copy made in its source's order, and the new
    values of the views reading it; None for any other node."""
    if not _transposed_copy(node):
        return None
    in_order = aten.clone.default(aten.transpose.int(_value(node.args[0]), -1, -2),
                                  memory_format=torch.contiguous_format)
    views = _swapped_views(node, aten.transpose.int(in_order, -1, -2))
    return None if views is None else (in_order, views)


def _rewrite(graph: torch.fx.Graph, clone: torch.fx.Node,
             plan: tuple[torch.Tensor, dict[torch.fx.Node, torch.Tensor]], _fake_mode: object) -> bool:
    in_order, views = plan
    source = clone.args[0]
    assert isinstance(source, torch.fx.Node)
    with graph.inserting_before(clone):
        turned = graph.call_function(aten.transpose.int, (source, -1, -2))
        copied = graph.call_function(aten.clone.default, (turned,), {"memory_format": torch.contiguous_format})
        back = graph.call_function(aten.transpose.int, (copied, -1, -2))
    turned.meta["val"] = aten.transpose.int(_value(source), -1, -2)
    copied.meta["val"], back.meta["val"] = in_order, aten.transpose.int(in_order, -1, -2)
    for view, value in views.items():
        view.meta["val"] = value
    clone.replace_all_uses_with(back)
    graph.erase_node(clone)
    return True


def copy_matmul_operands_in_order(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with transposed copies feeding products made in their source's order (on a copy of
    the graph: the caller's graph module is never changed), or `captured` itself."""
    return rewrite_nodes(captured, _plan, _rewrite, target=aten.clone.default)
