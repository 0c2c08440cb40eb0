"""Overlap communication with computation: each collective starts as early and is waited for
as late as its dependencies allow (Inductor's compute/communication reordering, done on the IR).

Only collective lines move; every other line keeps its place and relative order, so the
program computes exactly what it did. A start moves up past the calls that run after the
last line it depends on: the one that defines or writes its input's storage (or waits for
it, when the input is another collective's result), binds a size it uses, or runs a check.
A wait moves down past the calls that run before the first line that needs it: one that
reads the result, writes or reuses the storage of the result or the input, or frees the
result; a `Free` of the input on the way moves along, right after the wait. Only calls are
worth overlapping: a start or wait never moves past allocations and frees alone, which
would hold memory longer for nothing. Collectives keep their order among themselves
(starts stay in order, waits stay in order, and neither passes a library call of a
collective op), so every rank issues the same collectives in the same order.

The lines between a start and its wait run while the collective is in flight; how many
calls that is joins the program's metadata, so `str(program)` shows the overlap.
"""

from __future__ import annotations

from dataclasses import replace

from wrapgen.wrapper_ir.collectives import CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.lines import (
    AssertFinite,
    AssertInput,
    AssertScalar,
    BindSymbol,
    ExternKernel,
    Free,
    KernelCall,
    Output,
    ReuseBuffer,
    WrapperLine,
)
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.program import Program

# Library calls of these namespaces talk to other processes: collectives never pass them.
COMMUNICATION_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor"})
METADATA_KEY = "collective overlap"


def schedule_collectives(program: Program, overlap: bool = True) -> Program:
    """Move collective starts up and waits down (`overlap`); record the result in the metadata."""
    if not any(isinstance(line, CollectiveStart) for line in program.lines):
        return program
    if overlap:
        root = StorageAnalysis(program).root_of
        lines = _sink_waits(_hoist_starts(list(program.lines), root), root)
        program = program.with_lines(lines)
    metadata = tuple((k, v) for k, v in program.metadata if k != METADATA_KEY)
    return replace(program, metadata=(*metadata, (METADATA_KEY, _describe(program, overlap))))


def calls_in_flight(program: Program) -> int:
    """How many kernel and library calls run while some collective is in flight."""
    in_flight: set[str] = set()
    count = 0
    for line in program.lines:
        if isinstance(line, CollectiveStart):
            in_flight.add(line.name)
        elif isinstance(line, CollectiveWait):
            in_flight.discard(line.name)
        elif in_flight and isinstance(line, (KernelCall, ExternKernel)):
            count += 1
    return count


def _describe(program: Program, overlap: bool) -> str:
    started = sum(isinstance(line, CollectiveStart) for line in program.lines)
    state = "on" if overlap else "off"
    return f"{state}: {started} collective(s), {calls_in_flight(program)} call(s) run while one is in flight"


def _is_communication(line: WrapperLine) -> bool:
    return isinstance(line, ExternKernel) and line.op.split("::", 1)[0] in COMMUNICATION_NAMESPACES


def _written(line: WrapperLine) -> tuple[str, ...]:
    """Names whose storage `line` writes (a reuse hands the source's storage to a new buffer)."""
    written = tuple(getattr(line, "writes", ()))
    return (*written, line.source) if isinstance(line, ReuseBuffer) else written


def _index(lines: list[WrapperLine], line: WrapperLine) -> int:
    return next(i for i, other in enumerate(lines) if other is line)


def _is_call(line: WrapperLine) -> bool:
    return isinstance(line, (KernelCall, ExternKernel))


def _hoist_starts(lines: list[WrapperLine], root: dict[str, str]) -> list[WrapperLine]:
    starts = [line for line in lines if isinstance(line, CollectiveStart)]
    for start in starts:
        here = _index(lines, start)
        storage = {root.get(name, name) for name in start.uses()}
        earliest = 0
        for j in range(here - 1, -1, -1):
            if _start_needs(lines[j], start, storage, root):
                earliest = j + 1
                break
        calls = [j for j in range(earliest, here) if _is_call(lines[j])]
        if calls:
            lines.insert(calls[0], lines.pop(here))  # right before the first call it can overlap
    return lines


def _start_needs(line: WrapperLine, start: CollectiveStart, storage: set[str], root: dict[str, str]) -> bool:
    """Whether `start` must stay after `line`."""
    if isinstance(line, (CollectiveStart, AssertInput, AssertScalar, AssertFinite)) or _is_communication(line):
        return True  # collectives keep their order; checks of the inputs come first
    if isinstance(line, BindSymbol) and line.checked_bounds() != (None, None):
        return True
    if set(line.binds()) & start.symbols_used():
        return True
    if isinstance(line, CollectiveWait) and root.get(line.name, line.name) in storage:
        return True
    touched = (*line.defines(), *_written(line))
    return any(root.get(name, name) in storage for name in touched)


def _sink_waits(lines: list[WrapperLine], root: dict[str, str]) -> list[WrapperLine]:
    waits = [line for line in lines if isinstance(line, CollectiveWait)]
    for wait in reversed(waits):
        here = _index(lines, wait)
        result = root.get(wait.name, wait.name)
        storage = {result, root.get(wait.input, wait.input)}
        last_call = None
        for k in range(here + 1, len(lines)):
            line = lines[k]
            if isinstance(line, Free) and line.name == wait.input:
                continue  # moves along, after the wait
            if _wait_needed_by(line, wait, result, storage, root):
                break
            if _is_call(line):
                last_call = k
        if last_call is None:
            continue  # no call to overlap before the first line that needs it
        segment = lines[here + 1 : last_call + 1]
        frees = [line for line in segment if isinstance(line, Free) and line.name == wait.input]
        kept = [line for line in segment if not (isinstance(line, Free) and line.name == wait.input)]
        lines[here : last_call + 1] = [*kept, wait, *frees]
    return lines


def _wait_needed_by(line: WrapperLine, wait: CollectiveWait, result: str, storage: set[str], root: dict[str, str]) -> bool:
    """Whether `line` must come after `wait`."""
    if isinstance(line, (CollectiveWait, Output)) or _is_communication(line):
        return True  # waits keep their order; the program ends with every collective done
    if any(root.get(name, name) == result for name in line.uses()) or wait.name in line.frees():
        return True
    return any(root.get(name, name) in storage for name in _written(line))


__all__ = ["COMMUNICATION_NAMESPACES", "METADATA_KEY", "calls_in_flight", "schedule_collectives"]
