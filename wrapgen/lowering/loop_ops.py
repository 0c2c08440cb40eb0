"""ATen ops → loop bodies: pointwise ops, broadcasts, views (as index remapping), constants,
and reductions (plus the softmax / log_softmax / layer_norm / var decompositions).

Each lowering takes a `LoopContext` (which turns fx arguments into `LoopValue`s and
materializes reductions) and the fx node, and returns a `LoopValue` (or a tuple of them).
`supported(node)` says up front whether an op has a lowering for these arguments; an op
without one stays a library call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from wrapgen import config
from wrapgen.lowering.loop_ir import Apply, Body, Const, IndexValue, Indirect, Load, LoopValue, row_vars

SUPPORTED_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
)


class LoopContext(Protocol):
    def value(self, arg: object) -> LoopValue: ...
    def shape(self, values: object) -> tuple[sympy.Expr, ...]: ...
    def reduce(self, value: LoopValue, dims: tuple[int, ...], keepdim: bool, kind: str, dtype: torch.dtype, origin: str) -> LoopValue: ...
    def computed_once(self, arg: torch.fx.Node) -> LoopValue: ...
    def in_memory(self, arg: torch.fx.Node) -> LoopValue: ...


Lowering = Callable[[LoopContext, torch.fx.Node], object]
LOWERINGS: dict[str, Lowering] = {}
CHECKS: dict[str, Callable[[torch.fx.Node], bool]] = {}
VIEW_OPS: set[str] = set()


def register(*names: str, check: Callable[[torch.fx.Node], bool] | None = None, view: bool = False):
    def wrap(fn: Lowering) -> Lowering:
        for name in names:
            LOWERINGS[name] = fn
            if check is not None:
                CHECKS[name] = check
            if view:
                VIEW_OPS.add(name)
        return fn

    return wrap


def op_key(node: torch.fx.Node) -> str:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return ""
    return f"{target._schema.name}.{target._overloadname}"


def supported(node: torch.fx.Node, device_type: str = "cpu") -> bool:
    """Whether `node` has a loop lowering for these arguments and dtypes, on `device_type`."""
    key = op_key(node)
    if key not in LOWERINGS:
        return False
    fakes = node.meta.get("val")
    outs = fakes if isinstance(fakes, (list, tuple)) else [fakes]
    for f in outs:
        if not isinstance(f, torch.Tensor) or f.dtype not in SUPPORTED_DTYPES or f.device.type != device_type:
            return False
        if any(_unbacked(s) for s in f.shape):
            return False
    for arg in node.all_input_nodes:
        f = arg.meta.get("val")
        if isinstance(f, torch.Tensor) and (f.dtype not in SUPPORTED_DTYPES or f.device.type != device_type):
            return False
        if not isinstance(f, (torch.Tensor, torch.SymInt, int)) or isinstance(f, bool):  # no float sizes
            return False
        if isinstance(f, torch.Tensor) and any(_unbacked(s) for s in f.shape):
            return False
    check = CHECKS.get(key)
    return check is None or check(node)


def _unbacked(size: object) -> bool:
    return isinstance(size, torch.SymInt) and any(str(s).startswith("u") for s in size.node.expr.free_symbols)


# -- helpers ------------------------------------------------------------------------------


def fake(node: object) -> torch.Tensor | object:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def arg(node: torch.fx.Node, index: int, name: str, default: object = None) -> object:
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def out_fake(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


def cast(body: Body, dtype: torch.dtype) -> Body:
    if body.dtype == dtype:
        return body
    if isinstance(body, Const):
        return Const(_convert_scalar(body.value, dtype), dtype)
    return Apply("cast", (body,), dtype)


def _convert_scalar(value: object, dtype: torch.dtype) -> object:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def broadcast(value: LoopValue, sizes: tuple[sympy.Expr, ...]) -> Body:
    """`value`'s body at the output index of a `sizes`-shaped result (right-aligned broadcast)."""
    out = row_vars(len(sizes))
    offset = len(sizes) - len(value.sizes)
    index = tuple(
        sympy.Integer(0) if sympy.sympify(s) == 1 and sympy.sympify(sizes[d + offset]) != 1 else out[d + offset]
        for d, s in enumerate(value.sizes)
    )
    return value.at(index)


def operand(ctx: LoopContext, x: object, sizes: tuple, dtype: torch.dtype) -> Body:
    """An argument (tensor node, number or size expression) as a body of `dtype` at the output index."""
    if isinstance(x, torch.fx.Node):
        return cast(broadcast(ctx.value(x), sizes), dtype)
    if isinstance(x, sympy.Basic):
        return cast(IndexValue(x, torch.int64), dtype)
    return Const(_convert_scalar(x, dtype), dtype)


def _scalar_ok(x: object) -> bool:
    return isinstance(x, (torch.fx.Node, bool, int, float)) and not isinstance(x, complex)


def _all_args_ok(node: torch.fx.Node) -> bool:
    values = list(node.args) + list(node.kwargs.values())
    return all(_scalar_ok(v) or v is None or isinstance(v, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)) for v in values)


# -- pointwise ----------------------------------------------------------------------------

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
    if not _all_args_ok(node) or node.kwargs.get("rounding_mode") is not None:
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
    dtype = out.dtype
    name = _BINARY[node.target._schema.name]
    a = operand(ctx, node.args[0], sizes, dtype)
    b = operand(ctx, node.args[1], sizes, dtype)
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else None)
    if alpha is not None and alpha != 1:
        b = Apply("mul", (b, Const(_convert_scalar(alpha, dtype), dtype)), dtype)
    if name == "rsub":
        a, b, name = b, a, "sub"
    if name == "pow" and isinstance(b, Const) and b.value in (2, 2.0):
        return LoopValue(sizes, Apply("mul", (a, a), dtype), dtype)
    if name == "pow" and isinstance(b, Const) and b.value in (0.5,):
        return LoopValue(sizes, Apply("sqrt", (a,), dtype), dtype)
    return LoopValue(sizes, Apply(name, (a, b), dtype), dtype)


def _compare(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    x, y = node.args[0], node.args[1]
    compute = torch.result_type(fake(x), fake(y) if isinstance(y, torch.fx.Node) else y)
    a, b = operand(ctx, x, sizes, compute), operand(ctx, y, sizes, compute)
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
        sizes = ctx.shape(out.shape)
        return LoopValue(sizes, Apply(op, (operand(ctx, node.args[0], sizes, out.dtype),), out.dtype), out.dtype)

    return lower


def _float_out(node: torch.fx.Node) -> bool:
    return out_fake(node).dtype.is_floating_point and _all_args_ok(node)


for _name in _BINARY:
    for _overload in ("Tensor", "Scalar", "default"):
        register(f"{_name}.{_overload}", check=_binary_check)(_binary)
register("aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", check=_binary_check)(_binary)
for _name in _COMPARE:
    register(f"{_name}.Tensor", f"{_name}.Scalar", check=_all_args_ok)(_compare)
for _name in _LOGICAL:
    register(f"{_name}.default", check=_all_args_ok)(_logical)
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


@register("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar", check=_all_args_ok)
def _where(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    cond = operand(ctx, node.args[0], sizes, torch.bool)
    a, b = operand(ctx, node.args[1], sizes, out.dtype), operand(ctx, node.args[2], sizes, out.dtype)
    return LoopValue(sizes, Apply("where", (cond, a, b), out.dtype), out.dtype)


def _clamp_check(node: torch.fx.Node) -> bool:
    return _all_args_ok(node) and out_fake(node).dtype != torch.bool


@register("aten::clamp.default", "aten::clamp.Tensor", "aten::clamp_min.default", "aten::clamp_max.default",
          "aten::clamp_min.Tensor", "aten::clamp_max.Tensor", check=_clamp_check)
def _clamp(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    body = operand(ctx, node.args[0], sizes, out.dtype)
    name = node.target._schema.name
    low = arg(node, 1, "min") if name != "aten::clamp_max" else None
    high = arg(node, 2, "max") if name == "aten::clamp" else (arg(node, 1, "max") if name == "aten::clamp_max" else None)
    if low is not None:
        body = Apply("clamp_min", (body, operand(ctx, low, sizes, out.dtype)), out.dtype)
    if high is not None:
        body = Apply("clamp_max", (body, operand(ctx, high, sizes, out.dtype)), out.dtype)
    return LoopValue(sizes, body, out.dtype)


def _gelu_check(node: torch.fx.Node) -> bool:
    return _float_out(node) and node.kwargs.get("approximate", arg(node, 1, "approximate", "none")) in ("none", "tanh")


@register("aten::gelu.default", check=_gelu_check)
def _gelu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), out.dtype
    x = operand(ctx, node.args[0], sizes, dtype)
    approximate = node.kwargs.get("approximate", arg(node, 1, "approximate", "none"))
    op = "gelu_tanh" if approximate == "tanh" else "gelu"
    return LoopValue(sizes, Apply(op, (x,), dtype), dtype)


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


@register("aten::_to_copy.default", "aten::clone.default", check=_to_copy_check)
def _copy(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    return LoopValue(sizes, operand(ctx, node.args[0], sizes, out.dtype), out.dtype)


@register("aten::full.default", "aten::scalar_tensor.default", check=lambda n: _all_args_ok(n))
def _full(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    value = node.args[1] if node.target._schema.name == "aten::full" else node.args[0]
    if isinstance(value, torch.fx.Node):
        return LoopValue(sizes, operand(ctx, value, (), out.dtype), out.dtype)
    return LoopValue(sizes, Const(_convert_scalar(value, out.dtype), out.dtype), out.dtype)


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


# -- views: index remapping ---------------------------------------------------------------


def _remap(ctx: LoopContext, node: torch.fx.Node, index_of: Callable[[tuple], tuple]) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    source = ctx.value(node.args[0])
    return LoopValue(sizes, source.at(index_of(row_vars(len(sizes)))), source.dtype)


@register("aten::permute.default", view=True)
def _permute(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    dims = [d % max(len(node.args[1]), 1) for d in node.args[1]]

    def index_of(out: tuple) -> tuple:
        index = [sympy.Integer(0)] * len(dims)
        for i, d in enumerate(dims):
            index[d] = out[i]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::transpose.int", view=True)
def _transpose(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    rank = fake(node.args[0]).dim()
    a, b = node.args[1] % max(rank, 1), node.args[2] % max(rank, 1)

    def index_of(out: tuple) -> tuple:
        index = list(out)
        if rank:
            index[a], index[b] = out[b], out[a]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::t.default", view=True)
def _t(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    return _remap(ctx, node, lambda out: tuple(reversed(out)))


@register("aten::expand.default", "aten::alias.default", view=True)
def _expand(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    source = ctx.value(node.args[0])
    return LoopValue(sizes, broadcast(source, sizes), source.dtype)


@register("aten::unsqueeze.default", view=True)
def _unsqueeze(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    rank = out_fake(node).dim()
    dim = node.args[1] % rank
    return _remap(ctx, node, lambda out: tuple(v for d, v in enumerate(out) if d != dim))


@register("aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze.default",
          "aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default", view=True,
          check=lambda n: isinstance(fake(n.args[0]), torch.Tensor))
def _reshape(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """A reshape as index arithmetic; dims of size 1 added or removed map without division."""
    in_sizes = ctx.shape(fake(node.args[0]).shape)
    out_sizes = ctx.shape(out_fake(node).shape)

    def index_of(out: tuple) -> tuple:
        in_kept = [d for d, s in enumerate(in_sizes) if s != 1]
        out_kept = [d for d, s in enumerate(out_sizes) if s != 1]
        if [in_sizes[d] for d in in_kept] == [out_sizes[d] for d in out_kept]:
            index = [sympy.Integer(0)] * len(in_sizes)
            for i, o in zip(in_kept, out_kept):
                index[i] = out[o]
            return tuple(index)
        linear = sympy.Integer(0)
        for d, v in enumerate(out):
            linear = linear * out_sizes[d] + v
        linear = sympy.expand(linear)
        index = []
        for d in range(len(in_sizes)):
            inner = sympy.Mul(*in_sizes[d + 1 :]) if d + 1 < len(in_sizes) else sympy.Integer(1)
            if d == 0:
                index.append(FloorDiv(linear, inner) if inner != 1 else linear)
            else:
                index.append(ModularIndexing(linear, inner, in_sizes[d]))
        return tuple(index)

    return _remap(ctx, node, index_of)


def _slice_check(node: torch.fx.Node) -> bool:
    start = arg(node, 2, "start", None)
    step = arg(node, 4, "step", 1)
    size = fake(node.args[0]).shape[arg(node, 1, "dim", 0)]
    if start is None or start == 0:
        return isinstance(step, int)
    if not isinstance(start, int) or not isinstance(step, int):
        return False
    return start > 0 or isinstance(size, int)


@register("aten::slice.Tensor", view=True, check=_slice_check)
def _slice(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = arg(node, 1, "dim", 0) % source.dim()
    start = arg(node, 2, "start", None) or 0
    step = arg(node, 4, "step", 1)
    if start < 0:
        start = max(start + int(source.shape[dim]), 0)

    def index_of(out: tuple) -> tuple:
        index = list(out)
        index[dim] = start + step * out[dim]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::select.int", view=True, check=lambda n: isinstance(n.args[2], int) and (n.args[2] >= 0 or isinstance(fake(n.args[0]).shape[n.args[1]], int)))
def _select(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = node.args[1] % source.dim()
    index_value = node.args[2] if node.args[2] >= 0 else node.args[2] + int(source.shape[dim])

    def index_of(out: tuple) -> tuple:
        index = list(out)
        index.insert(dim, sympy.Integer(index_value))
        return tuple(index)

    return _remap(ctx, node, index_of)


# -- reductions -----------------------------------------------------------------------------


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
    value = ctx.value(node.args[0])
    value = LoopValue(value.sizes, cast(value.body, out.dtype), out.dtype)
    return ctx.reduce(value, dims, keep, "sum", out.dtype, "sum")


@register("aten::prod.dim_int", "aten::prod.default", check=_reduction_check)
def _prod(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    default = op_key(node) == "aten::prod.default"
    dims = tuple(range(fake(node.args[0]).dim())) if default else _dims(node, 1, "dim")
    value = ctx.value(node.args[0])
    value = LoopValue(value.sizes, cast(value.body, out.dtype), out.dtype)
    return ctx.reduce(value, dims, False if default else _keepdim(node, 2), "prod", out.dtype, "prod")


@register("aten::mean.dim", "aten::mean.default", check=lambda n: _reduction_check(n) and out_fake(n).dtype.is_floating_point)
def _mean(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    default = op_key(node) == "aten::mean.default"
    dims = tuple(range(fake(node.args[0]).dim())) if default else _dims(node, 1, "dim")
    value = ctx.value(node.args[0])
    value = LoopValue(value.sizes, cast(value.body, out.dtype), out.dtype)
    total = ctx.reduce(value, dims, False if default else _keepdim(node, 2), "sum", out.dtype, "mean")
    count = cast(IndexValue(_count(ctx, node, dims), torch.int64), out.dtype)
    return LoopValue(total.sizes, Apply("div", (total.body, count), out.dtype), out.dtype)


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


def _two_pass_variance(ctx: LoopContext, value: LoopValue, dims: tuple[int, ...], count: sympy.Expr, origin: str) -> tuple[LoopValue, LoopValue]:
    """(mean, sum of squared deviations), both with keepdim=True."""
    dtype = value.dtype
    total = ctx.reduce(value, dims, True, "sum", dtype, origin)
    n = cast(IndexValue(count, torch.int64), dtype)
    mean = LoopValue(total.sizes, Apply("div", (total.body, n), dtype), dtype)
    deviation = Apply("sub", (value.body, broadcast(mean, value.sizes)), dtype)
    squares = LoopValue(value.sizes, Apply("mul", (deviation, deviation), dtype), dtype)
    return mean, ctx.reduce(squares, dims, True, "sum", dtype, origin)


def _var_check(node: torch.fx.Node) -> bool:
    correction = node.kwargs.get("correction", 1)
    return _reduction_check(node) and out_fake(node).dtype.is_floating_point and isinstance(correction, (int, float, type(None)))


@register("aten::var.correction", check=_var_check)
def _var(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    dims = _dims(node, 1, "dim")
    correction = node.kwargs.get("correction")
    correction = 1 if correction is None else correction
    count = _count(ctx, node, dims)
    value = ctx.value(node.args[0])
    _, squares = _two_pass_variance(ctx, value, dims, count, "var")
    denominator = Apply("sub", (cast(IndexValue(count, torch.int64), out.dtype), Const(float(correction), out.dtype)), out.dtype)
    denominator = Apply("clamp_min", (denominator, Const(0.0, out.dtype)), out.dtype)
    var = LoopValue(squares.sizes, Apply("div", (squares.body, denominator), out.dtype), out.dtype)
    if node.kwargs.get("keepdim", False):
        return var
    kept = tuple(s for d, s in enumerate(var.sizes) if d not in dims)
    index = [sympy.Integer(0)] * len(var.sizes)
    outer = iter(row_vars(len(kept)))
    for d in range(len(var.sizes)):
        if d not in dims:
            index[d] = next(outer)
    return LoopValue(kept, var.at(tuple(index)), out.dtype)


def _softmax_check(node: torch.fx.Node) -> bool:
    return out_fake(node).dtype == fake(node.args[0]).dtype and out_fake(node).dtype.is_floating_point


def _softmax_parts(ctx: LoopContext, node: torch.fx.Node) -> tuple[LoopValue, Body, Body]:
    value = ctx.value(node.args[0])
    dims = _dims(node, 1, "dim")
    dtype = value.dtype
    peak = ctx.reduce(value, dims, True, "max", dtype, "softmax")
    shifted = Apply("sub", (value.body, broadcast(peak, value.sizes)), dtype)
    exps = LoopValue(value.sizes, Apply("exp", (shifted,), dtype), dtype)
    total = ctx.reduce(exps, dims, True, "sum", dtype, "softmax")
    return value, shifted, broadcast(total, value.sizes)


@register("aten::_softmax.default", check=_softmax_check)
def _softmax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    value, shifted, total = _softmax_parts(ctx, node)
    dtype = value.dtype
    return LoopValue(value.sizes, Apply("div", (Apply("exp", (shifted,), dtype), total), dtype), dtype)


@register("aten::_log_softmax.default", check=_softmax_check)
def _log_softmax(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    value, shifted, total = _softmax_parts(ctx, node)
    dtype = value.dtype
    return LoopValue(value.sizes, Apply("sub", (shifted, Apply("log", (total,), dtype)), dtype), dtype)


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
    dtype = value.dtype
    count = sympy.Mul(*[value.sizes[d] for d in dims])
    mean, squares = _two_pass_variance(ctx, value, dims, count, "layer_norm")
    n = cast(IndexValue(count, torch.int64), dtype)
    var = Apply("div", (squares.body, n), dtype)
    rstd = LoopValue(squares.sizes, Apply("rsqrt", (Apply("add", (var, Const(float(node.args[4]), dtype)), dtype),), dtype), dtype)
    out = Apply("mul", (Apply("sub", (value.body, broadcast(mean, value.sizes)), dtype), broadcast(rstd, value.sizes)), dtype)
    weight, bias = node.args[2], node.args[3]
    if weight is not None:
        out = Apply("mul", (out, operand(ctx, weight, value.sizes, dtype)), dtype)
    if bias is not None:
        out = Apply("add", (out, operand(ctx, bias, value.sizes, dtype)), dtype)
    return LoopValue(value.sizes, out, dtype), mean, rstd


__all__ = ["LOWERINGS", "VIEW_OPS", "LoopContext", "supported", "op_key", "math"]


# -- small matrix products ----------------------------------------------------------------------

# A matrix product this small (at most config.matmul_kernel_limit multiply-adds, the reduced
# length at most SMALL_MATMUL_K) costs less as a generated reduction than as a library launch,
# and the pointwise work around it fuses into the same kernel: a chain of tiny layers becomes
# one kernel per layer.
SMALL_MATMUL_K = 64


def _static_shape(t: object) -> tuple[int, ...] | None:
    if not isinstance(t, torch.Tensor) or any(not isinstance(s, int) for s in t.shape):
        return None
    return tuple(t.shape)


def _small_matmul_check(node: torch.fx.Node) -> bool:
    addmm = op_key(node) == "aten::addmm.default"
    if addmm and (arg(node, 3, "beta", 1) != 1 or arg(node, 4, "alpha", 1) != 1):
        return False
    a, b = (fake(n) for n in (node.args[1:3] if addmm else node.args[:2]))
    shapes = [_static_shape(a), _static_shape(b), _static_shape(out_fake(node))]
    if any(s is None or len(s) != 2 for s in shapes) or out_fake(node).dtype not in (torch.float32, torch.float64):
        return False
    if a.dtype != b.dtype:
        return False
    (m, k), (_, n) = shapes[0], shapes[1]
    return 1 <= k <= SMALL_MATMUL_K and m * n * k <= config.matmul_kernel_limit


@register("aten::mm.default", "aten::addmm.default", check=_small_matmul_check)
def _small_matmul(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[i, j] = sum_k a[i, k] * b[k, j] (+ bias[i, j] for addmm), as a reduction over k."""
    out = out_fake(node)
    dtype = out.dtype
    addmm = op_key(node) == "aten::addmm.default"
    a_node, b_node = node.args[1:3] if addmm else node.args[:2]
    rows = ctx.shape(out.shape)
    k = sympy.Integer(fake(a_node).shape[1])
    i, j, r = row_vars(3)
    # each element of a is read n times and of b m times: compute them once, not per read
    a, b = ctx.computed_once(a_node), ctx.computed_once(b_node)
    product = Apply("mul", (cast(a.at((i, r)), dtype), cast(b.at((r, j)), dtype)), dtype)
    total = ctx.reduce(LoopValue((*rows, k), product, dtype), (2,), False, "sum", dtype, "mm")
    if not addmm:
        return total
    bias = operand(ctx, node.args[0], rows, dtype)
    return LoopValue(rows, Apply("add", (bias, total.body), dtype), dtype)


# -- activations with Scalar parameters, and vector norms ----------------------------------------


def _zero(dtype: torch.dtype) -> Const:
    return Const(_convert_scalar(0, dtype), dtype)


@register("aten::elu.default", check=lambda n: _float_out(n) and all(isinstance(a, (int, float)) for a in n.args[1:]))
def _elu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """scale * x for x > 0, else scale * alpha * (exp(x * input_scale) - 1) (elu, selu, celu)."""
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), out.dtype
    alpha, scale, input_scale = (float(arg(node, i, n, 1.0)) for i, n in ((1, "alpha"), (2, "scale"), (3, "input_scale")))
    x = operand(ctx, node.args[0], sizes, dtype)
    negative = Apply("mul", (Apply("expm1", (Apply("mul", (x, Const(input_scale, dtype)), dtype),), dtype),
                             Const(alpha * scale, dtype)), dtype)
    positive = Apply("mul", (x, Const(scale, dtype)), dtype)
    return LoopValue(sizes, Apply("where", (Apply("gt", (x, _zero(dtype)), torch.bool), positive, negative), dtype), dtype)


@register("aten::leaky_relu.default", check=lambda n: _float_out(n) and isinstance(arg(n, 1, "negative_slope", 0.01), (int, float)))
def _leaky_relu(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), out.dtype
    x = operand(ctx, node.args[0], sizes, dtype)
    slope = Const(float(arg(node, 1, "negative_slope", 0.01)), dtype)
    return LoopValue(sizes, Apply("where", (Apply("gt", (x, _zero(dtype)), torch.bool), x, Apply("mul", (x, slope), dtype)), dtype), dtype)


@register("aten::hardtanh.default", check=lambda n: _clamp_check(n) and all(isinstance(a, (int, float)) for a in n.args[1:]))
def _hardtanh(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes, dtype = ctx.shape(out.shape), out.dtype
    low, high = (operand(ctx, arg(node, i, n, d), sizes, dtype) for i, n, d in ((1, "min_val", -1.0), (2, "max_val", 1.0)))
    body = Apply("clamp_max", (Apply("clamp_min", (operand(ctx, node.args[0], sizes, dtype), low), dtype), high), dtype)
    return LoopValue(sizes, body, dtype)


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
    dtype = out.dtype
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
        return ctx.reduce(LoopValue(sizes, body, dtype), dims, keep, kind, dtype, "vector_norm")

    if order == 2:
        squares = total(Apply("mul", (x, x), dtype))
        return LoopValue(squares.sizes, Apply("sqrt", (squares.body,), dtype), dtype)
    if order == 0:
        return total(cast(Apply("ne", (x, _zero(dtype)), torch.bool), dtype))
    if order == 1:
        return total(magnitude)
    if order in (math.inf, -math.inf):
        return total(magnitude, "max" if order > 0 else "min")
    powers = total(Apply("pow", (magnitude, Const(float(order), dtype)), dtype))
    return LoopValue(powers.sizes, Apply("pow", (powers.body, Const(1.0 / float(order), dtype)), dtype), dtype)


# -- gathers ---------------------------------------------------------------------------------


def _gather_check(source: object, index: object, out: object) -> bool:
    tensors = (source, index, out)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or index.dtype not in (torch.int64, torch.int32):
        return False
    if source.dtype not in SUPPORTED_DTYPES or source.dim() == 0:
        return False
    return not any(_unbacked(s) for t in tensors for s in t.shape)


def _gather_along(ctx: LoopContext, node: torch.fx.Node, source_node: torch.fx.Node, dim: int,
                  index_at: Callable[[tuple], Body], index_rank: int) -> LoopValue:
    """out[..., i_0..i_{k-1}, ...] = source[..., index[i_0..i_{k-1}], ...]: the `index_rank`
    output dimensions at `dim` walk the index tensor, whose value picks the source position."""
    xs = row_vars(out_fake(node).dim())
    return _read_at(ctx, node, source_node, dim, lambda p: (*xs[:dim], p, *xs[dim + index_rank:]),
                    index_at(xs[dim:dim + index_rank]))


def _read_at(ctx: LoopContext, node: torch.fx.Node, source_node: torch.fx.Node, dim: int,
             where: Callable[[sympy.Symbol], tuple], position_value: Body) -> LoopValue:
    """The output element reads the source at `where(p)`, p being `position_value` (an index
    read from data) along the source's dimension `dim`."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    source = ctx.in_memory(source_node)
    position = sympy.Symbol(f"gather_{node.name}", integer=True)
    read = source.at(where(position))
    assert isinstance(read, Load) and not read.indirect, read  # in_memory gives a plain load
    chosen = Indirect(position, position_value, source.sizes[dim])
    return LoopValue(sizes, Load(read.buffer, read.index, read.dtype, (chosen,)), read.dtype)


@register("aten::embedding.default",
          check=lambda n: fake(n.args[0]).dim() == 2 and _gather_check(fake(n.args[0]), fake(n.args[1]), out_fake(n)))
def _embedding(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """Rows of the weight picked by the indices (padding_idx and the rest only matter for the
    backward)."""
    indices = ctx.value(node.args[1])
    return _gather_along(ctx, node, node.args[0], 0, indices.at, len(indices.sizes))


@register("aten::index_select.default",
          check=lambda n: fake(n.args[2]).dim() <= 1 and _gather_check(fake(n.args[0]), fake(n.args[2]), out_fake(n)))
def _index_select(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = node.args[1] % source.dim()
    index = ctx.value(node.args[2])
    if not index.sizes:  # a 0-dim index selects one position; the output keeps the dimension
        return _gather_along(ctx, node, node.args[0], dim, lambda _: index.body, 1)
    return _gather_along(ctx, node, node.args[0], dim, index.at, 1)


@register("aten::gather.default",
          check=lambda n: not arg(n, 3, "sparse_grad", False) and fake(n.args[0]).dim() == fake(n.args[2]).dim()
          and _gather_check(fake(n.args[0]), fake(n.args[2]), out_fake(n)))
def _gather(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[i..] = self[i.. with dimension `dim` replaced by index[i..]] (the output has the
    index's shape, which may be smaller than self's in the other dimensions)."""
    dim = node.args[1] % fake(node.args[0]).dim()
    index = ctx.value(node.args[2])
    xs = row_vars(len(index.sizes))
    return _read_at(ctx, node, node.args[0], dim, lambda p: (*xs[:dim], p, *xs[dim + 1:]), index.at(xs))
