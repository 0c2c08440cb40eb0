"""Pointwise ops as loop bodies: arithmetic, comparisons, unary math, where/clamp, casts and
constants, and the activations with Scalar parameters (gelu, elu, leaky_relu, hardtanh).

Each computes in its output's `compute_dtype` (float32 for half precision) and returns a
value labelled with the output's dtype; only `_to_copy` to a half dtype rounds mid-body."""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.common import (
    LoopContext,
    Lowering,
    all_args_ok,
    arg,
    broadcast,
    cast,
    convert_scalar,
    element_operand,
    fake,
    operand,
    out_fake,
    register,
    zero,
)

_BINARY = {
    "aten::add": "add", "aten::sub": "sub", "aten::rsub": "rsub", "aten::mul": "mul", "aten::div": "div",
    "aten::maximum": "maximum", "aten::minimum": "minimum", "aten::pow": "pow",
    "aten::bitwise_and": "bitwise_and", "aten::bitwise_or": "bitwise_or", "aten::bitwise_xor": "bitwise_xor",
    "aten::fmod": "fmod", "aten::remainder": "remainder", "aten::atan2": "atan2",
}
_COMPARE = {"aten::eq": "eq", "aten::ne": "ne", "aten::lt": "lt", "aten::le": "le", "aten::gt": "gt", "aten::ge": "ge"}
_LOGICAL = {"aten::logical_and": "and", "aten::logical_or": "or", "aten::logical_xor": "xor"}
_UNARY_FLOAT = [
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sigmoid", "tanh", "erf",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "reciprocal",
]
_UNARY_SAME = ["neg", "abs", "floor", "ceil", "trunc", "round", "sign", "relu", "bitwise_not"]


def _binary_check(node: torch.fx.Node) -> bool:
    if not all_args_ok(node) or node.kwargs.get("rounding_mode") is not None:
        return False
    dtype = out_fake(node).dtype
    name = node.target._schema.name
    if name in ("aten::pow",) and not dtype.is_floating_point:
        return False
    if name in ("aten::fmod", "aten::remainder", "aten::atan2") and not dtype.is_floating_point:
        return False
    if name.startswith("aten::bitwise") and dtype.is_floating_point:
        return False
    return True


def _binary(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dtype = compute_dtype(out.dtype)
    name = _BINARY[node.target._schema.name]
    a = operand(ctx, node.args[0], sizes, dtype)
    b = operand(ctx, node.args[1], sizes, dtype)
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else None)
    if alpha is not None and alpha != 1:
        b = Apply("mul", (b, Const(convert_scalar(alpha, dtype), dtype)), dtype)
    if name == "rsub":
        a, b, name = b, a, "sub"
    if name == "pow" and isinstance(b, Const):
        special = _scalar_power(a, b.value, dtype)
        if special is not None:
            return LoopValue(sizes, special, out.dtype)
    return LoopValue(sizes, Apply(name, (a, b), dtype), out.dtype)


def _scalar_power(a: Body, exponent: object, dtype: torch.dtype) -> Apply | None:
    """pow(a, exponent) as multiplications / sqrt for the exponents eager's CPU kernel special-cases
    the same way (so results match eager's bit for bit), or None. Besides being cheaper, this keeps
    pow out of vector math: glibc's vector powf falls back to a scalar call per lane for a negative
    base, which made GELU(tanh)'s `x ** 3` 30x slower than `x * x * x`."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return None
    square = Apply("mul", (a, a), dtype)
    forms = {
        2.0: square, 3.0: Apply("mul", (square, a), dtype), 0.5: Apply("sqrt", (a,), dtype),
        -0.5: Apply("rsqrt", (a,), dtype), -1.0: Apply("reciprocal", (a,), dtype),
        -2.0: Apply("reciprocal", (square,), dtype),
    }
    return forms.get(float(exponent))


def _compare(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    x, y = node.args[0], node.args[1]
    common = torch.result_type(fake(x), fake(y) if isinstance(y, torch.fx.Node) else y)
    a, b = element_operand(ctx, x, sizes, common), element_operand(ctx, y, sizes, common)
    return LoopValue(sizes, Apply(_COMPARE[node.target._schema.name], (a, b), torch.bool), torch.bool)


def _logical(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    a, b = operand(ctx, node.args[0], sizes, torch.bool), operand(ctx, node.args[1], sizes, torch.bool)
    body = cast(Apply(_LOGICAL[node.target._schema.name], (a, b), torch.bool), out.dtype)
    return LoopValue(sizes, body, out.dtype)


def _logical_not(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    body = cast(Apply("not", (operand(ctx, node.args[0], sizes, torch.bool),), torch.bool), out.dtype)
    return LoopValue(sizes, body, out.dtype)


def _unary(op: str) -> Lowering:
    def lower(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
        out = out_fake(node)
        sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
        return LoopValue(sizes, Apply(op, (operand(ctx, node.args[0], sizes, dtype),), dtype), out.dtype)

    return lower


def _float_out(node: torch.fx.Node) -> bool:
    return out_fake(node).dtype.is_floating_point and all_args_ok(node)


for _name in _BINARY:
    for _overload in ("Tensor", "Scalar", "default"):
        register(f"{_name}.{_overload}", check=_binary_check)(_binary)
register("aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", check=_binary_check)(_binary)
for _name in _COMPARE:
    register(f"{_name}.Tensor", f"{_name}.Scalar", check=all_args_ok)(_compare)
for _name in _LOGICAL:
    register(f"{_name}.default", check=all_args_ok)(_logical)
register("aten::logical_not.default")(_logical_not)
for _op in _UNARY_FLOAT:
    register(f"aten::{_op}.default", check=_float_out)(_unary(_op))
for _op in _UNARY_SAME:
    _check = (lambda n: not out_fake(n).dtype.is_floating_point) if _op == "bitwise_not" else (
        (lambda n: out_fake(n).dtype != torch.bool) if _op in ("neg", "sign", "abs") else None
    )
    register(f"aten::{_op}.default", check=_check)(_unary(_op))


@register("aten::isnan.default")
def _isnan(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    x = node.args[0]
    sizes = ctx.shape(out_fake(node).shape)
    source = ctx.value(x)
    body = Apply("isnan", (broadcast(source, sizes),), torch.bool) if source.dtype.is_floating_point else Const(False, torch.bool)
    return LoopValue(sizes, body, torch.bool)


@register("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar", check=all_args_ok)
def _where(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    cond = operand(ctx, node.args[0], sizes, torch.bool)
    a, b = element_operand(ctx, node.args[1], sizes, out.dtype), element_operand(ctx, node.args[2], sizes, out.dtype)
    return LoopValue(sizes, Apply("where", (cond, a, b), compute_dtype(out.dtype)), out.dtype)


def _clamp_check(node: torch.fx.Node) -> bool:
    return all_args_ok(node) and out_fake(node).dtype != torch.bool


@register("aten::clamp.default", "aten::clamp.Tensor", "aten::clamp_min.default", "aten::clamp_max.default",
          "aten::clamp_min.Tensor", "aten::clamp_max.Tensor", check=_clamp_check)
def _clamp(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dtype = compute_dtype(out.dtype)
    body = operand(ctx, node.args[0], sizes, dtype)
    name = node.target._schema.name
    low = arg(node, 1, "min") if name != "aten::clamp_max" else None
    high = arg(node, 2, "max") if name == "aten::clamp" else (arg(node, 1, "max") if name == "aten::clamp_max" else None)
    if low is not None:
        body = Apply("clamp_min", (body, element_operand(ctx, low, sizes, out.dtype)), dtype)
    if high is not None:
        body = Apply("clamp_max", (body, element_operand(ctx, high, sizes, out.dtype)), dtype)
    return LoopValue(sizes, body, out.dtype)


def _gelu_check(node: torch.fx.Node) -> bool:
    return _float_out(node) and node.kwargs.get("approximate", arg(node, 1, "approximate", "none")) in ("none", "tanh")


@register("aten::gelu.default", check=_gelu_check)
def _gelu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    x = operand(ctx, node.args[0], sizes, dtype)
    approximate = node.kwargs.get("approximate", arg(node, 1, "approximate", "none"))
    op = "gelu_tanh" if approximate == "tanh" else "gelu"
    return LoopValue(sizes, Apply(op, (x,), dtype), out.dtype)


def _to_copy_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    out = out_fake(node)
    allowed = {"dtype", "layout", "device", "memory_format", "pin_memory", "non_blocking"}
    return (
        isinstance(source, torch.Tensor)
        and set(node.kwargs) <= allowed
        and len(node.args) == 1
        and source.device == out.device
        and out.layout == torch.strided
    )


@register("aten::_to_copy.default", "aten::clone.default", "aten::lift_fresh_copy.default", check=_to_copy_check)
def _copy(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """A cast: to a half dtype it rounds here, so later ops of the fusion see eager's value.
    `lift_fresh_copy` is the copy aot_autograd makes of a tensor a forward builds from Python
    data (`torch.tensor([...])`; DeBERTa's and BEiT's position tables): fused as a clone, where
    left whole it was a library call per run that torch.export's graph of the model lacks."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    return LoopValue(sizes, operand(ctx, node.args[0], sizes, out.dtype), out.dtype)


@register("aten::copy.default", check=lambda n: isinstance(fake(n.args[1]), torch.Tensor)
          and fake(n.args[1]).device == out_fake(n).device)
def _functional_copy(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """`copy(self, src)` (a functionalized `self.copy_(src)`): src broadcast to self's shape, in
    self's dtype; self's values are overwritten, only its shape and dtype matter."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    return LoopValue(sizes, operand(ctx, node.args[1], sizes, out.dtype), out.dtype)


def _full_check(node: torch.fx.Node) -> bool:
    """full's size list (ints and size symbols) fixes only the output's shape; the rest are scalars
    (checked as all_args_ok checks them)."""
    if node.target._schema.name != "aten::full":
        return all_args_ok(node)
    sizes, value = node.args[0], node.args[1]
    options = (bool, str, torch.dtype, torch.device, torch.layout, torch.memory_format, type(None))
    return (isinstance(sizes, (list, tuple)) and all(isinstance(s, (int, torch.fx.Node)) for s in sizes)
            and isinstance(value, (torch.fx.Node, bool, int, float)) and len(node.args) == 2
            and all(isinstance(v, options) for v in node.kwargs.values()) and out_fake(node).layout == torch.strided)


@register("aten::full.default", "aten::scalar_tensor.default", check=_full_check)
def _full(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    value = node.args[1] if node.target._schema.name == "aten::full" else node.args[0]
    if isinstance(value, torch.fx.Node):
        return LoopValue(sizes, operand(ctx, value, (), out.dtype), out.dtype)
    return LoopValue(sizes, element_operand(ctx, value, (), out.dtype), out.dtype)


@register("aten::empty.memory_format", "aten::empty_strided.default",
          check=lambda n: out_fake(n).layout == torch.strided and not n.kwargs.get("pin_memory"))
def _empty(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """Uninitialized memory may hold anything: zeros, which fuse into what reads them."""
    out = out_fake(node)
    return LoopValue(ctx.shape(out.shape), zero(out.dtype), out.dtype)


def _arange_check(node: torch.fx.Node) -> bool:
    """Start and step must be numbers; the end only sets the length (the output's size)."""
    args = list(node.args)
    fixed = [] if len(args) == 1 else [args[0]] + args[2:3]
    return all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in fixed)


@register("aten::arange.start_step", "aten::arange.default", "aten::arange.start", check=_arange_check)
def _arange(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), out.dtype
    args = list(node.args)
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    x = row_vars(1)[0]
    if all(isinstance(v, int) for v in (start, step)):
        return LoopValue(sizes, cast(IndexValue(start + step * x, torch.int64), dtype), dtype)
    compute = torch.float64
    body = Apply("add", (Const(float(start), compute), Apply("mul", (cast(IndexValue(x, torch.int64), compute), Const(float(step), compute)), compute)), compute)
    return LoopValue(sizes, cast(body, dtype), dtype)


# -- activations with Scalar parameters --------------------------------------------------------


@register("aten::elu.default", check=lambda n: _float_out(n) and all(isinstance(a, (int, float)) for a in n.args[1:]))
def _elu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """scale * x for x > 0, else scale * alpha * (exp(x * input_scale) - 1) (elu, selu, celu)."""
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    alpha, scale, input_scale = (float(arg(node, i, n, 1.0)) for i, n in ((1, "alpha"), (2, "scale"), (3, "input_scale")))
    x = operand(ctx, node.args[0], sizes, dtype)
    negative = Apply("mul", (Apply("expm1", (Apply("mul", (x, Const(input_scale, dtype)), dtype),), dtype),
                             Const(alpha * scale, dtype)), dtype)
    positive = Apply("mul", (x, Const(scale, dtype)), dtype)
    return LoopValue(sizes, Apply("where", (Apply("gt", (x, zero(dtype)), torch.bool), positive, negative), dtype), out.dtype)


@register("aten::leaky_relu.default", check=lambda n: _float_out(n) and isinstance(arg(n, 1, "negative_slope", 0.01), (int, float)))
def _leaky_relu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    x = operand(ctx, node.args[0], sizes, dtype)
    slope = Const(float(arg(node, 1, "negative_slope", 0.01)), dtype)
    return LoopValue(sizes, Apply("where", (Apply("gt", (x, zero(dtype)), torch.bool), x, Apply("mul", (x, slope), dtype)), dtype), out.dtype)


@register("aten::hardtanh.default", check=lambda n: _clamp_check(n) and all(isinstance(a, (int, float)) for a in n.args[1:]))
def _hardtanh(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), compute_dtype(out.dtype)
    low, high = (element_operand(ctx, arg(node, i, n, d), sizes, out.dtype) for i, n, d in ((1, "min_val", -1.0), (2, "max_val", 1.0)))
    body = Apply("clamp_max", (Apply("clamp_min", (operand(ctx, node.args[0], sizes, dtype), low), dtype), high), dtype)
    return LoopValue(sizes, body, out.dtype)
