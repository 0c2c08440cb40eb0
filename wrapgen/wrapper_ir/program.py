"""`Program`: the whole Wrapper IR of one compiled graph, and its stable text form."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import sympy
import torch

from wrapgen.wrapper_ir.lines import Output, WrapperLine
from wrapgen.wrapper_ir.values import Arg, TensorType


@dataclass(frozen=True)
class TensorInput:
    """A tensor argument of `call(args)`; sizes and strides are expressions of size symbols.

    `static`: the caller hands the same storage at the same address on every call (a parameter or
    buffer that torch.compile lifts to an input), so what a program derives from it alone (a
    weight's transposed view) may be kept between calls, checked by its address."""

    name: str
    type: TensorType
    static: bool = False

    def format(self) -> str:
        return f"{self.name}: {self.type}{'  static' if self.static else ''}"


@dataclass(frozen=True)
class ScalarInput:
    """A Python number argument of `call(args)` (a symbolic size passed by torch.compile)."""

    name: str
    kind: type = int

    def format(self) -> str:
        return f"{self.name}: {self.kind.__name__}"


ProgramInput = TensorInput | ScalarInput


@dataclass(frozen=True)
class SymbolInfo:
    """A size symbol: the value it had when compiled (`hint`) and the range allowed."""

    symbol: sympy.Symbol
    hint: int
    min: int | None = 0  # None: unbounded (a value read from tensor data)
    max: int | None = None

    def format(self) -> str:
        lower = "-inf" if self.min is None else str(self.min)
        upper = "inf" if self.max is None else str(self.max)
        return f"{self.symbol} (hint {self.hint}, range [{lower}, {upper}])"


@dataclass(frozen=True)
class Constant:
    """A tensor the program owns (parameter, buffer, lifted constant).

    `value` travels with the program so targets can embed or ship it; it takes no part in
    comparison or the text form. `permutation`, when set, says the constant is its origin's
    tensor permuted so and made contiguous (a layout the compiler chose: a K-major weight), so
    whatever hands the program a new value for the origin lays it out the same way.
    """

    name: str
    type: TensorType
    origin: str = ""
    value: torch.Tensor | None = field(default=None, compare=False, repr=False)
    permutation: tuple[int, ...] | None = None

    def format(self) -> str:
        origin = f"  # {self.origin}" if self.origin and self.origin != self.name else ""
        made = f" = permute({self.origin or '?'}, {list(self.permutation)}).contiguous()" if self.permutation else ""
        return f"{self.name}: {self.type}{made}{origin}"


@dataclass(frozen=True)
class Program:
    """Inputs, size symbols, constants and lines of one compiled graph; the last line is `Output`."""

    name: str
    inputs: tuple[ProgramInput, ...]
    symbols: tuple[SymbolInfo, ...]
    constants: tuple[Constant, ...]
    lines: tuple[WrapperLine, ...]
    metadata: tuple[tuple[str, Arg], ...] = ()

    @property
    def outputs(self) -> tuple[Arg, ...]:
        for line in reversed(self.lines):
            if isinstance(line, Output):
                return line.values
        return ()

    def with_lines(self, lines: list[WrapperLine] | tuple[WrapperLine, ...]) -> Program:
        return replace(self, lines=tuple(lines))

    def value_types(self) -> dict[str, object]:
        """Type of every tensor name: inputs, constants, and what each line defines."""
        types: dict[str, object] = {i.name: i.type for i in self.inputs if isinstance(i, TensorInput)}
        types.update({c.name: c.type for c in self.constants})
        for line in self.lines:
            types.update(line.defined_types())
        return types

    def constant_values(self) -> dict[str, torch.Tensor]:
        return {c.name: c.value for c in self.constants if c.value is not None}

    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    def static_input_names(self) -> list[str]:
        return [i.name for i in self.inputs if isinstance(i, TensorInput) and i.static]

    def with_static_inputs(self, names: Iterable[str]) -> Program:
        """The program with `names` (tensor inputs) marked static."""
        chosen = set(names)
        unknown = chosen - {i.name for i in self.inputs if isinstance(i, TensorInput)}
        if unknown:
            raise ValueError(f"program {self.name}: no tensor input named {', '.join(sorted(unknown))}")
        inputs = tuple(replace(i, static=True) if i.name in chosen else i for i in self.inputs)
        return replace(self, inputs=inputs)

    def __str__(self) -> str:
        return format_program(self)


def format_program(program: Program) -> str:
    """The stable text form: header, symbols, constants, then numbered lines."""
    out = [f"program {program.name}("]
    out += [f"    {i.format()}," for i in program.inputs]
    out.append(")")
    if program.symbols:
        out.append("symbols:")
        out += [f"    {s.format()}" for s in program.symbols]
    if program.constants:
        out.append("constants:")
        out += [f"    {c.format()}" for c in program.constants]
    for key, value in program.metadata:
        out.append(f"{key}: {value}")
    out.append("lines:")
    width = len(str(len(program.lines)))
    out += [f"  {n:>{width}}  {line.format()}" for n, line in enumerate(program.lines, start=1)]
    return "\n".join(out) + "\n"
