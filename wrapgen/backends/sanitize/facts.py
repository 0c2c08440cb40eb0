"""What the sanitizer needs to know about a program before it runs: which line reads or writes
which buffer, and until which line each buffer's data is still needed.

Computed once per program from what lines report (`uses`, `writes`, `defines`), so a line type
added later is checked conservatively: a line type not listed here is taken to read every tensor
it uses and to run code that may write memory, its `writes` field (if any) being what it may write.
"""

from __future__ import annotations

from collections import defaultdict

from wrapgen.wrapper_ir.collectives import CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.lines import (
    Allocate,
    AllocateFromPool,
    AssertFinite,
    AssertInput,
    AssertScalar,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelDefinition,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.passes.state_versions import state_storages
from wrapgen.wrapper_ir.program import Program, SymbolInfo

# Lines that touch no tensor data: they read layouts, bind names or hand storage to a new name.
_NO_DATA = (Comment, KernelDefinition, AssertInput, AssertScalar, SymbolicCallArg, Allocate, AllocateFromPool,
            ReuseBuffer, Free, Reinterpret, MultiOutput)

Definition = tuple[str, int]  # (name, line that defined it; 0 for inputs and constants)


def reads_data(line: WrapperLine) -> bool:
    """Whether the line reads (or writes) the data, not just the layout, of the tensors it uses."""
    if isinstance(line, BindSymbol):
        return line.kind in ("item", "value")
    return not isinstance(line, _NO_DATA)


def runs_code(line: WrapperLine) -> bool:
    """Whether the line runs a kernel or library code, which could write memory it does not declare."""
    return reads_data(line) and not isinstance(line, (BindSymbol, Output, AssertFinite))


def declared_writes(line: WrapperLine) -> tuple[str, ...]:
    """What the line may write: its `writes`; a collective's wait completes the collective's result."""
    if isinstance(line, CollectiveWait):
        return (line.name,)
    return tuple(getattr(line, "writes", ()) or ())


def derived_from(line: WrapperLine) -> str | None:
    """The name whose data the line's new name views (so the view's uses keep that data needed)."""
    if isinstance(line, (Reinterpret, MultiOutput)):
        return line.source
    if isinstance(line, ExternKernel) and line.alias_of is not None:
        return line.alias_of
    return None


class ProgramFacts:
    """Per-program facts, by 1-based line number as in `str(program)`.

    A name can be defined again after its Free, so liveness is kept per definition.
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        self.lines: dict[int, WrapperLine] = dict(enumerate(program.lines, start=1))
        self.texts = {n: line.format() for n, line in self.lines.items()}
        self.symbol_info: dict[str, SymbolInfo] = {str(info.symbol): info for info in program.symbols}
        self.constants = program.constant_values()
        self.inputs = tuple(program.input_names())
        # inputs and constants some line writes: the state whose versions each call declares
        self.state = state_storages(set(self.inputs) | set(self.constants), list(program.lines))
        self.reads: dict[int, tuple[str, ...]] = {}  # data a line reads and does not declare written
        self.in_place: set[int] = set()  # ReuseBuffer lines whose source is read by the line writing it
        self.last_use: dict[Definition, int] = {}
        # Collective results being written by the collective, asynchronously, while a line runs
        # (after their start, before their wait): no line's own write.
        self.in_flight: dict[int, set[str]] = defaultdict(set)
        started: dict[str, int] = {}
        names: dict[str, None] = dict.fromkeys(self.inputs + tuple(c.name for c in program.constants))
        current: dict[str, int] = dict.fromkeys(names, 0)
        readers: dict[Definition, list[int]] = defaultdict(list)
        derived: list[tuple[Definition, Definition]] = []
        reuses: list[tuple[int, ReuseBuffer, Definition]] = []
        for n, line in self.lines.items():
            if reads_data(line):
                written = set(declared_writes(line))
                self.reads[n] = tuple(name for name in line.uses() if name not in written)
                for name in line.uses():
                    key = (name, current.get(name, 0))
                    readers[key].append(n)
                    self.last_use[key] = n
            if isinstance(line, CollectiveStart):
                started[line.name] = n
            elif isinstance(line, CollectiveWait) and line.name in started:
                for m in range(started.pop(line.name) + 1, n):
                    self.in_flight[m].add(line.name)
            if isinstance(line, ReuseBuffer):
                reuses.append((n, line, (line.source, current.get(line.source, 0))))
            source = derived_from(line)
            for name in line.defines():
                if source is not None:
                    derived.append(((name, n), (source, current.get(source, 0))))
                current[name] = n
                names[name] = None
        for view, source in reversed(derived):  # later definitions first: chains of views resolve
            self.last_use[source] = max(self.last_use.get(source, 0), self.last_use.get(view, 0))
        self.tensor_names = tuple(names)
        for n, line, source in reuses:
            later = [m for m in readers[source] if m > n]
            if later and all(line.name in declared_writes(self.lines[m]) for m in later):
                self.in_place.add(n)

    def needed_until(self, name: str, defined_at: int) -> int:
        """The last line that reads or writes the data of `name` (its definition at line
        `defined_at`), directly or through a view; 0 when none does."""
        return self.last_use.get((name, defined_at), 0)
