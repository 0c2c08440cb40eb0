"""Buffer reuse: an allocation takes over storage that dies before (or at) its first write.

Two cases, both expressed as IR so every target follows the plan; a reuse that would raise
the program's peak (holding dead storage while other buffers are allocated) is skipped:
- a dead buffer: its last `Free` moves up to just after a `ReuseBuffer` that hands its
  storage to a later allocation of the same device and element size;
- in place: an elementwise library call, or a generated kernel that declares the pair in
  `may_alias`, whose input dies at that very call writes its result over the input (same
  layout; each element is read before it is written). A generated kernel may also write over
  a library call's result (a convolution's, under a fused BatchNorm + ReLU) when the program
  holds that result at a known layout (an `EnsureStrides` line) and the new buffer has exactly
  its type: the new buffer is then a `Reinterpret` of it, placed at its own storage offset
  (where the library put it), since `ReuseBuffer` always starts at offset 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.lines import Allocate, ExternKernel, Free, KernelCall, Reinterpret, ReuseBuffer, WrapperLine
from wrapgen.wrapper_ir.passes.peak_memory import live_bytes
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.passes.symbolic import provably_nonnegative
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorRef, TensorType, storage_bytes

# A dead buffer is reused only when it is at most this many times larger than needed, so a
# big buffer is not spent on a small allocation.
SIZE_TOLERANCE = 2


@dataclass
class _Dead:
    handle: str  # the name that still holds the storage
    type: TensorType  # layout the storage was allocated for
    capacity: sympy.Expr  # bytes
    free_index: int


def fits(capacity: sympy.Expr, needed: sympy.Expr) -> bool:
    return provably_nonnegative(capacity - needed) and provably_nonnegative(SIZE_TOLERANCE * needed - capacity)


def is_pointwise(qualified: str) -> bool:
    """True for an elementwise ATen overload (the tag sits on the functional overload)."""
    namespace, rest = qualified.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    if packet is None:
        return False
    candidates = [getattr(packet, overload or "default", None), getattr(packet, "default", None)]
    return any(op is not None and torch.Tag.pointwise in op.tags for op in candidates)


class _Planner:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.lines = program.lines
        self.analysis = StorageAnalysis(program)
        self.capacity: dict[str, sympy.Expr] = {}
        # Live bytes while each line runs, at the symbols' hints, updated as reuses are chosen.
        hints = {info.symbol: info.hint for info in program.symbols}
        self.at_hints = lambda expr: int(sympy.sympify(expr).xreplace(hints))
        self.timeline = [self.at_hints(b) for b in live_bytes(program)]
        self.peak = max(self.timeline, default=0)
        self.replaced: dict[int, WrapperLine] = {}
        self.moved_frees: dict[int, int] = {}  # index of a death Free -> index it now follows

    def allocation_of(self, name: str) -> Allocate | None:
        created = self.analysis.storage(name).created_at
        line = self.lines[created] if created >= 0 else None
        return line if isinstance(line, Allocate) else None

    def library_result(self, name: str, before: int | None = None) -> TensorType | None:
        """The type of `name` when it is a library call's own result (not a view of anything)
        whose layout the program checks at run time (an `EnsureStrides` line before line
        `before`, matched by name so this pass does not depend on the module that lowers
        library layouts)."""
        created = self.analysis.storage(name).created_at
        line = self.lines[created] if created >= 0 else None
        if not (isinstance(line, ExternKernel) and line.name == name and line.alias_of is None):
            return None
        result = line.result
        if not isinstance(result, TensorType):
            return None
        for other in self.lines[created + 1 : before]:
            if isinstance(other, EnsureStrides) and other.name == name:
                strides = tuple(other.strides)
                if tuple(other.sizes) != tuple(result.sizes) or (
                    result.strides is not None and tuple(result.strides) != strides
                ):
                    return None
                return TensorType(result.dtype, result.device, result.sizes, strides)
        return None

    def source_type(self, name: str) -> TensorType | None:
        """The type of the storage an in-place source owns: allocated, or a library result."""
        allocation = self.allocation_of(name)
        return allocation.type if allocation is not None else self.library_result(name)

    def reusable_death_frees(self) -> dict[int, str]:
        deaths: dict[int, str] = {}
        for index, line in enumerate(self.lines):
            if isinstance(line, Free):
                storage = self.analysis.storage(line.name)
                if self.allocation_of(line.name) is not None and storage.death == index:
                    deaths[index] = storage.root
        return deaths

    def in_place_source(self, index: int, line: Allocate) -> str | None:
        """An input of the line that first writes the new buffer (after any other allocations
        for it) that dies there and can hold it: exactly the new buffer's layout for a library
        call; for a generated kernel, whose `may_alias` pair promises that it reads each element
        of the input at the very offset where it writes the output's, any buffer of the same
        element type and device with room for the output (a `[2048, 3072]` matmul result
        serves the `[16, 128, 3072]` GELU computed from it)."""
        at = index + 1
        while at < len(self.lines) and isinstance(self.lines[at], Allocate):
            at += 1
        if at >= len(self.lines):
            return None
        writer = self.lines[at]
        if isinstance(writer, ExternKernel) and writer.writes == (line.name,) and is_pointwise(writer.op):
            candidates = [arg.name for arg in writer.args if isinstance(arg, TensorRef)]
        elif isinstance(writer, KernelCall):
            candidates = [source for out, source in writer.may_alias if out == line.name]
        else:
            return None
        for name in candidates:
            if name == line.name:
                continue
            storage = self.analysis.storage(name)
            source = self.allocation_of(name)
            library = self.library_result(name, at) if source is None and isinstance(writer, KernelCall) else None
            if (source is None and library != line.type) or storage.root != name or storage.death is None:
                continue
            if source is not None and not (
                source.type == line.type or (isinstance(writer, KernelCall) and _holds(source.type, line.type))
            ):
                continue
            # A view of the same storage read with another layout would see overwritten data.
            other_views = [
                a for a in writer.uses() if a not in (name, line.name) and self.analysis.root_of.get(a) == storage.root
            ]
            between = self.lines[at + 1 : storage.death + 1]
            if not other_views and all(isinstance(other, Free) for other in between):
                return name
        return None

    def raises_peak(self, choice: _Dead, index: int, line: Allocate) -> bool:
        """Would holding `choice` from its death until `index`, and then its spare capacity
        for the new buffer's life, lift the peak? If not, commit that to the timeline."""
        held = self.at_hints(choice.capacity)
        spare = held - self.at_hints(storage_bytes(line.type))
        death = self.analysis.storage(line.name).death
        end = len(self.timeline) - 1 if death is None else death
        waiting = range(choice.free_index + 1, index)
        living = range(index, end + 1)
        if any(self.timeline[i] + held > self.peak for i in waiting) or any(
            self.timeline[i] + spare > self.peak for i in living
        ):
            return True
        for i in waiting:
            self.timeline[i] += held
        for i in living:
            self.timeline[i] += spare
        return False

    def choose_in_place(self) -> dict[int, str]:
        """Every in-place reuse (allocation index -> input it overwrites), with the timeline
        lowered to match, so that dead-buffer reuse below measures against the peak that is
        left rather than the one in-place computation removed."""
        chosen: dict[int, str] = {}
        for index, line in enumerate(self.lines):
            if not isinstance(line, Allocate):
                continue
            source = self.in_place_source(index, line)
            if source is None or source in chosen.values():
                continue
            chosen[index] = source
            end = len(self.timeline) - 1
            new_death = self.analysis.storage(line.name).death
            new_death = end if new_death is None else new_death
            source_death = self.analysis.storage(source).death
            source_death = end if source_death is None else source_death
            for i in range(index, new_death + 1):  # the new buffer brings no storage of its own
                self.timeline[i] -= self.at_hints(storage_bytes(line.type))
            source_bytes = self.at_hints(storage_bytes(self.source_type(source)))  # type: ignore[arg-type]
            for i in range(source_death + 1, new_death + 1):  # the input's storage lives on instead
                self.timeline[i] += source_bytes
        self.peak = max(self.timeline, default=0)
        return chosen

    def plan(self) -> Program:
        in_place = self.choose_in_place()
        deaths = self.reusable_death_frees()
        dead: list[_Dead] = []
        taken = set(in_place.values())
        for index, line in enumerate(self.lines):
            if index in deaths and deaths[index] not in taken:
                root = deaths[index]
                root_type = self.allocation_of(root).type  # type: ignore[union-attr]
                capacity = self.capacity.get(root, storage_bytes(root_type))
                dead.append(_Dead(line.name, root_type, capacity, index))  # type: ignore[attr-defined]
            elif isinstance(line, Allocate):
                source = in_place.get(index)
                if source is not None and self.allocation_of(source) is None:  # a library result
                    t = line.type
                    self.replaced[index] = Reinterpret(line.name, source, t.dtype, t.device, t.sizes, t.strides)
                    continue
                if source is not None:
                    source_type = self.allocation_of(source).type  # type: ignore[union-attr]
                    self.replaced[index] = ReuseBuffer(line.name, source, line.type)
                    self.capacity[line.name] = self.capacity.get(source, storage_bytes(source_type))
                    continue
                choice = _best_fit(dead, line.type)
                if choice is not None and not self.raises_peak(choice, index, line):
                    dead.remove(choice)
                    self.moved_frees[choice.free_index] = index
                    self.replaced[index] = ReuseBuffer(line.name, choice.handle, line.type)
                    self.capacity[line.name] = choice.capacity
        if not self.replaced:
            return self.program
        after: dict[int, list[WrapperLine]] = {}
        for free_index, new_index in self.moved_frees.items():
            after.setdefault(new_index, []).append(self.lines[free_index])
        lines: list[WrapperLine] = []
        for index, line in enumerate(self.lines):
            if index in self.moved_frees:
                continue
            lines.append(self.replaced.get(index, line))
            lines.extend(after.get(index, ()))
        return self.program.with_lines(lines)


def reuse_buffers(program: Program) -> Program:
    """Rewrite allocations to reuse dead buffers, or their input's storage in place."""
    return _Planner(program).plan()


def _holds(source: TensorType, wanted: TensorType) -> bool:
    """Whether `source`'s storage can hold `wanted` at offset 0 (same element type and device)."""
    same_kind = (source.device, source.dtype) == (wanted.device, wanted.dtype)
    return same_kind and provably_nonnegative(storage_bytes(source) - storage_bytes(wanted))


def _best_fit(dead: list[_Dead], wanted: TensorType) -> _Dead | None:
    needed = storage_bytes(wanted)
    best: _Dead | None = None
    for candidate in dead:
        same_kind = (candidate.type.device, candidate.type.dtype.itemsize) == (wanted.device, wanted.dtype.itemsize)
        if not same_kind or not fits(candidate.capacity, needed):
            continue
        if best is None or provably_nonnegative(best.capacity - candidate.capacity):
            best = candidate  # smallest that fits
    return best
