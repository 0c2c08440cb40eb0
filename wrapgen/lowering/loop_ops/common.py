"""What every loop lowering shares: the registry of lowerings (`register`, `supported`), the
`LoopContext` they are handed, and the helpers that turn fx arguments into bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import HALF_DTYPES, Apply, Body, Const, IndexValue, LoopValue, compute_dtype, row_vars
from wrapgen.lowering.loop_ops.recompute import compute_once_before_broadcast

# Half precision loads, stores and casts; its arithmetic is float32 (loop_ir.compute_dtype).
SUPPORTED_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
) | HALF_DTYPES


class LoopContext(Protocol):
    def value(self, arg: object) -> LoopValue: ...
    def shape(self, values: object) -> tuple[sympy.Expr, ...]: ...
    def reduce(self, value: LoopValue, dims: tuple[int, ...], keepdim: bool, kind: str, dtype: torch.dtype, origin: str) -> LoopValue: ...
    def computed_once(self, arg: torch.fx.Node) -> LoopValue: ...
    def in_memory(self, arg: torch.fx.Node) -> LoopValue: ...
    def realize(self, value: LoopValue, fake: torch.Tensor, origin: str) -> object: ...
    def load(self, buffer: object) -> LoopValue: ...
    def fresh(self, prefix: str = "buf") -> str: ...
    lines: list  # the program's lines so far (a lowering that is a kernel of its own appends to them)
    language: str | None  # the kernel language: "triton" computes a one-element value once per block


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
        if any(is_unbacked(s) for s in f.shape):
            return False
    for arg in node.all_input_nodes:
        f = arg.meta.get("val")
        if isinstance(f, torch.Tensor) and (f.dtype not in SUPPORTED_DTYPES or f.device.type != device_type):
            return False
        if not isinstance(f, (torch.Tensor, torch.SymInt, int)) or isinstance(f, bool):  # no float sizes
            return False
        if isinstance(f, torch.Tensor) and any(is_unbacked(s) for s in f.shape):
            return False
    check = CHECKS.get(key)
    return check is None or check(node)


def is_unbacked(size: object) -> bool:
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
    """`body` converted to `dtype`; a cast to a half dtype rounds (an fp32 value to fp32 does not)."""
    if body.dtype == dtype:
        return body
    if isinstance(body, Const):
        return Const(convert_scalar(body.value, dtype), dtype)
    return Apply("cast", (body,), dtype)


def convert_scalar(value: object, dtype: torch.dtype) -> object:
    """A Python number as an element of a `dtype` tensor holds it (rounded for half dtypes)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype in HALF_DTYPES:
        # through float32, as c10 converts a double to bfloat16 / half
        return float(torch.tensor(float(value), dtype=torch.float32).to(dtype))
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
    """An argument (tensor node, number or size expression) as a body of `dtype` at the output index.

    Arithmetic passes its compute dtype (`compute_dtype`): a number then keeps float32
    precision in a half op, as in Inductor and eager's mul and div (eager's add rounds it)."""
    if isinstance(x, torch.fx.Node):
        value = ctx.value(x)
        if compute_once_before_broadcast(value, sizes, ctx.language):  # see recompute.py
            value = ctx.computed_once(x)
        return cast(broadcast(value, sizes), dtype)
    if isinstance(x, sympy.Basic):
        return cast(IndexValue(x, torch.int64), dtype)
    return Const(convert_scalar(x, dtype), dtype)


def element_operand(ctx: LoopContext, x: object, sizes: tuple, dtype: torch.dtype) -> Body:
    """An argument that becomes an element of a `dtype` tensor (where, clamp bounds, fill
    values, comparisons), in `dtype`'s compute type: a number is rounded to `dtype` first, as
    eager converts it; a tensor's value is taken as computed."""
    if isinstance(x, torch.fx.Node):
        return operand(ctx, x, sizes, compute_dtype(dtype))
    return cast(operand(ctx, x, sizes, dtype), compute_dtype(dtype))


def _scalar_ok(x: object) -> bool:
    return isinstance(x, (torch.fx.Node, bool, int, float)) and not isinstance(x, complex)


def all_args_ok(node: torch.fx.Node) -> bool:
    values = list(node.args) + list(node.kwargs.values())
    return all(_scalar_ok(v) or v is None or isinstance(v, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)) for v in values)


def zero(dtype: torch.dtype) -> Const:
    return Const(convert_scalar(0, dtype), dtype)
