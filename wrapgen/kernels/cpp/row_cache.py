"""Row caches: expensive values a later reduction pass would recompute, kept per row.

A fused row reduction runs several passes over the same row (softmax: max, then the sum of
exp(x - max), then exp(x - max) / sum). Each pass recomputes the values it shares with an
earlier one, so softmax evaluates exp twice per element. When the row is short enough to sit
in cache, the first pass that computes such a value also writes it to a row-sized local
array and later passes read it back: one exp per element instead of two, and the last pass
no longer reads the input from memory.

Only values containing a transcendental op are cached (recomputing an add is cheaper than a
load), only values that vary along the row, and only while the row's static extent fits
`ROW_CACHE_BYTES` in total.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from wrapgen.loop_ir import Apply, Body, IndexValue, Load, compute_dtype, is_loop_var, walk

ROW_CACHE_BYTES = 64 * 1024  # per thread, on the stack; fits L2 comfortably

EXPENSIVE_OPS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "sigmoid", "gelu", "gelu_tanh", "pow", "atan2",
})


@dataclass(frozen=True)
class CachedValue:
    """`body` is computed in pass `producer` (an index into the kernel's items) and kept in `array`."""

    body: Body
    producer: int
    array: str


def plan_row_cache(passes: dict[int, list[Body]], row_extent: sympy.Expr) -> dict[Body, CachedValue]:
    """Which values to cache: for each pass (item index → its member bodies), the largest
    expensive row-varying subexpressions an earlier pass already computes."""
    if not passes or not row_extent.is_Integer:
        return {}
    extent = int(row_extent)
    computed_before: dict[Body, int] = {}
    chosen: dict[Body, CachedValue] = {}
    budget = ROW_CACHE_BYTES
    for index in sorted(passes):
        bodies = passes[index]
        for body in bodies:
            for node in _outermost(body, computed_before, chosen):
                cost = extent * compute_dtype(node.dtype).itemsize  # kept as computed: half as float
                if cost <= budget:
                    budget -= cost
                    chosen[node] = CachedValue(node, computed_before[node], f"wg_row{len(chosen)}")
        for body in bodies:
            for node in walk(body):
                computed_before.setdefault(node, index)
    return chosen


def _outermost(body: Body, earlier: dict[Body, int], chosen: dict[Body, CachedValue]) -> list[Body]:
    """Largest subexpressions of `body` an earlier pass computes that are worth caching."""
    found: list[Body] = []

    def go(node: Body) -> None:
        if node in chosen:
            return
        if node in earlier and _expensive(node) and _varies_along_row(node):
            found.append(node)
            return
        if isinstance(node, Apply):
            for a in node.args:
                go(a)

    go(body)
    return list(dict.fromkeys(found))


def _expensive(body: Body) -> bool:
    return any(isinstance(n, Apply) and n.op in EXPENSIVE_OPS for n in walk(body))


def _varies_along_row(body: Body) -> bool:
    for n in walk(body):
        expr = n.index if isinstance(n, Load) else n.expr if isinstance(n, IndexValue) else None
        if expr is not None and any(is_loop_var(s, "r") for s in sympy.sympify(expr).free_symbols):
            return True
    return False
