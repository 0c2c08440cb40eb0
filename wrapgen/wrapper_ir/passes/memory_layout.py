"""Where each buffer lives and for how long, at the symbols' hints: data for the memory picture."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from wrapgen.wrapper_ir.lines import AllocateFromPool
from wrapgen.wrapper_ir.passes.peak_memory import owned_bytes
from wrapgen.wrapper_ir.passes.pooling import plan_pool_offsets
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import storage_bytes


@dataclass(frozen=True)
class Block:
    """One storage: the names that used it, its first and last line, byte offset and size."""

    label: str
    start: int
    end: int
    offset: int
    size: int
    pooled: bool


def memory_layout(program: Program) -> list[Block]:
    """Pools with their buffers at the planned offsets; every other storage the program owns
    placed above them by the same first-fit packing a pool would use."""
    hints = {info.symbol: info.hint for info in program.symbols}

    def at_hints(expr: object) -> int:
        return int(sympy.sympify(expr).xreplace(hints))

    analysis = StorageAnalysis(program)
    last = len(program.lines) - 1
    pools = {line.pool for line in program.lines if isinstance(line, AllocateFromPool)}
    blocks: list[Block] = []
    intervals = []
    for root, storage in analysis.storages.items():
        if storage.created_at < 0:
            continue
        line = program.lines[storage.created_at]
        label = ", ".join(sorted(storage.names, key=lambda n: (len(n), n))[:3])
        end = storage.death if storage.death is not None else last
        if isinstance(line, AllocateFromPool):
            blocks.append(Block(label, storage.created_at, end, at_hints(line.offset), at_hints(storage_bytes(line.type)), True))
        elif root in pools:
            blocks.append(Block(root, storage.created_at, end, 0, at_hints(owned_bytes(line)), True))
        elif owned_bytes(line) != 0:
            intervals.append((root, storage.created_at, end, owned_bytes(line), label))
    base = max((b.size for b in blocks if b.label in pools), default=0)
    offsets, _ = plan_pool_offsets([(r, s, e, b) for r, s, e, b, _ in intervals], hints)
    for root, start, end, nbytes, label in intervals:
        blocks.append(Block(label, start, end, base + at_hints(offsets[root]), at_hints(nbytes), False))
    return blocks
