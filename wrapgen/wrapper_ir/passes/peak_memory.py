"""Estimate the peak bytes a program holds at once (its own storage, not inputs/constants)."""

from __future__ import annotations

import sympy

from wrapgen.wrapper_ir.collectives import CollectiveStart
from wrapgen.wrapper_ir.lines import Allocate, ExternKernel, WrapperLine
from wrapgen.wrapper_ir.passes.storage import StorageAnalysis
from wrapgen.wrapper_ir.passes.symbolic import provably_le
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorType, storage_bytes


def owned_bytes(line: WrapperLine) -> sympy.Expr:
    """Bytes of new storage a line brings (pooled buffers and reuses bring none)."""
    if isinstance(line, (Allocate, CollectiveStart)):
        return storage_bytes(line.type)
    if isinstance(line, ExternKernel) and line.name is not None and line.alias_of is None:
        results = line.result if isinstance(line.result, tuple) else (line.result,)
        return sum((storage_bytes(r) for r in results if isinstance(r, TensorType)), sympy.Integer(0))
    return sympy.Integer(0)


def live_bytes(program: Program) -> list[sympy.Expr]:
    """Bytes of program-owned storage live while each line runs (library results counted at
    their dense size)."""
    analysis = StorageAnalysis(program)
    dies_after: dict[int, list[sympy.Expr]] = {}
    live = sympy.Integer(0)
    timeline: list[sympy.Expr] = []
    for index, line in enumerate(program.lines):
        added = owned_bytes(line)
        if added != 0:
            for name in line.defines():
                death = analysis.storage(name).death
                if death is not None:
                    dies_after.setdefault(death, []).append(added)
            live = live + added
        timeline.append(live)
        for freed in dies_after.get(index, ()):
            live = live - freed
    return timeline


def peak_memory(program: Program) -> sympy.Expr:
    """Largest sum of live storage over the program's lines: bytes, or an expression of the
    size symbols."""
    return _maximum([sympy.Integer(0), *live_bytes(program)])


# Proving an order between large symbolic expressions can take sympy minutes (seen with
# bicubic interpolation under dynamic shapes): beyond these sizes the Max keeps every candidate.
MAX_PRUNED_OPS = 40
MAX_PRUNED_CANDIDATES = 64


def _maximum(candidates: list[sympy.Expr]) -> sympy.Expr:
    """Max of expressions, dropping those provably below another (keeps the result small)."""
    unique = sorted({sympy.expand(c) for c in candidates}, key=sympy.default_sort_key)
    if len(unique) > MAX_PRUNED_CANDIDATES or any(sympy.count_ops(e) > MAX_PRUNED_OPS for e in unique):
        numbers = [e for e in unique if e.is_number]
        symbolic = [e for e in unique if not e.is_number]
        if numbers:
            symbolic.append(max(numbers))
        return symbolic[0] if len(symbolic) == 1 else sympy.Max(*symbolic, evaluate=False)
    kept: list[sympy.Expr] = []
    for expr in unique:
        if any(provably_le(expr, other) for other in kept):
            continue
        kept = [other for other in kept if not provably_le(other, expr)]
        kept.append(expr)
    return kept[0] if len(kept) == 1 else sympy.Max(*kept)
