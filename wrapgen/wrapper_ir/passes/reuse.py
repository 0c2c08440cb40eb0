"""Buffer reuse: an allocation takes over the storage of a buffer that died earlier.

The plan is IR: the dead buffer's last `Free` is dropped, and the later `Allocate` becomes a
`ReuseBuffer` of the name that still holds the storage, so every target follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from wrapgen.wrapper_ir.lines import Allocate, Free, ReuseBuffer, WrapperLine
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.passes.symbolic import provably_nonnegative
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorType, storage_bytes

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


def reuse_buffers(program: Program) -> Program:
    """Rewrite allocations to reuse dead buffers of the same device and element size."""
    analysis = StorageAnalysis(program)
    owned_capacity: dict[str, sympy.Expr] = {}
    # The Free that ends each reusable storage: a storage dies at its last line.
    death_frees: dict[int, str] = {}
    for index, line in enumerate(program.lines):
        if isinstance(line, Free):
            storage = analysis.storage(line.name)
            root_line = program.lines[storage.created_at] if storage.created_at >= 0 else None
            if isinstance(root_line, Allocate) and storage.death == index:
                death_frees[index] = storage.root

    dead: list[_Dead] = []
    dropped: set[int] = set()
    replaced: dict[int, WrapperLine] = {}
    for index, line in enumerate(program.lines):
        if index in death_frees:
            root = death_frees[index]
            root_type = program.lines[analysis.storage(root).created_at].type  # type: ignore[attr-defined]
            capacity = owned_capacity.get(root, storage_bytes(root_type))
            dead.append(_Dead(line.name, root_type, capacity, index))  # type: ignore[attr-defined]
        elif isinstance(line, Allocate):
            choice = _best_fit(dead, line.type)
            if choice is not None:
                dead.remove(choice)
                dropped.add(choice.free_index)
                replaced[index] = ReuseBuffer(line.name, choice.handle, line.type)
                owned_capacity[line.name] = choice.capacity
    if not replaced:
        return program
    lines = [replaced.get(i, line) for i, line in enumerate(program.lines) if i not in dropped]
    return program.with_lines(lines)


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
