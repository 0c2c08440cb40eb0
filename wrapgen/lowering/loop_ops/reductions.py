"""Reductions as loop bodies: sum, prod, mean, amax/amin, argmax/argmin, any/all, and the
decompositions built on them (var, softmax, log_softmax, layer_norm, vector norms).

Lowerings compute in `compute_dtype` (float32 for half precision) and hand `ctx.reduce` the
tensor's own dtype, from which it picks the accumulator (float32 for half sums)."""

from __future__ import annotations

import math

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import (
    LoopContext,
    arg,
    broadcast,
    cast,
    fake,
    op_key,
    operand,
    out_fake,
    register,
    zero,
)


def _dims(node: torch.fx.Node, index: int, name: str) -> tuple[int, ...]:
    rank = fake(node.args[0]).dim()
    dims = arg(node, index, name, None)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(rank, 1) for d in dims})) if rank else ()


def _reduction_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    return isinstance(source, torch.Tensor) and _all_args_ok_lists(node)


def _all_args_ok_lists(node: torch.fx.Node) -> bool:
    return all(not isinstance(a, torch.fx.Node) for a in list(node.args[1:]) + list(node.kwargs.values()))


def _keepdim(node: torch.fx.Node, index: int) -> bool:
    return bool(arg(node, index, "keepdim", False))


def _count(ctx: LoopContext, node: torch.fx.Node, dims: tuple[int, ...]) -> sympy.Expr:
    sizes = ctx.shape(fake(node.args[0]).shape)
    return sympy.Mul(*[sizes[d] for d in dims]) if dims else sympy.Integer(1)


@register("aten::sum.dim_IntList", "aten::sum.default", check=_reduction_check)
def _sum(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    dims = _dims(node, 1, "dim") if op_key(node) != "aten::sum.default" else tuple(range(fake(node.args[0]).dim()))
    keep = _keepdim(node, 2) if op_key(node) != "aten::sum.default" else False
    return ctx.reduce(_converted(ctx, node, out.dtype), dims, keep, "sum", out.dtype, "sum")


def _converted(ctx: LoopContext, node: torch.fx.Node, dtype: torch.dtype) -> LoopValue:
    """The reduced input as a `dtype` tensor, in dtype's compute type (a half input is not
    rounded to a half output dtype before it is accumulated)."""
    value = ctx.value(node.args[0])
    return LoopValue(value.sizes, cast(value.body, compute_dtype(dtype)), dtype)


@register("aten::prod.dim_int", "aten::prod.default", check=_reduction_check)
def _prod(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    default = op_key(node) == "aten::prod.default"
    dims = tuple(range(fake(node.args[0]).dim())) if default else _dims(node, 1, "dim")
    return ctx.reduce(_converted(ctx, node, out.dtype), dims, False if default else _keepdim(node, 2), "prod", out.dtype, "prod")


@register("aten::mean.dim", "aten::mean.default", check=lambda n: _reduction_check(n) and out_fake(n).dtype.is_floating_point)
def _mean(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    default = op_key(node) == "aten::mean.default"
    dims = tuple(range(fake(node.args[0]).dim())) if default else _dims(node, 1, "dim")
    total = ctx.reduce(_converted(ctx, node, out.dtype), dims, False if default else _keepdim(node, 2), "sum", out.dtype, "mean")
    compute = compute_dtype(out.dtype)
    count = cast(IndexValue(_count(ctx, node, dims), torch.int64), compute)
    return LoopValue(total.sizes, Apply("div", (total.body, count), compute), out.dtype)


@register("aten::amax.default", "aten::amin.default", "aten::max.default", "aten::min.default", check=_reduction_check)
def _amax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    name = node.target._schema.name
    whole = name in ("aten::max", "aten::min")
    dims = tuple(range(fake(node.args[0]).dim())) if whole else _dims(node, 1, "dim")
    kind = "max" if name in ("aten::amax", "aten::max") else "min"
    return ctx.reduce(ctx.value(node.args[0]), dims, False if whole else _keepdim(node, 2), kind, out.dtype, kind)


def _arg_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    return _reduction_check(node) and source.dtype != torch.bool and source.dim() > 0 and source.numel() != 0


@register("aten::argmax.default", "aten::argmin.default", check=_arg_check)
def _argmax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """The index of the first largest (smallest) element; NaN counts as largest (and smallest)."""
    dim = arg(node, 1, "dim")
    whole = dim is None
    dims = tuple(range(fake(node.args[0]).dim())) if whole else _dims(node, 1, "dim")
    kind = "argmax" if node.target._schema.name == "aten::argmax" else "argmin"
    return ctx.reduce(ctx.value(node.args[0]), dims, _keepdim(node, 2), kind, torch.int64, kind)


@register("aten::any.dim", "aten::any.dims", "aten::any.default", "aten::all.dim", "aten::all.dims", "aten::all.default", check=_reduction_check)
def _any(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    whole = op_key(node).endswith(".default")
    dims = tuple(range(fake(node.args[0]).dim())) if whole else _dims(node, 1, "dim")
    value = ctx.value(node.args[0])
    value = LoopValue(value.sizes, cast(value.body, torch.bool), torch.bool)
    kind = "any" if node.target._schema.name == "aten::any" else "all"
    result = ctx.reduce(value, dims, False if whole else _keepdim(node, 2), kind, torch.bool, kind)
    return LoopValue(result.sizes, cast(result.body, out.dtype), out.dtype)


def two_pass_variance(ctx: LoopContext, value: LoopValue, dims: tuple[int, ...], count: sympy.Expr, origin: str,
                      split: int | None = None) -> tuple[LoopValue, LoopValue]:
    """(mean, sum of squared deviations), both with keepdim=True, computed in compute_dtype.
    `split` (one of `dims`): each sum in two stages, every other dimension of `dims` first."""
    dtype, compute = value.dtype, compute_dtype(value.dtype)
    x = cast(value.body, compute)
    total = _sum(ctx, LoopValue(value.sizes, x, dtype), dims, split, origin)
    n = cast(IndexValue(count, torch.int64), compute)
    mean = LoopValue(total.sizes, Apply("div", (total.body, n), compute), dtype)
    deviation = Apply("sub", (x, broadcast(mean, value.sizes)), compute)
    squares = LoopValue(value.sizes, Apply("mul", (deviation, deviation), compute), dtype)
    return mean, _sum(ctx, squares, dims, split, origin)


def _sum(ctx: LoopContext, value: LoopValue, dims: tuple[int, ...], split: int | None, origin: str) -> LoopValue:
    if split is None:
        return ctx.reduce(value, dims, True, "sum", value.dtype, origin)
    compute = compute_dtype(value.dtype)  # the partial sums are kept unrounded
    partial = ctx.reduce(LoopValue(value.sizes, value.body, compute), tuple(d for d in dims if d != split), True,
                         "sum", compute, origin)
    total = ctx.reduce(partial, (split,), True, "sum", compute, origin)
    return LoopValue(total.sizes, total.body, value.dtype)


def _var_check(node: torch.fx.Node) -> bool:
    correction = node.kwargs.get("correction", 1)
    return _reduction_check(node) and out_fake(node).dtype.is_floating_point and isinstance(correction, (int, float, type(None)))


@register("aten::var.correction", check=_var_check)
def _var(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    return _var_and_mean(ctx, node, out_fake(node).dtype)[0]


def _var_mean_check(node: torch.fx.Node) -> bool:
    outs = out_fake(node)
    correction = node.kwargs.get("correction", 1)
    return (_reduction_check(node) and all(o.dtype.is_floating_point for o in outs)
            and isinstance(correction, (int, float, type(None))))


@register("aten::var_mean.correction", check=_var_mean_check)
def _var_mean(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue]:
    """(var, mean) from one sum and one sum of squared deviations (training batch norm's statistics)."""
    return _var_and_mean(ctx, node, out_fake(node)[0].dtype)


def _var_and_mean(ctx: LoopContext, node: torch.fx.Node, dtype: torch.dtype) -> tuple[LoopValue, LoopValue]:
    dims = _dims(node, 1, "dim")
    correction = node.kwargs.get("correction")
    correction = 1 if correction is None else correction
    count = _count(ctx, node, dims)
    value = ctx.value(node.args[0])
    mean, squares = two_pass_variance(ctx, value, dims, count, "var")
    compute = compute_dtype(dtype)
    denominator = Apply("sub", (cast(IndexValue(count, torch.int64), compute), Const(float(correction), compute)), compute)
    denominator = Apply("clamp_min", (denominator, Const(0.0, compute)), compute)
    var = LoopValue(squares.sizes, Apply("div", (cast(squares.body, compute), denominator), compute), dtype)
    mean = LoopValue(mean.sizes, mean.body, dtype)
    if node.kwargs.get("keepdim", False):
        return var, mean
    kept = tuple(s for d, s in enumerate(var.sizes) if d not in dims)
    index = [sympy.Integer(0)] * len(var.sizes)
    outer = iter(row_vars(len(kept)))
    for d in range(len(var.sizes)):
        if d not in dims:
            index[d] = next(outer)
    return LoopValue(kept, var.at(tuple(index)), dtype), LoopValue(kept, mean.at(tuple(index)), dtype)


def _softmax_check(node: torch.fx.Node) -> bool:
    return out_fake(node).dtype == fake(node.args[0]).dtype and out_fake(node).dtype.is_floating_point


def _softmax_parts(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, Body, Body]:
    value = ctx.value(node.args[0])
    dims = _dims(node, 1, "dim")
    dtype, compute = value.dtype, compute_dtype(value.dtype)
    x = cast(value.body, compute)
    peak = ctx.reduce(LoopValue(value.sizes, x, dtype), dims, True, "max", dtype, "softmax")
    shifted = Apply("sub", (x, broadcast(peak, value.sizes)), compute)
    exps = LoopValue(value.sizes, Apply("exp", (shifted,), compute), dtype)
    total = ctx.reduce(exps, dims, True, "sum", dtype, "softmax")
    return value, shifted, broadcast(total, value.sizes)


@register("aten::_softmax.default", check=_softmax_check)
def _softmax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    value, shifted, total = _softmax_parts(ctx, node)
    dtype = shifted.dtype
    return LoopValue(value.sizes, Apply("div", (Apply("exp", (shifted,), dtype), total), dtype), value.dtype)


@register("aten::_log_softmax.default", check=_softmax_check)
def _log_softmax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    value, shifted, total = _softmax_parts(ctx, node)
    dtype = shifted.dtype
    return LoopValue(value.sizes, Apply("sub", (shifted, Apply("log", (total,), dtype)), dtype), value.dtype)


def _layer_norm_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    return (
        isinstance(source, torch.Tensor)
        and source.dtype.is_floating_point
        and all(isinstance(a, (torch.fx.Node, type(None))) for a in node.args[2:4])
        and isinstance(node.args[4], float)
    )


@register("aten::native_layer_norm.default", check=_layer_norm_check)
def _layer_norm(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue, LoopValue]:
    value = ctx.value(node.args[0])
    rank, normalized = len(value.sizes), len(node.args[1])
    dims = tuple(range(rank - normalized, rank))
    dtype = compute_dtype(value.dtype)
    count = sympy.Mul(*[value.sizes[d] for d in dims])
    mean, squares = two_pass_variance(ctx, value, dims, count, "layer_norm")
    n = cast(IndexValue(count, torch.int64), dtype)
    var = Apply("div", (squares.body, n), dtype)
    rstd = Apply("rsqrt", (Apply("add", (var, Const(float(node.args[4]), dtype)), dtype),), dtype)
    out = Apply("mul", (Apply("sub", (cast(value.body, dtype), broadcast(mean, value.sizes)), dtype), broadcast(
        LoopValue(squares.sizes, rstd, dtype), value.sizes)), dtype)
    weight, bias = node.args[2], node.args[3]
    if weight is not None:
        out = Apply("mul", (out, operand(ctx, weight, value.sizes, dtype)), dtype)
    if bias is not None:
        out = Apply("add", (out, operand(ctx, bias, value.sizes, dtype)), dtype)
    # mean and rstd have the dtypes torch gives them (the input's on CPU, float32 on CUDA)
    mean_dtype, rstd_dtype = (f.dtype for f in out_fake(node)[1:])
    return (LoopValue(value.sizes, out, value.dtype), LoopValue(mean.sizes, mean.body, mean_dtype),
            LoopValue(squares.sizes, rstd, rstd_dtype))


BASIC_NORM_ORDERS = (0, 1, 2, math.inf, -math.inf)  # other orders need pow (kernel_lowering may exclude them)


def norm_order(node: torch.fx.Node) -> object:
    if op_key(node) == "aten::dist.default":
        return arg(node, 2, "p", 2)
    return arg(node, 1, "ord", 2)


def _vector_norm_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    order = norm_order(node)
    tensors = 2 if op_key(node) == "aten::dist.default" else 1
    if any(isinstance(a, torch.fx.Node) for a in list(node.args[tensors:]) + list(node.kwargs.values())):
        return False
    return (out_fake(node).dtype.is_floating_point and isinstance(source, torch.Tensor)
            and source.dtype.is_floating_point and isinstance(order, (int, float)) and not isinstance(order, bool)
            and not (order in (math.inf, -math.inf) and source.numel() == 0))


@register("aten::linalg_vector_norm.default", "aten::dist.default", check=_vector_norm_check)
def _vector_norm(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """ord 2: sqrt of the sum of squares; 1: sum of |x|; +-inf: max / min of |x|; 0: count of
    nonzeros; p: (sum |x|^p)^(1/p). `dist(a, b, p)` is the norm of a - b over every dim."""
    out = out_fake(node)
    dtype = compute_dtype(out.dtype)
    order = norm_order(node)
    if op_key(node) == "aten::dist.default":
        sizes = ctx.shape(torch.broadcast_shapes(fake(node.args[0]).shape, fake(node.args[1]).shape))
        x = Apply("sub", (operand(ctx, node.args[0], sizes, dtype), operand(ctx, node.args[1], sizes, dtype)), dtype)
        dims, keep = tuple(range(len(sizes))), False
    else:
        source = ctx.value(node.args[0])
        sizes, x = source.sizes, cast(source.body, dtype)
        rank = len(sizes)
        dims = arg(node, 2, "dim", None)
        if rank == 0:  # dim 0 / -1 of a 0-dim tensor: the norm of its one element
            dims = ()
        else:
            dims = tuple(range(rank)) if not dims else tuple(d % rank for d in ((dims,) if isinstance(dims, int) else dims))
        keep = bool(arg(node, 3, "keepdim", False))
    magnitude = Apply("abs", (x,), dtype)

    def total(body: Body, kind: str = "sum") -> LoopValue:
        return ctx.reduce(LoopValue(sizes, body, out.dtype), dims, keep, kind, out.dtype, "vector_norm")

    if order == 2:
        squares = total(Apply("mul", (x, x), dtype))
        return LoopValue(squares.sizes, Apply("sqrt", (squares.body,), dtype), out.dtype)
    if order == 0:
        return total(cast(Apply("ne", (x, zero(dtype)), torch.bool), dtype))
    if order == 1:
        return total(magnitude)
    if order in (math.inf, -math.inf):
        return total(magnitude, "max" if order > 0 else "min")
    powers = total(Apply("pow", (magnitude, Const(float(order), dtype)), dtype))
    return LoopValue(powers.sizes, Apply("pow", (powers.body, Const(1.0 / float(order), dtype)), dtype), out.dtype)
