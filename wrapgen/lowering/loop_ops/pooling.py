"""Pooling as a window reduction, so a pool fuses with its producer (ResNet's stem ReLU,
PoolFormer's group norm) and consumer instead of being a library call.

Max pooling takes the max over each kernel window (positions in the padding count as -inf).
Only its values are lowered: where the indices output is read (a backward pass's
max_pool2d_with_indices_backward), the op stays a library call. Average pooling sums the window
(padding counts as 0) and divides by the count ATen divides by: the window clipped to the padded
input (`count_include_pad`), or to the input, or `divisor_override`."""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import (
    Apply,
    Body,
    Const,
    IndexMax,
    IndexMin,
    IndexValue,
    LoopValue,
    compute_dtype,
    row_vars,
    substitute,
)
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, fake, out_fake, register, zero
from wrapgen.lowering.loop_ops.recompute import compute_once_before_window


def _pair(value: object, default: object = None) -> tuple[int, int] | None:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value) and len(value) in (1, 2):
        return (value[0], value[-1])
    return None


def _pool_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    if not isinstance(source, torch.Tensor) or source.dim() not in (3, 4) or not source.dtype.is_floating_point:
        return False
    kernel = _pair(arg(node, 1, "kernel_size"))
    params = (kernel, _pair(arg(node, 2, "stride"), kernel), _pair(arg(node, 3, "padding", 0)), _pair(arg(node, 4, "dilation", 1)))
    if any(p is None for p in params) or any(isinstance(s, torch.SymInt) for s in source.shape[-2:]):
        return False
    # the indices are not lowered: every reader must take the values only
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


# In Triton kernels a window of at most this many taps is one pointwise value that combines its
# taps in order, not a reduction: a reduction's block spans the window (9 of 16 lanes busy for
# 3x3) and, over channels-last maps, reads a few channels per tap across a warp. On an H200 a
# PoolFormer pool over 32x64x56x56 bf16 took 296 us as a reduction and 31 us unrolled (a copy of
# its input: 11 us), and the fused pool-and-residual of its third stage 92 -> 12 us; the pointwise
# value also fuses into its readers as any elementwise op does (Inductor unrolls pools too). C++
# kernels keep the reduction, whose column form walks an NHWC window with the channels as the
# vector loop: unrolled, the transformers ResNet's stem pool (batch norm and ReLU fused in, the
# 2-core VM) took 41 us against its 18.
UNROLLED_WINDOW_LIMIT = 16


def _pool(ctx: LoopContext, window: LoopValue, kind: str, dtype: torch.dtype, origin: str) -> LoopValue:
    """`window` (sizes (*out, kh, kw)) reduced over its last two dims by `kind` (sum or max)."""
    kh, kw = (int(s) for s in window.sizes[-2:])
    if ctx.language != "triton" or kh * kw > UNROLLED_WINDOW_LIMIT:
        return ctx.reduce(window, (len(window.sizes) - 2, len(window.sizes) - 1), False, kind, dtype, origin)
    xs = row_vars(len(window.sizes))
    combined: Body | None = None
    for a in range(kh):
        for b in range(kw):
            tap = substitute(window.body, {xs[-2]: sympy.Integer(a), xs[-1]: sympy.Integer(b)})
            combined = tap if combined is None else Apply("add" if kind == "sum" else "maximum", (combined, tap),
                                                          window.body.dtype)
    return LoopValue(window.sizes[:-2], combined, dtype)  # type: ignore[arg-type]


def _index(expr: sympy.Expr) -> Body:
    return IndexValue(sympy.sympify(expr), torch.int64)


def _window_source(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """The pooled tensor, from memory when inlining it would repeat its work at every position
    of every window (see recompute.py)."""
    value = ctx.value(node)
    return ctx.computed_once(node) if compute_once_before_window(value) else value


def _window(source: LoopValue, out_sizes: tuple, kernel: tuple[int, int], stride: tuple[int, int],
            padding: tuple[int, int], dilation: tuple[int, int], fill: float) -> tuple[tuple, Body]:
    """The (*out_sizes, kh, kw) window values: x[.., i*s - p + a*d, j*s - p + b*d], each read at an
    index clamped into the input so no load leaves the buffer, and `fill` where it is padding."""
    lead = len(source.sizes) - 2
    sizes = (*out_sizes, sympy.Integer(kernel[0]), sympy.Integer(kernel[1]))
    xs = row_vars(len(sizes))
    dtype = compute_dtype(source.dtype)
    inside: Body | None = None
    position = []
    for axis in range(2):
        at = xs[lead + axis] * stride[axis] - padding[axis] + xs[lead + 2 + axis] * dilation[axis]
        length = source.sizes[lead + axis]
        position.append(IndexMax(0, IndexMin(at, length - 1)))
        for condition in (Apply("ge", (_index(at), _index(0)), torch.bool), Apply("lt", (_index(at), _index(length)), torch.bool)):
            inside = condition if inside is None else Apply("and", (inside, condition), torch.bool)
    read = cast(source.at((*xs[:lead], *position)), dtype)
    return sizes, Apply("where", (inside, read, Const(fill, dtype)), dtype)  # type: ignore[arg-type]


@register("aten::max_pool2d_with_indices.default", check=_pool_check)
def _max_pool2d(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue]:
    """out[.., i, j] = max over the window (a padding position counts as -inf)."""
    source = _window_source(ctx, node.args[0])
    values, indices = out_fake(node)
    kernel = _pair(arg(node, 1, "kernel_size"))
    sizes, body = _window(source, ctx.shape(values.shape), kernel, _pair(arg(node, 2, "stride"), kernel),  # type: ignore[arg-type]
                          _pair(arg(node, 3, "padding", 0)), _pair(arg(node, 4, "dilation", 1)), float("-inf"))  # type: ignore[arg-type]
    window = LoopValue(sizes, body, source.dtype)
    pooled = _pool(ctx, window, "max", values.dtype, "max_pool2d")
    # never read (the check keeps readers of the indices on the library call)
    unused = LoopValue(ctx.shape(indices.shape), zero(indices.dtype), indices.dtype)
    return pooled, unused


def _avg_pool_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    if not isinstance(source, torch.Tensor) or source.dim() not in (3, 4) or not source.dtype.is_floating_point:
        return False
    kernel = _pair(arg(node, 1, "kernel_size"))
    params = (kernel, _pair(arg(node, 2, "stride"), kernel), _pair(arg(node, 3, "padding", 0)))
    divisor = arg(node, 6, "divisor_override")
    return (all(p is not None for p in params) and not any(isinstance(s, torch.SymInt) for s in source.shape[-2:])
            and (divisor is None or (isinstance(divisor, int) and divisor != 0)))


@register("aten::avg_pool2d.default", check=_avg_pool_check)
def _avg_pool2d(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[.., i, j] = sum over the window of x (0 in the padding) / the divisor ATen uses: with
    start = i*s - p and end = min(start + k, size + p), the padded window's area (end - start) when
    `count_include_pad`, else the area of the window clipped to the input."""
    source = _window_source(ctx, node.args[0])
    out = out_fake(node)
    kernel = _pair(arg(node, 1, "kernel_size"))
    stride = _pair(arg(node, 2, "stride"), kernel)
    padding = _pair(arg(node, 3, "padding", 0))
    include_pad = bool(arg(node, 5, "count_include_pad", True))
    divisor_override = arg(node, 6, "divisor_override")
    sizes, body = _window(source, ctx.shape(out.shape), kernel, stride, padding, (1, 1), 0.0)  # type: ignore[arg-type]
    dtype = compute_dtype(source.dtype)
    # the sum is kept in the compute dtype: eager divides before it rounds a half result
    total = _pool(ctx, LoopValue(sizes, body, dtype), "sum", dtype, "avg_pool2d")
    if divisor_override is not None:
        divisor: sympy.Expr = sympy.Integer(int(divisor_override))  # type: ignore[arg-type]
    else:
        lead, xs = len(source.sizes) - 2, row_vars(len(sizes))
        divisor = sympy.Integer(1)
        for axis in range(2):
            start = xs[lead + axis] * stride[axis] - padding[axis]  # type: ignore[index]
            length = source.sizes[lead + axis]
            end = sympy.Min(start + kernel[axis], length + padding[axis])  # type: ignore[index]
            divisor *= (end - start) if include_pad else (sympy.Min(end, length) - sympy.Max(start, 0))
    quotient = Apply("div", (cast(total.body, dtype), cast(_index(divisor), dtype)), dtype)
    return LoopValue(total.sizes, quotient, out.dtype)
