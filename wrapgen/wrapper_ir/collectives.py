"""Collective communication as Wrapper IR lines: a start that launches the collective and
defines its result, and a wait before the result's first read.

Splitting the two is what lets communication overlap computation: every line between a
start and its wait runs while the collective is in flight. The pair is data like any other
line, so every target emits it, the verifier checks it (`InFlight`), and the overlap pass
(`passes/overlap.py`) moves starts up and waits down.

The wait names the collective's input as well as its result: the input's storage is read
by the collective until the wait, so naming it there keeps it alive (and unreusable) until
then for every pass that follows uses, memory planning included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from wrapgen.wrapper_ir.lines import Output, ReuseBuffer, WrapperLine
from wrapgen.wrapper_ir.values import Arg, ResultTypeLike, TensorRef, TensorType, shape_symbols

# The functional collectives (`_c10d_functional::<name>.default`) that become lines, and the
# extra arguments each takes between its input and its group name, in schema order.
COLLECTIVES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("reduce_op",),
    "all_gather_into_tensor": ("group_size",),
    "reduce_scatter_tensor": ("reduce_op", "group_size"),
}
REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor"})
WAIT_OP = "_c10d_functional::wait_tensor.default"


@dataclass(frozen=True)
class CollectiveStart(WrapperLine):
    """Launch `collective` on `input` over the process group named `group` (looked up by
    name when the line runs). `name` holds the result; no line may read it, and no line may
    write or reuse `input`'s storage, before the matching `CollectiveWait`."""

    name: str
    collective: str
    input: str
    group: str
    type: TensorType
    reduce_op: str | None = None
    group_size: int | None = None

    @property
    def op(self) -> str:
        """The functional collective this line runs (`_c10d_functional::all_reduce.default`)."""
        return f"_c10d_functional::{self.collective}.default"

    def op_args(self) -> tuple[Arg, ...]:
        """The op's arguments in schema order: input, reduce_op and/or group_size, group name."""
        extra = tuple(getattr(self, field_name) for field_name in COLLECTIVES.get(self.collective, ()))
        return (TensorRef(self.input), *extra, self.group)

    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    def defined_types(self) -> dict[str, ResultTypeLike]:
        return {self.name: self.type}

    def uses(self) -> tuple[str, ...]:
        return (self.input,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return shape_symbols(self.type.sizes) | shape_symbols(self.type.strides)

    def check(self) -> None:
        extra = COLLECTIVES.get(self.collective)
        if extra is None:
            raise ValueError(f"unknown collective {self.collective!r} (known: {', '.join(COLLECTIVES)})")
        if ("reduce_op" in extra) != (self.reduce_op is not None):
            raise ValueError(f"{self.collective} {'needs' if 'reduce_op' in extra else 'takes no'} reduce_op")
        if self.reduce_op is not None and self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce_op {self.reduce_op!r} (known: {', '.join(sorted(REDUCE_OPS))})")
        if ("group_size" in extra) != (self.group_size is not None):
            raise ValueError(f"{self.collective} {'needs' if 'group_size' in extra else 'takes no'} group_size")
        if self.group_size is not None and (isinstance(self.group_size, bool) or self.group_size < 1):
            raise ValueError(f"group_size must be a positive int, got {self.group_size!r}")
        if self.input == self.name:
            raise ValueError("a collective's result is a new tensor, not its input")
        if self.type.strides is not None and len(self.type.strides) != len(self.type.sizes):
            raise ValueError("the result needs one stride per size")

    def format(self) -> str:
        parts = [self.input]
        parts += [f"{k}={getattr(self, k)!r}" for k in COLLECTIVES.get(self.collective, ())]
        return f"{self.name}: {self.type} = collective_start {self.collective}({', '.join(parts)}) group {self.group!r}"


@dataclass(frozen=True)
class CollectiveWait(WrapperLine):
    """Block until the collective that defined `name` is done: from here `name` may be read,
    and `input` (the collective's input, named so it stays alive until here) may be written,
    freed or reused."""

    name: str
    input: str

    def uses(self) -> tuple[str, ...]:
        return (self.name, self.input)

    def format(self) -> str:
        return f"collective_wait {self.name}  (input {self.input})"


@dataclass
class InFlight:
    """The verifier's view of collectives in flight: which names and storages each holds.

    `root` maps every name to the storage it views (a pooled buffer counts as its own: the
    pool planner keeps live buffers apart), so a write through a view of an in-flight input
    is caught too.
    """

    root: dict[str, str] = field(default_factory=dict)
    started: dict[str, tuple[int, CollectiveStart]] = field(default_factory=dict)  # result -> (line, start)

    def _storage(self) -> dict[str, tuple[str, int]]:
        """Root of every in-flight storage -> (what holds it, start line)."""
        held: dict[str, tuple[str, int]] = {}
        for result, (number, start) in self.started.items():
            held[self.root.get(start.input, start.input)] = (f"input {start.input}", number)
            held[self.root.get(result, result)] = (f"result {result}", number)
        return held

    def check(self, line: WrapperLine) -> None:
        """Raise ValueError when `line` breaks an in-flight collective (before it is applied)."""
        if isinstance(line, CollectiveWait):
            entry = self.started.get(line.name)
            if entry is None:
                raise ValueError(f"waits for {line.name}, which no collective in flight defines")
            if entry[1].input != line.input:
                raise ValueError(f"names input {line.input}, but the collective started at line {entry[0]} reads {entry[1].input}")
            return
        if isinstance(line, Output) and self.started:
            pending = ", ".join(f"{name} (started at line {n})" for name, (n, _) in self.started.items())
            raise ValueError(f"the program ends with collectives never waited for: {pending}")
        for name in line.uses():
            if name in self.started:
                raise ValueError(f"reads {name} before its collective (started at line {self.started[name][0]}) is waited for")
        for name in line.frees():
            if name in self.started:
                raise ValueError(f"frees {name} while its collective (started at line {self.started[name][0]}) is in flight")
        held = self._storage()
        if not held:
            return
        written = list(getattr(line, "writes", ()))
        if isinstance(line, ReuseBuffer):
            written.append(line.source)
        for name in written:
            entry = held.get(self.root.get(name, name))
            if entry is not None:
                raise ValueError(
                    f"{'reuses' if isinstance(line, ReuseBuffer) else 'writes'} {name}, whose storage the collective "
                    f"started at line {entry[1]} still uses ({entry[0]})"
                )

    def apply(self, line: WrapperLine, number: int, alias_source: str | None) -> None:
        """Record what `line` defines (`alias_source`: the name whose storage it views, if any)."""
        for name in line.defines():
            self.root[name] = self.root.get(alias_source, alias_source) if alias_source is not None else name
        if isinstance(line, CollectiveStart):
            self.started[line.name] = (number, line)
        elif isinstance(line, CollectiveWait):
            self.started.pop(line.name, None)


__all__ = ["COLLECTIVES", "REDUCE_OPS", "WAIT_OP", "CollectiveStart", "CollectiveWait", "InFlight"]
