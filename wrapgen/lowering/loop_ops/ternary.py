"""The pointwise ops of three tensors that optimizers are built from: `addcmul`, `addcdiv` and
`lerp` (Adam's moments, its update, an EMA), in eager's own formulas so a fused step matches an
eager step to float rounding."""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.loop_ir import Apply, Const, LoopValue, compute_dtype
from wrapgen.lowering.loop_ops.common import LoopContext, all_args_ok, arg, convert_scalar, operand, out_fake, register


def _float_check(node: torch.fx.Node) -> bool:
    return out_fake(node).dtype.is_floating_point and all_args_ok(node)


@register("aten::addcmul.default", "aten::addcdiv.default", check=_float_check)
def _addc(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """self + value * t1 * t2 (addcmul) or self + value * t1 / t2 (addcdiv)."""
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    base, t1, t2 = (operand(ctx, a, sizes, dtype) for a in node.args[:3])
    value = arg(node, 3, "value", 1)
    scaled = t1 if value == 1 else Apply("mul", (operand(ctx, value, sizes, dtype), t1), dtype)
    op = "mul" if node.target._schema.name == "aten::addcmul" else "div"
    return LoopValue(sizes, Apply("add", (base, Apply(op, (scaled, t2), dtype)), dtype), out.dtype)


@register("aten::lerp.Scalar", "aten::lerp.Tensor", check=_float_check)
def _lerp(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """self + w * (end - self) for |w| < 0.5, else end - (end - self) * (1 - w): eager's
    formula, exact at both ends."""
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    start, end = operand(ctx, node.args[0], sizes, dtype), operand(ctx, node.args[1], sizes, dtype)
    weight = node.args[2]
    diff = Apply("sub", (end, start), dtype)
    w = operand(ctx, weight, sizes, dtype)
    low = Apply("add", (start, Apply("mul", (w, diff), dtype)), dtype)
    one_minus = Apply("sub", (Const(convert_scalar(1, dtype), dtype), w), dtype)
    high = Apply("sub", (end, Apply("mul", (diff, one_minus), dtype)), dtype)
    if not isinstance(weight, torch.fx.Node):
        return LoopValue(sizes, low if abs(float(weight)) < 0.5 else high, out.dtype)
    small = Apply("lt", (Apply("abs", (w,), dtype), Const(convert_scalar(0.5, dtype), dtype)), torch.bool)
    return LoopValue(sizes, Apply("where", (small, low, high), dtype), out.dtype)
