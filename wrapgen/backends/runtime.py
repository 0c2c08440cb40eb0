"""What the generated programs of every target call at run time: operator lookup, and the
errors for inputs a program was not compiled for (one message per mistake, whatever the target).

Only slow paths live here (raising errors); each target keeps its per-call fast path inline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy
import torch

from wrapgen.errors import InputMismatchError


def resolve_op(qualified: str) -> torch._ops.OpOverload:
    """`"aten::addmm.out"` -> `torch.ops.aten.addmm.out`."""
    namespace, rest = qualified.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    return getattr(packet, overload or "default")


def check_arg_count(args: Sequence, expected: int) -> None:
    if len(args) != expected:
        raise InputMismatchError(f"expected {expected} inputs, got {len(args)}")


def input_mismatch(
    name: str,
    value: object,
    sizes: tuple,
    strides: tuple,
    dtype: torch.dtype,
    device: torch.device | None,
) -> None:
    """Raise an error naming the input and the first property that differs (a device of None
    is not checked)."""
    if not isinstance(value, torch.Tensor):
        raise InputMismatchError(f"input {name}: expected a tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise InputMismatchError(f"input {name}: expected dtype {dtype}, got {value.dtype}")
    if device is not None and value.device != device:
        raise InputMismatchError(f"input {name}: expected device {device}, got {value.device}")
    if tuple(value.shape) != tuple(sizes):
        raise InputMismatchError(f"input {name}: expected shape {tuple(sizes)}, got {tuple(value.shape)}")
    actual = value.stride()
    for dim, want in enumerate(strides):
        if want is not None and actual[dim] != want:
            shown = tuple("*" if s is None else s for s in strides)
            raise InputMismatchError(f"input {name}: expected strides {shown}, got {actual}")
    raise InputMismatchError(f"input {name}: does not match the compiled program")


def scalar_mismatch(name: str, value: object, expected: object) -> None:
    raise InputMismatchError(f"input {name}: the program was compiled for the value {expected!r}, got {value!r}")


def symbol_out_of_range(symbol: str, value: int, low: int | None, high: int | None) -> None:
    lower = "-inf" if low is None else low
    upper = "inf" if high is None else high
    raise InputMismatchError(
        f"size symbol {symbol} = {value} is outside [{lower}, {upper}], the range the program was compiled for"
    )


def assert_finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        raise FloatingPointError(f"output {name} contains NaN or Inf")


def with_strides(value: torch.Tensor, sizes: Sequence[int], strides: Sequence[int]) -> torch.Tensor:
    """`value` if its strides are `strides` (dims of size 1 aside), else a copy laid out with
    them: a library result whose layout differs from the one its meta function promised
    (wrapper_ir/layout.py, EnsureStrides)."""
    actual = value.stride()
    if actual == strides:  # the usual case, one C-level tuple comparison
        return value
    if all(size == 1 or actual[d] == strides[d] for d, size in enumerate(sizes)):
        return value
    copy = torch.empty_strided(tuple(sizes), tuple(strides), dtype=value.dtype, device=value.device)
    copy.copy_(value)
    return copy


def evaluate(expr: object, values: Mapping[str, object]) -> object:
    """The value of a size expression, its symbols read from `values` by name (an interpreter's
    environment, or a generated function's locals): an int, a float, or a bool. Python numbers
    pass through."""
    if not isinstance(expr, sympy.Basic):
        return expr
    if expr.free_symbols:
        expr = expr.xreplace({s: sympy.sympify(values[str(s)]) for s in expr.free_symbols})
    if expr.is_Integer:
        return int(expr)
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if expr.is_number and (expr.is_real or expr.is_infinite):
        return float(expr)
    raise TypeError(f"cannot evaluate {expr} to a number")
