"""A gather from a value that is still a loop body: read it at the gathered position instead of
storing the whole value first.

A cross entropy gathers the log-probability of each target from `log_softmax(logits)`, which is
`logits - max - log(sum)` per element. Stored, that is a logits-sized buffer written and read
again for one element per row; inlined, each output element evaluates the expression at its
target's column (one load of the logits, two per-row loads). The gathered position binds every
load that depends on it (each load checks its range, as a gather does), so the value must be
built from loads only: an index used as a number (arange) at that position has no load to check
it and keeps the value stored.
"""

from __future__ import annotations

import sympy

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, Indirect, Load, LoopValue, size, walk

# A larger expression is evaluated once per element into a buffer and gathered from there.
GATHER_INLINE_LIMIT = 24


def gather_computed(value: LoopValue, index: tuple, chosen: Indirect) -> Body | None:
    """`value`'s body at `index` (which holds `chosen.symbol`), every load that depends on the
    symbol bound through `chosen`; None when `value` is a plain load (the ordinary gather
    handles it), too large, or uses the position other than in a load's index."""
    body = value.body
    if isinstance(body, Load) or size(body) > GATHER_INLINE_LIMIT:
        return None
    if any(isinstance(n, Load) and n.indirect for n in walk(body)):
        return None  # a gather of a gather: kept stored (one data-dependent level per load)
    read = value.at(index)
    symbol = chosen.symbol
    for n in walk(read):
        if isinstance(n, IndexValue) and symbol in sympy.sympify(n.expr).free_symbols:
            return None
    bound = _bind(read, symbol, chosen)
    return bound if any(isinstance(n, Load) and n.indirect for n in walk(bound)) else None


def _bind(body: Body, symbol: sympy.Symbol, chosen: Indirect) -> Body:
    memo: dict[int, Body] = {}

    def go(node: Body) -> Body:
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, Load) and symbol in sympy.sympify(node.index).free_symbols:
            out: Body = Load(node.buffer, node.index, node.dtype, (chosen,))
        elif isinstance(node, Apply):
            out = Apply(node.op, tuple(go(a) for a in node.args), node.dtype)
        else:
            assert isinstance(node, (Load, Const, IndexValue)), node
            out = node
        memo[key] = out
        return out

    return go(body)
