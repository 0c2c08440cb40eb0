"""Padding and tiling as index arithmetic: `constant_pad_nd` reads its input at the position
shifted by the low pad and yields the fill value outside it; `repeat` reads its input at the
position modulo the input's size. Both fuse with what feeds and reads them instead of writing
a padded or tiled copy through the library (Swin's window padding, DeBERTa's and BLOOM's
repeated position and ALiBi tables)."""

from __future__ import annotations

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import ModularIndexing

from wrapgen.loop_ir import Apply, Body, Const, IndexMax, IndexMin, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, convert_scalar, fake, out_fake, register


def _static_ints(values: object) -> bool:
    return isinstance(values, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _index(expr: sympy.Expr) -> Body:
    return IndexValue(sympy.sympify(expr), torch.int64)


def _pad_check(node: torch.fx.Node) -> bool:
    source, pad = fake(node.args[0]), node.args[1]
    if not isinstance(source, torch.Tensor) or not _static_ints(pad) or len(pad) % 2 or len(pad) // 2 > source.dim():
        return False
    value = arg(node, 2, "value", 0)
    if not isinstance(value, (int, float, bool)):
        return False
    padded = [source.dim() - 1 - i for i in range(len(pad) // 2)]
    # every padded dimension static and non-empty after cropping: the clamped read stays inside
    return all(isinstance(source.shape[d], int) and source.shape[d] + min(pad[2 * i], 0) + min(pad[2 * i + 1], 0) > 0
               for i, d in enumerate(padded))


@register("aten::constant_pad_nd.default", check=_pad_check)
def _constant_pad_nd(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[x] = input[x - low] where that position lies inside the input, else the fill value.
    The pad list runs from the last dimension backwards (low, high per dimension); a negative
    pad crops. The input is read at the position clamped into its range, so no load leaves it."""
    out = out_fake(node)
    source = ctx.value(node.args[0])
    sizes = ctx.shape(out.shape)
    dtype = compute_dtype(out.dtype)
    pad = node.args[1]
    xs = row_vars(len(sizes))
    index = list(xs)
    inside: list[Body] = []
    for i in range(len(pad) // 2):
        d = len(sizes) - 1 - i
        low, high, length = pad[2 * i], pad[2 * i + 1], source.sizes[d]
        position = xs[d] - low
        if low > 0:
            inside.append(Apply("ge", (_index(position), _index(0)), torch.bool))
            position = IndexMax(position, 0)
        if high > 0:
            inside.append(Apply("lt", (_index(position), _index(length)), torch.bool))
            position = IndexMin(position, length - 1)
        index[d] = position
    body = cast(source.at(tuple(index)), dtype)
    if inside:
        condition = inside[0]
        for more in inside[1:]:
            condition = Apply("and", (condition, more), torch.bool)
        fill = Const(convert_scalar(arg(node, 2, "value", 0), dtype), dtype)
        body = Apply("where", (condition, body, fill), dtype)
    return LoopValue(sizes, body, out.dtype)


def _repeat_check(node: torch.fx.Node) -> bool:
    source, repeats = fake(node.args[0]), node.args[1]
    if not isinstance(source, torch.Tensor) or not _static_ints(repeats) or len(repeats) < source.dim():
        return False
    return all(isinstance(s, int) and s > 0 for s in source.shape) and all(r > 0 for r in repeats)


@register("aten::repeat.default", check=_repeat_check)
def _repeat(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[x] = input[x mod size] over the input's dimensions (the leading new dimensions of a
    repeat longer than the input's rank only tile it)."""
    out = out_fake(node)
    source = ctx.value(node.args[0])
    sizes = ctx.shape(out.shape)
    xs = row_vars(len(sizes))
    lead = len(sizes) - len(source.sizes)
    index = tuple(x if repeats == 1 else ModularIndexing(x, 1, length)
                  for x, length, repeats in zip(xs[lead:], source.sizes, node.args[1][lead:]))
    return LoopValue(sizes, source.at(index), out.dtype)
