"""Normalizations with fixed statistics as loop bodies: inference batch norm is a per-channel
affine map, so it fuses with the convolution's consumers (ReLU, the residual add) instead of
being a library call of its own. (Layer norm, which computes its statistics, is in
`reductions`; RMS norm reaches us decomposed into pow / mean / rsqrt / mul.)"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Apply, Body, Const, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, fake, out_fake, register, zero


def _batch_norm_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    stats = [fake(a) for a in node.args[1:5]]
    return (
        isinstance(source, torch.Tensor)
        and source.dtype.is_floating_point
        and source.dim() >= 2
        and all(s is None or (isinstance(s, torch.Tensor) and s.dim() == 1) for s in stats)
        and all(isinstance(fake(a), torch.Tensor) for a in node.args[3:5])
        and isinstance(arg(node, 6, "eps"), (int, float))
    )


@register("aten::_native_batch_norm_legit_no_training.default", check=_batch_norm_check)
def _batch_norm(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue, LoopValue]:
    """out = x * a[c] + b[c] with a = weight / sqrt(running_var + eps) and b = bias - mean * a
    (as eager's CPU kernel folds it), c the channel (dim 1), in float32 for half inputs. The
    op's second and third results (the saved mean and inverse std) are empty in inference, as
    eager returns them."""
    source = ctx.value(node.args[0])
    dtype = compute_dtype(source.dtype)
    channel = row_vars(len(source.sizes))[1]

    def per_channel(arg: object) -> Body | None:
        return None if arg is None else cast(ctx.value(arg).at((channel,)), dtype)

    weight, bias, mean, var = (per_channel(a) for a in node.args[1:5])
    eps = Const(float(arg(node, 6, "eps")), dtype)
    scale: Body = Apply("rsqrt", (Apply("add", (var, eps), dtype),), dtype)  # type: ignore[arg-type]
    if weight is not None:
        scale = Apply("mul", (scale, weight), dtype)
    shift: Body = Apply("neg", (Apply("mul", (mean, scale), dtype),), dtype)  # type: ignore[arg-type]
    if bias is not None:
        shift = Apply("add", (shift, bias), dtype)
    body = Apply("add", (Apply("mul", (cast(source.body, dtype), scale), dtype), shift), dtype)
    empties = []
    for saved in out_fake(node)[1:]:
        sizes = tuple(sympy.Integer(int(s)) for s in saved.shape)
        empties.append(LoopValue(sizes, zero(saved.dtype), saved.dtype))
    return (LoopValue(source.sizes, body, source.dtype), *empties)  # type: ignore[return-value]
