"""The sanitizer: run-time checks of the Wrapper IR's rules around every line of a call.

A target calls `before(n, values)` and `after(n, values)` around line n, where `values` maps
names to what they hold now (an interpreter's environment, a generated function's `locals()`):
tensors by their IR names, size symbols by theirs. For each call it
- poisons freshly allocated storage, storage handed to a new buffer, and freed storage no live
  name still needs (memory.py: NaN in every float format), and remembers which line did it, so a
  line that reads such bytes before anything writes them is named;
- compares every live storage before and after each kernel or library call: a changed byte
  outside the buffers the line declares written names the buffer it belongs to;
- checks that a Reinterpret, ReuseBuffer or AllocateFromPool stays inside its storage, and that a
  reused or pooled buffer overlaps no buffer whose data a later line still needs;
- checks every size symbol against the range the program assumes for it;
- replays the versions of the state the program writes (inputs and constants) and checks the
  version each call declares it sees (`state x@v1`): a call that runs before or after a write it
  was placed after or before (a reordering no verifier saw) names the line.
Each finding raises SanitizerError naming the line (number and text) and the buffer. It keeps
every storage of the call alive until the call ends, so addresses are not reused meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from wrapgen.backends.runtime import evaluate
from wrapgen.backends.sanitize.facts import ProgramFacts, declared_writes, derived_from, runs_code
from wrapgen.backends.sanitize.memory import (
    POISON,
    Snapshot,
    StorageKey,
    byte_span,
    element_mask,
    storage_bytes,
    storage_key,
    tensors_in,
)
from wrapgen.errors import SanitizerError
from wrapgen.wrapper_ir.lines import (
    Allocate,
    AllocateFromPool,
    BindSymbol,
    ExternKernel,
    Free,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.passes.state_versions import StateVersions
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import storage_bytes as layout_bytes

Values = Mapping[str, object]


class ProgramSanitizer:
    """The per-program part: facts computed once; `start` begins the checks of one call."""

    def __init__(self, program: Program) -> None:
        self.facts = ProgramFacts(program)

    def hooks(self, number: int) -> tuple[bool, bool]:
        """Whether line `number` needs (before, after): lines that need neither cost nothing."""
        line = self.facts.lines[number]
        before = number in self.facts.reads or runs_code(line) or isinstance(
            line, (Reinterpret, ReuseBuffer, AllocateFromPool, Free))
        after = runs_code(line) or bool(line.defines()) or bool(declared_writes(line)) or isinstance(
            line, (BindSymbol, SymbolicCallArg))
        return before, after

    def start(self, values: Values) -> CallSanitizer:
        return CallSanitizer(self.facts, values)


class CallSanitizer:
    """The checks of one call."""

    def __init__(self, facts: ProgramFacts, values: Values) -> None:
        self.facts = facts
        self.defined_at: dict[str, int] = {}
        self.caller: set[StorageKey] = set()  # inputs' and constants' storage: never poisoned
        for name in facts.inputs + tuple(facts.constants):
            for t in tensors_in(self.value(values, name)):
                self.caller.add(storage_key(t))
        self.stale: dict[StorageKey, torch.Tensor] = {}  # per byte: the line that poisoned it, or 0
        self.kept: dict[StorageKey, torch.Tensor] = {}
        self.regions: dict[str, tuple[int, int]] = {}  # bytes of its storage a name may view
        self.snapshot: Snapshot | None = None
        self.pending: SanitizerError | None = None  # a stale read found before a call line ran
        self.versions = StateVersions(facts.state)

    # -- hooks ---------------------------------------------------------------------------------
    def before(self, number: int, values: Values) -> None:
        line = self.facts.lines[number]
        try:
            self.versions.check(line)
        except ValueError as error:
            raise self.fail(number, None, f"state out of order: {error}") from None
        if number in self.facts.reads:
            try:
                self.check_reads(number, values)
            except SanitizerError as finding:
                if not runs_code(line):
                    raise
                # Raised after the line runs, unless the line wrote those bytes without declaring
                # it: then the undeclared write is the finding (the read was its out= argument).
                self.pending = finding
        if runs_code(line):
            busy = self.facts.in_flight.get(number, ())
            self.snapshot = Snapshot([t for name, t in self.live(values) if name not in busy])
        if isinstance(line, Reinterpret):
            self.check_view(number, line, values)
        elif isinstance(line, (ReuseBuffer, AllocateFromPool)):
            self.check_fits(number, line, values)
        elif isinstance(line, Free):
            self.poison_freed(number, line.name, values)

    def after(self, number: int, values: Values) -> None:
        line = self.facts.lines[number]
        self.versions.apply(line)
        if self.snapshot is not None:
            self.check_writes(number, line, values)
            self.snapshot = None
        if self.pending is not None:
            raise self.pending
        for name in declared_writes(line):
            for t in tensors_in(self.value(values, name)):
                if storage_key(t) in self.stale:
                    self.stale[storage_key(t)][element_mask(t, self.nbytes(t))] = 0
        for name in line.defines():
            self.define(number, line, name, values)
        if isinstance(line, (BindSymbol, SymbolicCallArg)):
            self.check_range(number, line, values)

    # -- names and storage -----------------------------------------------------------------------
    def value(self, values: Values, name: str) -> object:
        found = values.get(name)
        return self.facts.constants.get(name) if found is None else found

    def live(self, values: Values) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor a program name holds now."""
        for name in self.facts.tensor_names:
            for t in tensors_in(self.value(values, name)):
                yield name, t

    def needed(self, name: str, after: int) -> bool:
        """Whether a line after `after` still reads or writes the data `name` holds."""
        return self.facts.needed_until(name, self.defined_at.get(name, 0)) > after

    @staticmethod
    def nbytes(t: torch.Tensor) -> int:
        return t.untyped_storage().nbytes()

    def region(self, name: str, t: torch.Tensor) -> tuple[int, int]:
        return self.regions.get(name, (0, self.nbytes(t)))

    def define(self, number: int, line: WrapperLine, name: str, values: Values) -> None:
        self.defined_at[name] = number
        tensors = list(tensors_in(values.get(name)))
        if isinstance(line, ExternKernel) and line.alias_of is None:
            self.check_fresh(number, name, tensors, values)
        for t in tensors:
            self.kept.setdefault(storage_key(t), storage_bytes(t))
        self.regions.pop(name, None)
        source = derived_from(line)
        if source is not None and source in self.regions:
            self.regions[name] = self.regions[source]
        if len(tensors) != 1:
            return
        (t,) = tensors
        if isinstance(line, Allocate):
            self.poison(number, t, torch.ones(self.nbytes(t), dtype=torch.bool, device=t.device))
        elif isinstance(line, (ReuseBuffer, AllocateFromPool)):
            if isinstance(line, AllocateFromPool):  # its slot of the pool; a reused buffer keeps its source's storage
                start = t.storage_offset() * t.element_size()
                self.regions[name] = (start, start + int(evaluate(layout_bytes(line.type), values)))  # type: ignore[call-overload]
            elif line.source in self.regions:
                self.regions[name] = self.regions[line.source]
            self.check_overlap(number, line, t, values)
            if number not in self.facts.in_place:
                self.poison(number, t, element_mask(t, self.nbytes(t)))

    def poison(self, number: int, t: torch.Tensor, mask: torch.Tensor) -> None:
        key = storage_key(t)
        if key in self.caller or self.nbytes(t) == 0:
            return
        storage_bytes(t)[mask] = POISON
        if key not in self.stale:
            self.stale[key] = torch.zeros(self.nbytes(t), dtype=torch.int32, device=t.device)
        self.stale[key][mask] = number

    # -- checks ------------------------------------------------------------------------------------
    def fail(self, number: int, buffer: str | None, problem: str) -> SanitizerError:
        return SanitizerError(number, self.facts.texts[number], buffer, problem)

    def poison_freed(self, number: int, name: str, values: Values) -> None:
        """Poison the bytes of `name` that no other name still needs."""
        for t in tensors_in(self.value(values, name)):
            key, size = storage_key(t), self.nbytes(t)
            if key in self.caller or size == 0:
                continue
            mask = element_mask(t, size)
            for other, u in self.live(values):
                if other != name and storage_key(u) == key and self.needed(other, number):
                    mask &= ~element_mask(u, size)
            self.poison(number, t, mask)

    def check_reads(self, number: int, values: Values) -> None:
        for name in self.facts.reads[number]:
            for t in tensors_in(self.value(values, name)):
                stale = self.stale.get(storage_key(t))
                if stale is None:
                    continue
                found = stale[element_mask(t, self.nbytes(t))]
                found = found[found != 0]
                if found.numel():
                    raise self.fail(number, name, f"reads {name}, whose data is stale: {self.why_stale(int(found[0]))}")

    def why_stale(self, at: int) -> str:
        line, text = self.facts.lines[at], self.facts.texts[at]
        if isinstance(line, Free):
            return f"its storage was freed at line {at} ({text}) and not written since"
        if isinstance(line, Allocate):
            return f"it was allocated at line {at} ({text}) and never written"
        return f"its storage was handed to {line.defines()[0]} at line {at} ({text}) and not written since"

    def check_writes(self, number: int, line: WrapperLine, values: Values) -> None:
        assert self.snapshot is not None
        declared: dict[StorageKey, torch.Tensor] = {}
        for name in declared_writes(line):
            for t in tensors_in(self.value(values, name)):
                mask = element_mask(t, self.nbytes(t))
                key = storage_key(t)
                declared[key] = declared[key] | mask if key in declared else mask
        for key, diff in self.snapshot.changed():
            if key in declared:
                diff &= ~declared[key]
            if not bool(diff.any()):
                continue
            first = int(diff.nonzero()[0, 0])
            owners = [n for n, t in self.live(values) if storage_key(t) == key and bool(element_mask(t, diff.numel())[first])]
            owner = next((n for n in owners if self.needed(n, number)), owners[0] if owners else None)
            what = owner if owner is not None else "storage no live name covers"
            raise self.fail(number, owner, f"writes {what} (byte {first} of its storage changed), "
                                           f"which the line does not declare written")

    def check_fresh(self, number: int, name: str, tensors: list[torch.Tensor], values: Values) -> None:
        """A library result the line does not declare an alias must not share storage with a name:
        memory planning would take that storage as dead at the name's Free."""
        keys = {storage_key(t) for t in tensors if self.nbytes(t) > 0}
        for other, u in self.live(values):
            if other != name and storage_key(u) in keys:
                raise self.fail(number, other, f"returns a tensor sharing storage with {other}, "
                                               f"which the line does not declare (alias_of)")

    def check_view(self, number: int, line: Reinterpret, values: Values) -> None:
        source = self.value(values, line.source)
        if not isinstance(source, torch.Tensor):
            return
        sizes = [int(evaluate(s, values)) for s in line.sizes]  # type: ignore[call-overload]
        strides = [int(evaluate(s, values)) for s in line.strides]  # type: ignore[call-overload]
        offset = source.storage_offset() + int(evaluate(line.offset, values))  # type: ignore[call-overload]
        if any(n == 0 for n in sizes):
            return
        k = line.dtype.itemsize
        low = offset + sum((n - 1) * s for n, s in zip(sizes, strides) if s < 0)
        high = offset + sum((n - 1) * s for n, s in zip(sizes, strides) if s > 0) + 1
        self.check_inside(number, line.source, source, low * k, high * k, "a view of")

    def check_fits(self, number: int, line: ReuseBuffer | AllocateFromPool, values: Values) -> None:
        source_name = line.source if isinstance(line, ReuseBuffer) else line.pool
        source = self.value(values, source_name)
        if not isinstance(source, torch.Tensor):
            return
        start = 0 if isinstance(line, ReuseBuffer) else int(evaluate(line.offset, values))  # type: ignore[call-overload]
        end = start + int(evaluate(layout_bytes(line.type), values))  # type: ignore[call-overload]
        self.check_inside(number, source_name, source, start, end, f"{line.name}, placed in")

    def check_inside(self, number: int, name: str, t: torch.Tensor, low: int, high: int, what: str) -> None:
        region = self.region(name, t)
        if low < region[0] or high > region[1]:
            raise self.fail(number, name, f"{what} {name} spans bytes [{low}, {high}) of its storage, past "
                                          f"{name}'s storage (bytes [{region[0]}, {region[1]}))")

    def check_overlap(self, number: int, line: ReuseBuffer | AllocateFromPool, t: torch.Tensor, values: Values) -> None:
        """A reused or pooled buffer must not overlap data a later line still needs."""
        key, size = storage_key(t), self.nbytes(t)
        span = byte_span(t)
        mask: torch.Tensor | None = None
        for other, u in self.live(values):
            if other == line.name or storage_key(u) != key or not self.needed(other, number):
                continue
            if isinstance(line, ReuseBuffer) and other == line.source and number in self.facts.in_place:
                continue
            low, high = byte_span(u)
            if high <= span[0] or span[1] <= low:
                continue
            mask = element_mask(t, size) if mask is None else mask
            if bool((mask & element_mask(u, size)).any()):
                until = self.facts.needed_until(other, self.defined_at.get(other, 0))
                raise self.fail(number, other, f"gives {line.name} storage that {other} still uses (until line {until})")

    def check_range(self, number: int, line: BindSymbol | SymbolicCallArg, values: Values) -> None:
        symbol = str(line.symbol)
        value = values.get(symbol)
        if not isinstance(value, (int, float)):
            return
        bounds = [(line.min, line.max)] if isinstance(line, BindSymbol) else []
        info = self.facts.symbol_info.get(symbol)
        if info is not None:
            bounds.append((info.min, info.max))
        for low, high in bounds:
            if (low is not None and value < low) or (high is not None and value > high):
                shown = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                raise self.fail(number, None, f"size symbol {symbol} = {value} is outside {shown}, "
                                              f"the range the program assumes")
