"""Max pooling as a window reduction: each output element is the max over its kernel window
(positions in the padding count as -inf), so the pool fuses with its producer (ResNet's stem
ReLU) instead of being a library call. Where the indices are read (a training step saves them
for the backward), a second reduction over the window finds the first largest position, as
eager's kernel does, and the backward is a gather: each input element sums the gradients of the
few windows that can hold it and picked it. Eager's CPU pool and its backward took a fifth of a
small ResNet's training step on the 2-core VM.

One difference from eager remains: a window holding two or more NaNs points at its first NaN
(eager: its last); the value is NaN either way."""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, fake, out_fake, register, zero


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
    if all(u.target is operator.getitem and u.args[1] == 0 for u in node.users):
        return True
    # read indices: a window's first in-image position is simple only without dilation
    return params[3] == (1, 1) and all(u.target is operator.getitem for u in node.users)


def _index(expr: sympy.Expr) -> Body:
    return IndexValue(sympy.sympify(expr), torch.int64)


@register("aten::max_pool2d_with_indices.default", check=_pool_check)
def _max_pool2d(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, LoopValue]:
    """out[.., i, j] = max over (a, b) of x[.., i*s - p + a*d, j*s - p + b*d], reading each
    window position at an index clamped into the input (a padding position's read is
    discarded for -inf), so no load leaves the buffer."""
    source = ctx.value(node.args[0])
    values, indices = out_fake(node)
    kernel = _pair(arg(node, 1, "kernel_size"))
    stride = _pair(arg(node, 2, "stride"), kernel)
    padding = _pair(arg(node, 3, "padding", 0))
    dilation = _pair(arg(node, 4, "dilation", 1))
    lead = len(source.sizes) - 2
    out_sizes = ctx.shape(values.shape)
    sizes = (*out_sizes, sympy.Integer(kernel[0]), sympy.Integer(kernel[1]))  # type: ignore[index]
    xs = row_vars(len(sizes))
    dtype = compute_dtype(source.dtype)
    inside: Body | None = None
    position = []
    for axis in range(2):
        at = xs[lead + axis] * stride[axis] - padding[axis] + xs[lead + 2 + axis] * dilation[axis]  # type: ignore[index]
        length = source.sizes[lead + axis]
        position.append(sympy.Max(0, sympy.Min(at, length - 1)))
        for condition in (Apply("ge", (_index(at), _index(0)), torch.bool), Apply("lt", (_index(at), _index(length)), torch.bool)):
            inside = condition if inside is None else Apply("and", (inside, condition), torch.bool)
    read = cast(source.at((*xs[:lead], *position)), dtype)
    body = Apply("where", (inside, read, Const(float("-inf"), dtype)), dtype)  # type: ignore[arg-type]
    window = LoopValue(sizes, body, source.dtype)
    pooled = ctx.reduce(window, (len(sizes) - 2, len(sizes) - 1), False, "max", values.dtype, "max_pool2d")
    if all(u.args[1] == 0 for u in node.users):  # the indices are never read
        return pooled, LoopValue(ctx.shape(indices.shape), zero(indices.dtype), indices.dtype)
    best = ctx.reduce(window, (len(sizes) - 2, len(sizes) - 1), False, "argmax", torch.int64, "max_pool2d")
    return pooled, LoopValue(out_sizes, _input_index(best.body, pooled.body, xs[lead:lead + 2], stride, padding,
                                                     kernel[1], source.sizes[-1]), torch.int64)  # type: ignore[index]


def _input_index(window_position: Body, pooled: Body, out_vars: tuple, stride: tuple[int, int], padding: tuple[int, int],
                 kernel_width: int, width: sympy.Expr) -> Body:
    """The flat input index (h * width + w) of the window position an argmax found (row-major over
    the window, no dilation). A window whose in-image values are all -inf points, as eager's does,
    at its first in-image position (the argmax may have found a padding position)."""
    i, j = out_vars
    top, left = i * stride[0] - padding[0], j * stride[1] - padding[1]
    # the window row without integer division: floor((r + 0.5) / kw) is exact in float32 for r < 2**23
    half_up = Apply("add", (cast(window_position, torch.float32), Const(0.5, torch.float32)), torch.float32)
    row = cast(Apply("floor", (Apply("div", (half_up, Const(float(kernel_width), torch.float32)), torch.float32),),
                     torch.float32), torch.int64)
    column = Apply("sub", (window_position, Apply("mul", (row, Const(kernel_width, torch.int64)), torch.int64)), torch.int64)
    h = Apply("add", (_index(top), row), torch.int64)
    w = Apply("add", (_index(left), column), torch.int64)
    found = Apply("add", (Apply("mul", (h, _index(width)), torch.int64), w), torch.int64)
    first_inside = _index(sympy.Max(top, 0) * width + sympy.Max(left, 0))
    all_minus_inf = Apply("eq", (pooled, Const(float("-inf"), pooled.dtype)), torch.bool)
    return Apply("where", (all_minus_inf, first_inside, found), torch.int64)


def _backward_check(node: torch.fx.Node) -> bool:
    grad, source = fake(node.args[0]), fake(node.args[1])
    if not isinstance(source, torch.Tensor) or source.dim() not in (3, 4) or not source.dtype.is_floating_point:
        return False
    kernel = _pair(arg(node, 2, "kernel_size"))
    params = (kernel, _pair(arg(node, 3, "stride"), kernel), _pair(arg(node, 4, "padding", 0)), _pair(arg(node, 5, "dilation", 1)))
    shapes = (*source.shape, *grad.shape)
    return all(p is not None for p in params) and not any(isinstance(s, torch.SymInt) for s in shapes)


@register("aten::max_pool2d_with_indices_backward.default", check=_backward_check)
def _max_pool2d_backward(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """grad_input[.., h, w] = sum of grad_output[.., i, j] over the windows (i, j) whose index
    points at (h, w). Only the windows i in [floor((h + p) / s) - A + 1, floor((h + p) / s)]
    (A = ceil(((k - 1) * d + 1) / s): 2 for ResNet's 3x3 stride-2 pool) can hold h; each is read
    at an index clamped into the output and counted only when in range."""
    grad, indices = ctx.value(node.args[0]), ctx.value(node.args[7])
    out = out_fake(node)
    kernel = _pair(arg(node, 2, "kernel_size"))
    stride = _pair(arg(node, 3, "stride"), kernel)
    padding = _pair(arg(node, 4, "padding", 0))
    dilation = _pair(arg(node, 5, "dilation", 1))
    in_sizes = ctx.shape(out.shape)
    lead = len(in_sizes) - 2
    reach = [-(-((kernel[a] - 1) * dilation[a] + 1) // stride[a]) for a in range(2)]  # type: ignore[index]
    sizes = (*in_sizes, sympy.Integer(reach[0]), sympy.Integer(reach[1]))
    xs = row_vars(len(sizes))
    dtype = compute_dtype(out.dtype)
    inside: Body | None = None
    window = []
    for axis in range(2):
        at = FloorDiv(xs[lead + axis] + padding[axis], stride[axis]) - xs[lead + 2 + axis]  # type: ignore[index]
        length = grad.sizes[lead + axis]
        window.append(sympy.Max(0, sympy.Min(at, length - 1)))
        for condition in (Apply("ge", (_index(at), _index(0)), torch.bool), Apply("lt", (_index(at), _index(length)), torch.bool)):
            inside = condition if inside is None else Apply("and", (inside, condition), torch.bool)
    here = _index(xs[lead] * in_sizes[-1] + xs[lead + 1])
    picked = Apply("eq", (cast(indices.at((*xs[:lead], *window)), torch.int64), here), torch.bool)
    hit = Apply("and", (inside, picked), torch.bool)  # type: ignore[arg-type]
    body = Apply("where", (hit, cast(grad.at((*xs[:lead], *window)), dtype), zero(dtype)), dtype)
    gathered = LoopValue(sizes, body, out.dtype)
    return ctx.reduce(gathered, (len(sizes) - 2, len(sizes) - 1), False, "sum", out.dtype, "max_pool2d_backward")
