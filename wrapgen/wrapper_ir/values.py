"""Plain-data values that Wrapper IR lines carry: tensor references, layouts, call arguments.

Everything here is immutable and free of back-references, so a program can be hashed,
printed, compared and handed to any emitter.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

Expr = sympy.Expr
Shape = tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class TensorRef:
    """A reference, by name, to a tensor value defined earlier in the program."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TensorType:
    """dtype, device and shape of a tensor value (strides only where the IR controls them)."""

    dtype: torch.dtype
    device: torch.device
    sizes: Shape
    strides: Shape | None = None

    def __str__(self) -> str:
        text = f"{dtype_name(self.dtype)}[{format_shape(self.sizes)}]"
        if self.strides is not None:
            text += f" strides [{format_shape(self.strides)}]"
        return f"{text} {self.device}"


# What a line defines: one tensor, a tuple of results, or something untyped (None).
ResultTypeLike = TensorType | tuple | None

# A call argument: a tensor reference, an integer expression, a plain scalar, a torch enum
# value, or a (possibly nested) tuple of those.
Arg = (
    TensorRef
    | sympy.Expr
    | int
    | float
    | bool
    | complex
    | str
    | None
    | torch.dtype
    | torch.device
    | torch.layout
    | torch.memory_format
    | tuple
)

_DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
}


def dtype_name(dtype: torch.dtype) -> str:
    """Short, stable dtype spelling for the IR text (f32, i64, ...)."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def format_expr(expr: object) -> str:
    return str(expr)


def format_shape(shape: Shape) -> str:
    return ", ".join(format_expr(e) for e in shape)


def format_arg(arg: Arg) -> str:
    """Stable text for one call argument."""
    if isinstance(arg, TensorRef):
        return arg.name
    if isinstance(arg, tuple):
        inner = ", ".join(format_arg(a) for a in arg)
        return f"[{inner}]"
    if isinstance(arg, torch.dtype):
        return dtype_name(arg)
    if isinstance(arg, (torch.device, torch.layout, torch.memory_format)):
        return str(arg)
    if isinstance(arg, str):
        return repr(arg)
    if isinstance(arg, float):
        return repr(arg)
    return str(arg)


def arg_tensor_names(arg: Arg) -> list[str]:
    """Names of all tensors an argument refers to, in order."""
    if isinstance(arg, TensorRef):
        return [arg.name]
    if isinstance(arg, tuple):
        return [name for a in arg for name in arg_tensor_names(a)]
    return []


def arg_symbols(arg: Arg) -> set[sympy.Symbol]:
    """Size symbols an argument's expressions refer to."""
    if isinstance(arg, sympy.Basic):
        return set(arg.free_symbols)
    if isinstance(arg, tuple):
        return set().union(*(arg_symbols(a) for a in arg)) if arg else set()
    return set()


def shape_symbols(shape: Shape | None) -> set[sympy.Symbol]:
    if not shape:
        return set()
    return set().union(*(sympy.sympify(e).free_symbols for e in shape))


def storage_elements(sizes: Shape, strides: Shape) -> sympy.Expr:
    """Elements of storage a strided layout spans: 1 + sum((size - 1) * stride), or 0 when empty.

    Sizes of dynamic dims are at least 1 here (symbols are positive), so the formula holds;
    a static zero size gives 0.
    """
    if any(sympy.sympify(size) == 0 for size in sizes):
        return sympy.Integer(0)
    return sympy.Integer(1) + sum(((sympy.sympify(n) - 1) * sympy.sympify(s) for n, s in zip(sizes, strides)), sympy.Integer(0))


def storage_bytes(type_: TensorType) -> sympy.Expr:
    """Bytes a tensor type's layout spans (dense layout when it carries no strides)."""
    strides = type_.strides if type_.strides is not None else contiguous_strides(type_.sizes)
    return storage_elements(type_.sizes, strides) * type_.dtype.itemsize


def contiguous_strides(sizes: Shape) -> Shape:
    strides: list[sympy.Expr] = []
    running = sympy.Integer(1)
    for size in reversed(sizes):
        strides.insert(0, running)
        running = running * sympy.Max(sympy.sympify(size), 1)
    return tuple(strides)


def is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex
