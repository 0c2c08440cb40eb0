"""Wrapper IR line types.

Each line is a frozen dataclass holding only data. A line reports what it reads, defines,
frees and which size symbols it binds or uses, so passes and the verifier never need to
know the concrete type; `check()` validates what the line can know about itself, and
`format()` gives its stable text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy
import torch

from wrapgen.wrapper_ir.values import (
    Arg,
    ResultTypeLike,
    Shape,
    TensorType,
    arg_symbols,
    arg_tensor_names,
    dtype_name,
    format_arg,
    format_shape,
    is_floating,
    shape_symbols,
)

# Stands for the observed runtime value in a BindSymbol's solving expression.
OBSERVED = sympy.Symbol("observed", integer=True)


class WrapperLine:
    """Base of all Wrapper IR lines."""

    def defines(self) -> tuple[str, ...]:
        """Tensor names this line brings into scope."""
        return ()

    def uses(self) -> tuple[str, ...]:
        """Tensor names this line reads (or writes in place)."""
        return ()

    def defined_types(self) -> dict[str, ResultTypeLike]:
        """The type of each name this line defines (None where the line cannot know it)."""
        return {name: None for name in self.defines()}

    def frees(self) -> tuple[str, ...]:
        return ()

    def binds(self) -> tuple[sympy.Symbol, ...]:
        """Size symbols this line gives a value to."""
        return ()

    def symbols_used(self) -> set[sympy.Symbol]:
        return set()

    def check(self) -> None:
        """Raise ValueError naming what is wrong with the line taken on its own."""

    def format(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class BindSymbol(WrapperLine):
    """Give `symbol` its value from a tensor's size, stride or storage offset, a scalar input's
    value, or a one-element tensor's data (`item`: `.item()` / `.tolist()` in the program).

    `expr` computes the symbol from the observed quantity (the symbol `OBSERVED`) and from
    symbols bound earlier; for a size `2*s0` it is `observed/2`. `min`/`max` are the range
    the program was compiled for (None: unbounded) and are checked at call time where a value
    could fall outside it (`checked_bounds`).
    """

    symbol: sympy.Symbol
    source: str
    kind: Literal["size", "stride", "offset", "value", "item"]
    dim: int | None
    expr: sympy.Expr
    min: int | None = 0
    max: int | None = None

    def uses(self) -> tuple[str, ...]:
        return (self.source,)

    def binds(self) -> tuple[sympy.Symbol, ...]:
        return (self.symbol,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return set(self.expr.free_symbols) - {OBSERVED}

    def observed_text(self) -> str:
        if self.kind == "value":
            return self.source
        if self.kind == "item":
            return f"{self.source}.item()"
        if self.kind == "offset":
            return f"{self.source}.storage_offset()"
        return f"{self.source}.{self.kind}({self.dim})"

    def checked_bounds(self) -> tuple[int | None, int | None]:
        """(lower, upper) bounds the emitted code must check, None where no check is needed: a
        size, stride or offset is never negative, so a lower bound of 0 holds by itself; a
        scalar input's 0 is the default, not a promise; data read with `item` may be anything."""
        lower = self.min
        if lower is not None and lower <= 0 and self.kind != "item":
            lower = None
        return lower, self.max

    def check(self) -> None:
        if (self.kind in ("size", "stride")) != (self.dim is not None):
            raise ValueError("size/stride bindings need a dim; value, item and offset bindings take none")
        if self.symbol in self.expr.free_symbols:
            raise ValueError(f"{self.symbol} is defined in terms of itself")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"empty range [{self.min}, {self.max}] for {self.symbol}")

    def format(self) -> str:
        observed = self.observed_text()
        value = observed if self.expr == OBSERVED else str(self.expr).replace("observed", observed)
        lower = "-inf" if self.min is None else str(self.min)
        upper = "inf" if self.max is None else str(self.max)
        return f"bind {self.symbol} = {value}  in [{lower}, {upper}]"


@dataclass(frozen=True)
class AssertInput(WrapperLine):
    """Check a tensor input's dtype, device, sizes and strides (None: stride not checked).

    A device of None is not checked: attention's philox seed and offset are host tensors in
    eager but device tensors under CUDA-graph capture, and the ops that read them take either.
    """

    name: str
    dtype: torch.dtype
    device: torch.device | None
    sizes: Shape
    strides: tuple[sympy.Expr | None, ...]

    def uses(self) -> tuple[str, ...]:
        return (self.name,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return shape_symbols(self.sizes) | shape_symbols(tuple(s for s in self.strides if s is not None))

    def check(self) -> None:
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.strides)} strides")

    def format(self) -> str:
        strides = ", ".join("*" if s is None else str(s) for s in self.strides)
        return (
            f"assert_input {self.name}: {dtype_name(self.dtype)}[{format_shape(self.sizes)}]"
            f" strides [{strides}] {'any device' if self.device is None else self.device}"
        )


@dataclass(frozen=True)
class AssertScalar(WrapperLine):
    """Check that a number input equals the value the program was specialized for."""

    name: str
    expected: int | float | bool

    def uses(self) -> tuple[str, ...]:
        return (self.name,)

    def format(self) -> str:
        return f"assert_scalar {self.name} == {self.expected!r}"


def _layout_symbols(type_: TensorType) -> set[sympy.Symbol]:
    return shape_symbols(type_.sizes) | shape_symbols(type_.strides)


def _check_layout(type_: TensorType, what: str) -> None:
    if type_.strides is None or len(type_.strides) != len(type_.sizes):
        raise ValueError(f"{what} needs one stride per size")


@dataclass(frozen=True)
class Allocate(WrapperLine):
    """A new, uninitialized buffer with the given layout."""

    name: str
    type: TensorType

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: self.type}

    def symbols_used(self) -> set[sympy.Symbol]:
        return _layout_symbols(self.type)

    def check(self) -> None:
        _check_layout(self.type, "an allocation")

    def format(self) -> str:
        return f"{self.name} = allocate {self.type}"


@dataclass(frozen=True)
class ReuseBuffer(WrapperLine):
    """Memory planning: `name` views the storage behind `source` with a new layout (the
    storage is at least as large as the layout needs). `source`'s name stays valid until its
    own Free: right away when its storage was dead, or after the line that reads it while
    writing `name` in place."""

    name: str
    source: str
    type: TensorType

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: self.type}

    def uses(self) -> tuple[str, ...]:
        return (self.source,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return _layout_symbols(self.type)

    def check(self) -> None:
        _check_layout(self.type, "a reused buffer")
        if self.name == self.source:
            raise ValueError("a buffer cannot reuse itself")

    def format(self) -> str:
        return f"{self.name} = reuse {self.source} as {self.type}"


@dataclass(frozen=True)
class AllocateFromPool(WrapperLine):
    """Memory planning: a buffer placed at a byte offset inside a pool (a u8 buffer)."""

    name: str
    pool: str
    offset: sympy.Expr
    type: TensorType

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: self.type}

    def uses(self) -> tuple[str, ...]:
        return (self.pool,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return _layout_symbols(self.type) | set(sympy.sympify(self.offset).free_symbols)

    def check(self) -> None:
        _check_layout(self.type, "a pooled buffer")

    def format(self) -> str:
        return f"{self.name} = from_pool {self.pool} at {self.offset} as {self.type}"


@dataclass(frozen=True)
class Free(WrapperLine):
    """Release a name; its storage goes when no other name still refers to it."""

    name: str

    def frees(self) -> tuple[str, ...]:
        return (self.name,)

    def format(self) -> str:
        return f"free {self.name}"


@dataclass(frozen=True)
class Reinterpret(WrapperLine):
    """A view of `source`'s storage: sizes, strides, and an offset relative to the source's."""

    name: str
    source: str
    dtype: torch.dtype
    device: torch.device
    sizes: Shape
    strides: Shape
    offset: sympy.Expr = sympy.Integer(0)

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def uses(self) -> tuple[str, ...]:
        return (self.source,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: TensorType(self.dtype, self.device, self.sizes, self.strides)}

    def symbols_used(self) -> set[sympy.Symbol]:
        return shape_symbols(self.sizes) | shape_symbols(self.strides) | set(sympy.sympify(self.offset).free_symbols)

    def check(self) -> None:
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.strides)} strides")

    def format(self) -> str:
        return (
            f"{self.name} = reinterpret {self.source} as {dtype_name(self.dtype)}[{format_shape(self.sizes)}]"
            f" strides [{format_shape(self.strides)}] offset {self.offset} {self.device}"
        )


@dataclass(frozen=True)
class ExternKernel(WrapperLine):
    """A call of a library (ATen) operator, named by its qualified overload (`aten::addmm.out`).

    `name` receives the op's return value (None when it is not needed, e.g. for out= calls).
    `writes` lists existing buffers the call writes (out= arguments, in-place targets);
    `alias_of` names the buffer whose storage the result shares, for view-like calls.
    """

    name: str | None
    op: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...] = ()
    result: ResultTypeLike = None
    writes: tuple[str, ...] = ()
    alias_of: str | None = None
    # (storage, version) of each input or constant the program writes somewhere that this line
    # reads or writes: the version it must see (passes/state_versions.py; the verifier checks it)
    state: tuple[tuple[str, int], ...] = ()

    def defines(self) -> tuple[str, ...]:
        return () if self.name is None else (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {} if self.name is None else {self.name: self.result}

    def uses(self) -> tuple[str, ...]:
        names = arg_tensor_names(self.args) + arg_tensor_names(tuple(v for _, v in self.kwargs))
        return tuple(dict.fromkeys(names))

    def symbols_used(self) -> set[sympy.Symbol]:
        return arg_symbols(self.args) | arg_symbols(tuple(v for _, v in self.kwargs))

    def check(self) -> None:
        if "::" not in self.op:
            raise ValueError(f"operator name {self.op!r} is not qualified (namespace::name.overload)")
        missing = set(self.writes) - set(self.uses())
        if missing:
            raise ValueError(f"writes {sorted(missing)} which are not among its arguments")
        if self.name is None and self.alias_of is not None:
            raise ValueError("an unnamed result cannot alias a buffer")

    def format(self) -> str:
        parts = [format_arg(a) for a in self.args] + [f"{k}={format_arg(v)}" for k, v in self.kwargs]
        text = f"extern {self.op}({', '.join(parts)})"
        if self.name is not None:
            result = self.result
            kind = (
                f"({', '.join(str(t) for t in result)})" if isinstance(result, tuple) else str(result)
            )
            text = f"{self.name}: {kind} = {text}"
        if self.writes:
            text += f"  writes {', '.join(self.writes)}"
        if self.alias_of is not None:
            text += f"  aliases {self.alias_of}"
        return text + format_state(self.state)


@dataclass(frozen=True)
class MultiOutput(WrapperLine):
    """Pick one tensor out of a tuple-valued result by index path."""

    name: str
    source: str
    index: tuple[int, ...]
    type: TensorType

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: self.type}

    def uses(self) -> tuple[str, ...]:
        return (self.source,)

    def format(self) -> str:
        path = "".join(f"[{i}]" for i in self.index)
        return f"{self.name}: {self.type} = {self.source}{path}"


@dataclass(frozen=True)
class KernelDefinition(WrapperLine):
    """A generated kernel: its source, in the kernel's own language, is data."""

    name: str
    language: str
    source: str
    metadata: tuple[tuple[str, Arg], ...] = ()

    def format(self) -> str:
        meta = ", ".join(f"{k}={format_arg(v)}" for k, v in self.metadata)
        digest = f"{len(self.source.splitlines())} lines"
        return f"kernel {self.name} [{self.language}] ({digest}){' ' + meta if meta else ''}"


@dataclass(frozen=True)
class SymbolicCallArg(WrapperLine):
    """Compute an integer expression once on the host and bind it to a fresh symbol."""

    symbol: sympy.Symbol
    expr: sympy.Expr

    def binds(self) -> tuple[sympy.Symbol, ...]:
        return (self.symbol,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return set(self.expr.free_symbols)

    def format(self) -> str:
        return f"{self.symbol} = {self.expr}"


@dataclass(frozen=True)
class KernelCall(WrapperLine):
    """Launch a kernel defined by a KernelDefinition with arguments and a launch grid."""

    kernel: str
    args: tuple[Arg, ...]
    grid: tuple[sympy.Expr, ...] = ()
    writes: tuple[str, ...] = ()
    # (output, input) pairs that may share storage: the kernel reads the input only at the
    # element it writes, before writing it. Memory planning may then write in place.
    may_alias: tuple[tuple[str, str], ...] = ()
    state: tuple[tuple[str, int], ...] = ()  # as ExternKernel's

    def uses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(arg_tensor_names(self.args)))

    def symbols_used(self) -> set[sympy.Symbol]:
        return arg_symbols(self.args) | arg_symbols(self.grid)

    def check(self) -> None:
        used = set(self.uses())
        for out, source in self.may_alias:
            if out not in self.writes or source not in used:
                raise ValueError(f"may_alias pair ({out}, {source}) must name a written buffer and an argument")

    def format(self) -> str:
        grid = f" grid [{format_shape(self.grid)}]" if self.grid else ""
        text = f"call {self.kernel}({', '.join(format_arg(a) for a in self.args)}){grid}"
        text += f"  writes {', '.join(self.writes)}" if self.writes else ""
        text += f"  may alias {', '.join(f'{o}<-{i}' for o, i in self.may_alias)}" if self.may_alias else ""
        return text + format_state(self.state)


def format_state(state: tuple[tuple[str, int], ...]) -> str:
    """`  state x@v1, y@v0`: the versions of state storage a line sees (v0: as the call began)."""
    return f"  state {', '.join(f'{name}@v{version}' for name, version in state)}" if state else ""


@dataclass(frozen=True)
class AssertFinite(WrapperLine):
    """Fail the call if a floating-point tensor holds NaN or Inf (a debugging aid)."""

    name: str
    dtype: torch.dtype

    def uses(self) -> tuple[str, ...]:
        return (self.name,)

    def check(self) -> None:
        if not is_floating(self.dtype):
            raise ValueError(f"{self.name} has dtype {dtype_name(self.dtype)}, which cannot hold NaN")

    def format(self) -> str:
        return f"assert_finite {self.name}"


@dataclass(frozen=True)
class Comment(WrapperLine):
    text: str

    def check(self) -> None:
        if "\n" in self.text:
            raise ValueError("a comment is one line")

    def format(self) -> str:
        return f"# {self.text}"


@dataclass(frozen=True)
class Output(WrapperLine):
    """The program's results, in order: tensors, integer expressions or constants."""

    values: tuple[Arg, ...]

    def uses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(arg_tensor_names(self.values)))

    def symbols_used(self) -> set[sympy.Symbol]:
        return arg_symbols(self.values)

    def format(self) -> str:
        inner = ", ".join(format_arg(v) for v in self.values)
        return f"return ({inner},)" if len(self.values) == 1 else f"return ({inner})"


__all__ = [
    "OBSERVED",
    "WrapperLine",
    "BindSymbol",
    "AssertInput",
    "AssertScalar",
    "Allocate",
    "Free",
    "ReuseBuffer",
    "AllocateFromPool",
    "Reinterpret",
    "ExternKernel",
    "MultiOutput",
    "KernelDefinition",
    "SymbolicCallArg",
    "KernelCall",
    "AssertFinite",
    "Comment",
    "Output",
]
