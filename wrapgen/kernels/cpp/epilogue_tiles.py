"""Row epilogues of a reduction kernel in their own SIMD loop.

A kernel that reduces each row and then applies a costly function to the row's result (a
small product with its GELU or SiLU, as CPU-generated matrix products of small models are)
computes the epilogue once per row, inside the loop whose body is the reduction: gcc cannot
vectorize that loop, so each `erff` or `expf` is a scalar libm call. Here the innermost row
loop runs in tiles: the reductions of a tile's rows go into small arrays, then one
`#pragma omp simd` loop applies the epilogue to the whole tile, where libmvec's vector
functions serve it. Only the simple shape is tiled: one pass over the reduced dimensions
followed by row members, a static innermost row extent, no data-dependent reads or stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from wrapgen.kernels.cpp import lane_tiles
from wrapgen.loop_ir import Apply, Load, walk

# The kernel generator (codegen.CppKernelCodegen) and its line writer: typed loosely here, since
# codegen imports this module.
Generator = Any
Writer = Any

TILE = 16  # rows per tile: a few vectors' worth of results, held in the reduction's arrays
COSTLY = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
                    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "gelu", "gelu_tanh", "sigmoid",
                    "silu", "pow"})


def tile_size(gen: Generator) -> int | None:
    """The tile length for this kernel, or None where its rows are reduced and finished one by
    one: a costly epilogue gets a tile of `TILE` rows, and so does a sum that lane_tiles can
    interleave (a tile of all the rows where there are fewer)."""
    g, items = gen.group, gen.items
    if not g.rows or not g.reduced or gen.row_cache or not items or items[0][0] != "segment":
        return None
    if any(kind != "row" for kind, _ in items[1:]):
        return None
    extent = sympy.sympify(g.rows[-1])
    if not extent.is_Integer or int(extent) < 2:
        return None
    epilogue = [m for _, ms in items[1:] for m in ms]
    if any(m.node.store_indirect for m in g.members):
        return None
    bodies = [node for m in g.members for node in walk(m.node.body)]
    if any(isinstance(node, Load) and node.indirect for node in bodies):
        return None
    if lane_tiles.eligible(gen):
        return min(TILE, int(extent))
    costly = any(isinstance(node, Apply) and node.op in COSTLY for m in epilogue for node in walk(m.node.body))
    return TILE if costly and int(extent) >= TILE else None


def emit(gen: Generator, x: str, extent: int, tile: int, memo: dict, local: dict[str, str], w: Writer,
         ctype: Callable[[torch.dtype], str]) -> None:
    """The body of the tile loop over `x` (the innermost row variable, its tile's first row in
    `{x}t`): the reductions of each row of the tile, then the epilogue over the tile. `ctype`
    names a dtype's C type."""

    _, reduced_members = gen.items[0]
    reductions = [m for m in reduced_members if m.level == "reduction"]
    bound = str(tile) if extent % tile == 0 else f"(({extent} - {x}t) < {tile} ? ({extent} - {x}t) : {tile})"
    gen.current_item = 0
    if lane_tiles.eligible(gen):
        (member,) = reductions
        arrays = {member.node.name: lane_tiles.emit(gen, x, bound, tile, member, memo, local, w, ctype)}
    else:
        arrays = {m.node.name: f"tile{gen.tmp()}" for m in reductions}
        for m in reductions:
            w.line(f"{ctype(m.node.dtype)} {arrays[m.node.name]}[{tile}];")
        w.line(f"for (int64_t {x}i = 0; {x}i < {bound}; ++{x}i) {{")
        w.depth += 1
        w.line(f"const int64_t {x} = {x}t + {x}i;")
        row_memo, row_local = dict(memo), dict(local)
        gen.segment(reduced_members, row_memo, row_local, w)
        for name, array in arrays.items():
            w.line(f"{array}[{x}i] = {row_local[name]};")
        w.depth -= 1
        w.line("}")
    if len(gen.items) == 1:
        return
    w.line("#pragma omp simd")
    w.line(f"for (int64_t {x}i = 0; {x}i < {bound}; ++{x}i) {{")
    w.depth += 1
    w.line(f"const int64_t {x} = {x}t + {x}i;")
    tail_memo, tail_local = dict(memo), dict(local)
    tail_local.update({name: f"{array}[{x}i]" for name, array in arrays.items()})
    for item, (_, ms) in enumerate(gen.items[1:], start=1):
        gen.current_item = item
        m = ms[0]
        var = gen.value(m.node.body, tail_memo, tail_local, w)
        tail_local[m.node.name] = var
        gen.store(m, var, w, tail_memo, tail_local)
    w.depth -= 1
    w.line("}")
