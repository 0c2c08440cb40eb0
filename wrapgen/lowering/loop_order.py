"""Iterate a pointwise result in the order of its memory, not of its logical dimensions.

A kernel walks its rows in row-major order of the loop variables (Triton: one flat index,
the last variable fastest; C++: nested loops, the innermost vectorized). For a result stored
permuted, a channels-last activation (strides [HWC, 1, WC, C]) above all, that order writes
(and reads its same-layout inputs) C elements apart: uncoalesced on a GPU, scalar on a CPU. So
a compute node that stores a dense permuted layout gets its loop variables reordered by
decreasing stride: the innermost variable walks the unit-stride dimension and the store
index becomes contiguous in the new variables (one flat index, as for a contiguous result).
"""

from __future__ import annotations

import statistics

import sympy

from wrapgen.loop_ir import Body, row_vars, substitute


def memory_order(sizes: tuple, strides: tuple, hints: dict) -> tuple[int, ...] | None:
    """The logical dimensions outermost first by decreasing stride (size-1 dimensions stay in
    place), or None when that is the logical order already or a stride is not a number at the hints."""
    try:
        keys = [int(sympy.sympify(s).xreplace(hints)) for s in strides]
    except (TypeError, ValueError):
        return None
    moving = [d for d, s in enumerate(sizes) if sympy.sympify(s) != 1]
    ordered = iter(sorted(moving, key=lambda d: (-keys[d], d)))
    order = tuple(next(ordered) if d in moving else d for d in range(len(sizes)))
    return None if order == tuple(range(len(sizes))) else order


def reorder(sizes: tuple, strides: tuple, body: Body, hints: dict) -> tuple[tuple, Body, sympy.Expr]:
    """(rows, body, store index) of a pointwise node storing `body` at `strides`, its loop
    variables in memory order: variable k runs over logical dimension `order[k]`."""
    xs = row_vars(len(sizes))
    order = memory_order(sizes, strides, hints)
    if order is None:
        return tuple(sizes), body, _linear(xs, strides)
    mapping = {xs[d]: xs[k] for k, d in enumerate(order)}
    rows = tuple(sizes[d] for d in order)
    store = _linear(xs, tuple(strides[d] for d in order))
    return rows, substitute(body, mapping), store


def _linear(index: tuple, strides: tuple) -> sympy.Expr:
    return sympy.expand(sum((i * s for i, s in zip(index, strides)), sympy.Integer(0)))


def reduction_order(body: Body, sizes: tuple, kept: list[int], hints: dict) -> tuple[int, ...]:
    """The order (positions in `kept`, outermost first) to walk a reduction's kept dimensions
    in: by decreasing stride of the first load of `body` (over `sizes`) that every kept
    dimension moves (a max pool over an NHWC map walks channels innermost), else as they are.
    The strides are probed by unit steps from a few points and the median step taken, so clamped
    (padded-window) and wrapped (rolled) indices count too: from the origin alone, a 3x3 window's
    row `clamp(h - 1 + r)` does not move from h = 0 to 1 (both clamp to 0), its stride read 0, and
    a pool over an NHWC map walked (and wrote) NCHW, reading its input 64 channels apart per step
    (PoolFormer on an H200)."""
    from wrapgen.loop_ir import loads

    identity = tuple(range(len(kept)))
    xs = row_vars(len(sizes))
    moving = [k for k, d in enumerate(kept) if sympy.sympify(sizes[d]) != 1]
    if len(moving) < 2:
        return identity
    for load in loads(body):
        index = sympy.sympify(load.index)
        if load.indirect or not all(xs[kept[k]] in index.free_symbols for k in moving):
            continue
        try:
            fixed = index.xreplace(hints)
            steps = {k: statistics.median_low([_probe(fixed, xs[kept[k]], point) for point in _PROBE_POINTS])
                     for k in moving}
        except (TypeError, ValueError):
            return identity
        ordered = iter(sorted(moving, key=lambda k: (-steps[k], k)))
        return tuple(next(ordered) if k in moving else k for k in identity)
    return identity


# where strides are probed from: every symbol of an index at one of these values (a clamp at a
# window's edge or a wrap stops a step at one or two of them, not at most)
_PROBE_POINTS = (0, 1, 2, 3, 4)


def _probe(index: sympy.Expr, symbol: sympy.Symbol, point: int) -> int:
    """How far `index` moves when `symbol` steps by one from `point` (every symbol there)."""
    at = {s: point for s in index.free_symbols}
    return int(index.xreplace({**at, symbol: point + 1}) - index.xreplace(at))
