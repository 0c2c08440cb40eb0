"""Writes at data-dependent positions that are still pointwise: `full_like` (the zeros a backward
scatters into) and `scatter` when each output element is hit by at most a few index entries.

A cross-entropy backward is `scatter(full_like(logp, 0), 1, target[:, None], -1)`: as library
calls that is a full-size fill, a full-size copy and the scatter, each a pass over the
logits-sized tensor. As a loop body it is `where(column == target[row], -1, 0)`, which fuses
into the log_softmax backward that reads it, so it costs no pass of its own (Inductor's
joint-graph pass rewrites the same pattern).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Apply, Body, IndexMin, IndexValue, Indirect, Load, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import (
    SUPPORTED_DTYPES,
    LoopContext,
    cast,
    element_operand,
    fake,
    is_unbacked,
    operand,
    out_fake,
    register,
)

# scatter.value with up to this many index entries per output line (index.size(dim)) becomes an
# unrolled comparison chain; more stay a library call (its cost grows with the count).
SCATTER_UNROLL_LIMIT = 8


def _full_like_check(node: torch.fx.Node) -> bool:
    source, out = fake(node.args[0]), out_fake(node)
    value = node.args[1] if len(node.args) > 1 else None
    return (isinstance(source, torch.Tensor) and out.layout == torch.strided and source.device == out.device
            and isinstance(value, (torch.fx.Node, bool, int, float)) and not node.kwargs.get("pin_memory"))


@register("aten::full_like.default", check=_full_like_check)
def _full_like(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """The fill value at every element; only the input's shape is used (the layout torch gives
    the result, memory_format included, is the buffer's if it is stored)."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    value = node.args[1]
    if isinstance(value, torch.fx.Node):
        return LoopValue(sizes, operand(ctx, value, (), out.dtype), out.dtype)
    return LoopValue(sizes, element_operand(ctx, value, (), out.dtype), out.dtype)


def _static(size: object) -> int | None:
    return size if isinstance(size, int) else None


def _scatter_check(node: torch.fx.Node) -> bool:
    """scatter(self, dim, index, value) with a static, short index.size(dim), or
    scatter(self, dim, index, src) with index.size(dim) == 1 (then each output element is
    written at most once, and which write wins is not in question)."""
    source, index, out = fake(node.args[0]), fake(node.args[2]), out_fake(node)
    if not all(isinstance(t, torch.Tensor) for t in (source, index)) or node.kwargs.get("reduce") is not None:
        return False
    if not isinstance(node.args[1], int) or source.dim() == 0 or index.dim() != source.dim():
        return False
    if index.dtype != torch.int64 or source.dtype not in SUPPORTED_DTYPES or out.dtype != source.dtype:
        return False
    if any(is_unbacked(s) for t in (source, index) for s in t.shape) or index.numel() == 0:
        return False
    dim = node.args[1] % source.dim()
    count = _static(index.shape[dim])
    if node.target._overloadname == "value":
        return isinstance(node.args[3], (bool, int, float)) and count is not None and count <= SCATTER_UNROLL_LIMIT
    src = fake(node.args[3])
    return isinstance(src, torch.Tensor) and src.dim() == source.dim() and src.dtype == source.dtype and count == 1


@register("aten::scatter.value", "aten::scatter.src", check=_scatter_check)
def _scatter(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[x] = value where some index entry on x's line along `dim` names x's position, else
    self[x] (positions beyond the index's extent in another dimension keep self's value). Each
    index entry is read through a range-checked gather: one outside [0, self.size(dim)) raises,
    as eager's scatter does."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dim = node.args[1] % len(sizes)
    dtype = compute_dtype(out.dtype)
    xs = row_vars(len(sizes))
    index = _checked_index(ctx, node.args[2], sizes[dim], f"scatter_{node.name}")
    inside: Body | None = None  # the element lies within the index's extent (other dims)
    for d, (extent, size_) in enumerate(zip(index.sizes, sizes)):
        if d != dim and sympy.simplify(sympy.sympify(extent) - size_) != 0:
            within = Apply("lt", (IndexValue(xs[d], torch.int64), IndexValue(sympy.sympify(extent), torch.int64)), torch.bool)
            inside = within if inside is None else Apply("and", (inside, within), torch.bool)
    hit: Body | None = None
    for j in range(int(index.sizes[dim])):
        position = tuple(sympy.Integer(j) if d == dim else _clamped(xs[d], index.sizes[d], sizes[d])
                         for d in range(len(sizes)))
        entry = index.at(position)
        same = Apply("eq", (entry, IndexValue(xs[dim], torch.int64)), torch.bool)
        hit = same if hit is None else Apply("or", (hit, same), torch.bool)
    assert hit is not None
    if inside is not None:
        hit = Apply("and", (inside, hit), torch.bool)
    if node.target._overloadname == "value":
        written = element_operand(ctx, node.args[3], (), out.dtype)
    else:
        src = ctx.value(node.args[3])
        at = tuple(sympy.Integer(0) if d == dim else _clamped(xs[d], src.sizes[d], sizes[d]) for d in range(len(sizes)))
        written = cast(src.at(at), dtype)
    kept = cast(ctx.value(node.args[0]).body, dtype)
    return LoopValue(sizes, Apply("where", (hit, cast(written, dtype), kept), dtype), out.dtype)


def _clamped(x: sympy.Symbol, extent: sympy.Expr, size_: sympy.Expr) -> sympy.Expr:
    """x as a position in a dimension of `extent` <= `size_` (the read of an element outside it
    is discarded: clamp so that it stays inside the buffer)."""
    return x if sympy.simplify(sympy.sympify(extent) - size_) == 0 else IndexMin(x, extent - 1)


def _checked_index(ctx: LoopContext, index_node: torch.fx.Node, size_: sympy.Expr, symbol: str) -> LoopValue:
    """The index tensor copied into a buffer of its own by a load that checks each entry against
    [0, size_) (a gather whose position is the entry itself; out of range, the kernel reports and
    the caller raises). The check runs once per entry, where the copy is computed, not once per
    output element inside the scatter's inner loop, which it would keep from vectorizing."""
    index = ctx.in_memory(index_node)
    entry = index.body
    assert isinstance(entry, Load) and not entry.indirect, entry  # in_memory gives a plain load
    checked = Load(entry.buffer, entry.index, entry.dtype, (Indirect(sympy.Symbol(symbol, integer=True), entry, size_),))
    return ctx.load(ctx.realize(LoopValue(index.sizes, checked, index.dtype), fake(index_node), "scatter_index"))
