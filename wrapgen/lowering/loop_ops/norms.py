"""Normalizations over channels as loop bodies: inference batch norm is a per-channel affine map,
so it fuses with the convolution's consumers (ReLU, the residual add) instead of being a library
call of its own; group norm is two reductions per (sample, group) and a pointwise normalization
that fuses with what reads it. (Layer norm is in `reductions`; RMS norm reaches us decomposed
into pow / mean / rsqrt / mul.)"""

from __future__ import annotations

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, fake, out_fake, register, zero
from wrapgen.lowering.loop_ops.reductions import two_pass_variance

# Devices whose group norm is generated. On the CPU ATen's kernel stays: four PoolFormer blocks
# (8 x 64 x 28 x 28, fp32, 2 cores) took 37 ms per call with it and 64 ms with the C++ kernels.
GROUP_NORM_DEVICES = frozenset({"cuda"})


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


def _group_norm_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    groups = arg(node, 6, "group")
    return (
        isinstance(source, torch.Tensor)
        and source.dtype.is_floating_point
        and source.device.type in GROUP_NORM_DEVICES
        and source.dim() >= 2
        and isinstance(groups, int) and groups > 0
        and isinstance(source.shape[1], int) and source.shape[1] % groups == 0
        and isinstance(arg(node, 7, "eps"), (int, float))
    )


@register("aten::native_group_norm.default", check=_group_norm_check)
def _group_norm(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue, LoopValue]:
    """out[n, c, ...] = (x - mean[n, g]) * rstd[n, g] * weight[c] + bias[c], g = c // (C / groups).

    The input is seen as (N, groups, *reduced) and reduced over all but its first two dimensions
    (a sum, then the sum of squared deviations, in float32 as eager's kernel), so no library call
    reads the activation twice and the normalization fuses into its consumer's kernel. `reduced`
    are the channels of a group and the spatial dimensions, outermost in memory first, so a
    reduction row reads memory in order whether the input is contiguous or channels-last."""
    source = ctx.value(node.args[0])
    groups, eps = int(arg(node, 6, "group")), float(arg(node, 7, "eps"))  # type: ignore[arg-type]
    sizes = source.sizes
    per_group = sympy.Integer(int(sizes[1]) // groups)
    # (logical dimension of the input, size) of each reduced dimension, by decreasing stride
    strides = _read_strides(node.args[0])  # type: ignore[arg-type]
    reduced = sorted([(1, per_group), *((d, sizes[d]) for d in range(2, len(sizes)))], key=lambda e: -strides[e[0]])
    grouped_sizes = (sizes[0], sympy.Integer(groups), *(size for _, size in reduced))
    g = row_vars(len(grouped_sizes))
    index: list[sympy.Expr] = [g[0], sympy.Integer(0), *([sympy.Integer(0)] * (len(sizes) - 2))]
    for position, (d, _) in enumerate(reduced):
        index[d] = g[1] * per_group + g[2 + position] if d == 1 else g[2 + position]
    dtype = compute_dtype(source.dtype)
    grouped = LoopValue(grouped_sizes, cast(source.at(tuple(index)), dtype), dtype)
    dims = tuple(range(2, len(grouped_sizes)))
    count = sympy.Mul(*grouped_sizes[2:])
    mean, squares = two_pass_variance(ctx, grouped, dims, count, "group_norm", split=_split_dim(grouped_sizes))
    variance = Apply("div", (squares.body, cast(IndexValue(count, torch.int64), dtype)), dtype)
    rstd = LoopValue(squares.sizes, Apply("rsqrt", (Apply("add", (variance, Const(eps, dtype)), dtype),), dtype), dtype)
    o = row_vars(len(sizes))
    at_group = (o[0], FloorDiv(o[1], per_group), *([sympy.Integer(0)] * len(dims)))
    out = Apply("mul", (Apply("sub", (cast(source.body, dtype), mean.at(at_group)), dtype), rstd.at(at_group)), dtype)
    weight, bias = node.args[1], node.args[2]
    if weight is not None:
        out = Apply("mul", (out, cast(ctx.value(weight).at((o[1],)), dtype)), dtype)
    if bias is not None:
        out = Apply("add", (out, cast(ctx.value(bias).at((o[1],)), dtype)), dtype)
    # mean and rstd are (N, groups), in the dtypes torch gives them
    s = row_vars(2)
    at_stats = (s[0], s[1], *([sympy.Integer(0)] * len(dims)))
    stats = []
    for value, saved in zip((mean, rstd), out_fake(node)[1:]):
        stats.append(LoopValue((sizes[0], sympy.Integer(groups)), cast(value.at(at_stats), compute_dtype(saved.dtype)), saved.dtype))
    return (LoopValue(sizes, out, source.dtype), *stats)  # type: ignore[return-value]


# A group norm with fewer (sample, group) rows than this, each of at least SPLIT_ELEMENTS, sums in
# two stages: one reduction row per row and index of its outermost reduced dimension, then a short
# one over that dimension. In one stage a GPU would run a handful of programs, each looping over
# hundreds of thousands of elements (PoolFormer: 32 rows of 64 x 56 x 56).
SPLIT_ROWS = 256
SPLIT_ELEMENTS = 4096


def _split_dim(grouped_sizes: tuple) -> int | None:
    try:
        rows = int(grouped_sizes[0]) * int(grouped_sizes[1])
        length = int(sympy.Mul(*grouped_sizes[2:]))
        outer = int(grouped_sizes[2])
    except TypeError:  # symbolic sizes: one stage
        return None
    return 2 if rows < SPLIT_ROWS and length >= SPLIT_ELEMENTS and outer > 1 and len(grouped_sizes) > 3 else None


def _read_strides(source: torch.fx.Node) -> tuple[int, ...]:
    """The strides the input is read at: through layout copies (conv_layout's contiguous copy of a
    channels-last activation is a body here, so its reads are the activation's)."""
    while source.target is torch.ops.aten.clone.default and isinstance(source.args[0], torch.fx.Node):
        source = source.args[0]
    value = fake(source)
    strides = value.stride()  # type: ignore[union-attr]
    if all(isinstance(s, int) for s in strides):
        return tuple(strides)
    return tuple(range(len(strides), 0, -1))  # symbolic strides (never guarded on): the logical order
