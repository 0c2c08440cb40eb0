"""Pooled allocation: the program's temporary buffers become views into one pool per device,
allocated once per call.

Each buffer is stacked on top of the buffers already placed whose lifetimes overlap its
own, so offsets (sympy expressions, symbolic when sizes are) are valid for every value of
the size symbols. Buffers that escape (outputs) keep their own allocations.
"""

from __future__ import annotations

from collections import defaultdict

import sympy
import torch
from torch.utils._sympy.functions import CeilDiv

from wrapgen.wrapper_ir.lines import (
    Allocate,
    AllocateFromPool,
    Free,
    WrapperLine,
)
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.passes.symbolic import provably_le
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorType, storage_bytes

ALIGNMENT = 64  # bytes: every pooled buffer starts on a cache line / vector boundary


def align(nbytes: sympy.Expr) -> sympy.Expr:
    nbytes = sympy.sympify(nbytes)
    if nbytes.is_number:
        return sympy.Integer(-(-int(nbytes) // ALIGNMENT) * ALIGNMENT)
    return ALIGNMENT * CeilDiv(nbytes, ALIGNMENT)


def plan_pool_offsets(
    intervals: list[tuple[str, int, int, sympy.Expr]], hints: dict[sympy.Symbol, int]
) -> tuple[dict[str, sympy.Expr], sympy.Expr]:
    """Offsets for (name, first line, last line, bytes) intervals, and the pool's size.

    First fit: each buffer goes at the lowest candidate offset (0, or the end of a buffer
    alive at the same time) that provably clears every buffer alive with it, for all
    values of the size symbols; candidates are ranked by their value at the hints.
    """
    placed: list[tuple[int, int, sympy.Expr, sympy.Expr]] = []
    offsets: dict[str, sympy.Expr] = {}
    for name, start, end, nbytes in intervals:
        size = align(nbytes)
        overlapping = [(offset, extent) for (s, e, offset, extent) in placed if s <= end and start <= e]
        candidates = [sympy.Integer(0)] + [offset + extent for offset, extent in overlapping]
        candidates.sort(key=lambda c: (int(sympy.sympify(c).xreplace(hints)), sympy.count_ops(c)))
        chosen = next(
            (
                c
                for c in candidates
                if all(provably_le(c + size, offset) or provably_le(offset + extent, c) for offset, extent in overlapping)
            ),
            None,
        )
        if chosen is None:  # always safe: above everything alive at the same time
            chosen = sympy.Max(*candidates)
        offsets[name] = chosen
        placed.append((start, end, chosen, size))
    tops = [offset + size for (_, _, offset, size) in placed]
    return offsets, (_simplified_max(tops) if tops else sympy.Integer(0))


def _simplified_max(values: list[sympy.Expr]) -> sympy.Expr:
    kept: list[sympy.Expr] = []
    for value in values:
        if any(provably_le(value, other) for other in kept):
            continue
        kept = [other for other in kept if not provably_le(other, value)]
        kept.append(value)
    return kept[0] if len(kept) == 1 else sympy.Max(*kept)


def pool_buffers(program: Program) -> Program:
    """Replace non-escaping allocations with AllocateFromPool lines into per-device pools."""
    analysis = StorageAnalysis(program)
    by_device: dict[torch.device, list[tuple[str, int, int, sympy.Expr]]] = defaultdict(list)
    for index, line in enumerate(program.lines):
        if isinstance(line, Allocate):
            storage = analysis.storage(line.name)
            if storage.death is not None:
                by_device[line.type.device].append((line.name, index, storage.death, storage_bytes(line.type)))
    if not by_device:
        return program

    hints = {info.symbol: info.hint for info in program.symbols}
    pools: list[WrapperLine] = []
    replaced: dict[int, WrapperLine] = {}
    pool_frees: dict[int, list[Free]] = defaultdict(list)
    for number, (device, intervals) in enumerate(sorted(by_device.items(), key=lambda item: str(item[0]))):
        pool = f"pool{number}"
        offsets, size = plan_pool_offsets(intervals, hints)
        pools.append(Allocate(pool, TensorType(torch.uint8, device, (size,), (sympy.Integer(1),))))
        for name, start, _, _ in intervals:
            line = program.lines[start]
            assert isinstance(line, Allocate)
            replaced[start] = AllocateFromPool(name, pool, offsets[name], line.type)
        pool_frees[max(end for _, _, end, _ in intervals)].append(Free(pool))

    # Pools are allocated just before the first buffer placed in one (their sizes use only
    # symbols bound from the inputs, which the program binds first).
    first_pooled = min(replaced)
    lines: list[WrapperLine] = []
    for index, line in enumerate(program.lines):
        if index == first_pooled:
            lines.extend(pools)
        lines.append(replaced.get(index, line))
        lines.extend(pool_frees.get(index, ()))
    return program.with_lines(lines)
