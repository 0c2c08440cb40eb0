"""Loop bodies as pure data: the value of one element of a tensor, as an expression tree.

A body is built from `Load` (an element of a buffer at a sympy index), `Const`,
`IndexValue` (an index expression used as a number, for arange) and `Apply` (an op on
other bodies). Indices are sympy expressions over loop variables (`x0, x1, ...` for the
kept/pointwise dimensions, `r0, r1, ...` for reduced ones) and the program's size symbols.
Bodies are frozen and hashable, so equal subexpressions share one temporary in codegen.

Half precision (bfloat16, float16) is a storage type: as in Inductor, a half value is
computed in float32 (`compute_dtype`) from its loads (which upcast) to its store (which
rounds). In a body, half-typed nodes are therefore only loads, constants and explicit
`cast`s to a half dtype (which round, like eager's `.to(torch.bfloat16)`); the arithmetic
between them is float32, so a fused chain rounds once where eager rounds after every op.

Fusion groups (`FusionGroup`, `Member`: the compute nodes that share one kernel's loops) are
here too: the lowering builds bodies and its scheduler groups them, kernel codegen renders the
groups; this module sits below both, so `kernels` imports nothing of `lowering`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, lru_cache

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing
from torch.utils._sympy.functions import Max as IndexMax
from torch.utils._sympy.functions import Min as IndexMin
from torch.utils._sympy.value_ranges import bound_sympy

# Index clamps are built with torch's Min and Max (IndexMin, IndexMax): sympy's compare every pair
# of arguments under assumptions on construction, and rebuild so at every substitution (a
# DenseNet's chained concatenations spent 5 of the 13 s of its lowering there). Both kinds are
# recognized wherever a clamp is looked for.
CLAMPS = (sympy.Min, sympy.Max, IndexMin, IndexMax)

Shape = tuple[sympy.Expr, ...]

HALF_DTYPES = frozenset({torch.bfloat16, torch.float16})


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a body computes values of `dtype` in: float32 for half precision (which has
    too few bits to round after every op without losing accuracy), else `dtype` itself."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


@cache  # made for every index of every body: sympy's own Symbol cache costs more
def loop_var(prefix: str, d: int) -> sympy.Symbol:
    """A loop variable: `x<d>` (pointwise / kept dimension) or `r<d>` (reduced dimension)."""
    return sympy.Symbol(f"{prefix}{d}", integer=True, nonnegative=True)


def row_vars(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(loop_var("x", d) for d in range(n))


def red_vars(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(loop_var("r", d) for d in range(n))


def is_loop_var(symbol: sympy.Symbol, prefixes: str = "xr") -> bool:
    """Whether `symbol` is a loop variable (`loop_var`) with one of `prefixes`."""
    name = str(symbol)
    return name[:1] in prefixes and name[1:].isdigit()


@dataclass(frozen=True)
class Indirect:
    """An index read from tensor data (a gather: embedding, index_select): `symbol` stands, in
    a Load's index, for the integer `value` taken as a position along a dimension of `size`.
    A value outside [0, size) is out of range (as in eager's embedding and index_select), which
    the kernel reports (C++: a nonzero status the caller raises on; Triton: a device assert)
    instead of reading outside the buffer."""

    symbol: sympy.Symbol
    value: Body
    size: sympy.Expr


@dataclass(frozen=True)
class Load:
    """Element `index` (in elements, relative to the tensor's data pointer) of `buffer`;
    `indirect` binds the data-dependent symbols of `index` (empty for an ordinary load)."""

    buffer: str
    index: sympy.Expr
    dtype: torch.dtype
    indirect: tuple[Indirect, ...] = ()


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: torch.dtype


@dataclass(frozen=True)
class IndexValue:
    """An integer index expression used as a value (arange, iota)."""

    expr: sympy.Expr
    dtype: torch.dtype


@dataclass(frozen=True)
class Apply:
    """`op` (a name the kernel code generators know, e.g. "add", "exp", "cast") on `args`."""

    op: str
    args: tuple[Body, ...]
    dtype: torch.dtype


Body = Load | Const | IndexValue | Apply


def free_cast(body: Body) -> bool:
    """A cast that changes no value held in registers: half → float32 (half is held as float32)."""
    return isinstance(body, Apply) and body.op == "cast" and body.dtype == torch.float32 and body.args[0].dtype in HALF_DTYPES


def substitute(body: Body, mapping: dict) -> Body:
    """Replace loop variables simultaneously in every index of `body`."""
    memo: dict[int, Body] = {}
    pairs = tuple(mapping.items())

    def go(node: Body) -> Body:
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, Load):
            indirect = tuple(Indirect(i.symbol, go(i.value), i.size) for i in node.indirect)
            out: Body = Load(node.buffer, _reindex(node.index, pairs), node.dtype, indirect)
        elif isinstance(node, IndexValue):
            out = IndexValue(_reindex(node.expr, pairs), node.dtype)
        elif isinstance(node, Apply):
            out = Apply(node.op, tuple(go(a) for a in node.args), node.dtype)
        else:
            out = node
        memo[key] = out
        return out

    return go(body)


@lru_cache(maxsize=65536)
def _reindex(index: object, pairs: tuple) -> sympy.Expr:
    """`index` with the loop variables replaced, expanded. Cached: a stack of identical layers
    inlines the same index at the same place over and over, and rebuilding a Min/Max or a
    floor division through xreplace makes sympy re-derive its simplifications each time."""
    result = sympy.expand(sympy.sympify(index).xreplace(dict(pairs)))
    return fold_bounded(result) if result.has(*CLAMPS) else result


def fold_bounded(index: sympy.Expr) -> sympy.Expr:
    """`index` with each floor division and modulo of a clamped value that the clamp keeps below
    the divisor folded away: a position clamped into a slice (`Min(254, x1)`) read through a view
    that splits it by the slice's extent (255) is `Min(254, x1) // 255` = 0 and
    `Min(254, x1) % 255` = `Min(254, x1)`, which sympy alone does not see. Each division left
    costs every element of the kernel a few integer instructions (GPT-2's shifted-logits
    gradient: five of them per element of a [8, 256, 50257] tensor)."""
    def go(e: sympy.Expr) -> sympy.Expr:
        if not e.args:
            return e
        args = tuple(go(a) for a in e.args)
        if args != e.args:
            e = e.func(*args)
        if isinstance(e, FloorDiv) and _below(e.args[0], e.args[1]):
            return sympy.Integer(0)
        if isinstance(e, ModularIndexing):
            base, divisor, modulus = e.args
            if _below(base, divisor):
                return sympy.Integer(0)
            if divisor == 1 and _below(base, modulus):
                return base
        return e

    return go(index)


def _below(value: sympy.Expr, bound: sympy.Expr) -> bool:
    """Whether 0 <= value < bound for every value of its symbols (a constant `bound` only)."""
    if not (bound.is_Integer and bound > 0 and value.has(*CLAMPS)):
        return False
    ranges = bound_sympy(value)
    return bool(ranges.lower >= 0 and ranges.upper < bound)


def walk(body: Body):
    """Every node of `body`, each distinct node once, children before parents."""
    seen: set[Body] = set()
    order: list[Body] = []

    def go(node: Body) -> None:
        if node in seen:
            return
        if isinstance(node, Apply):
            for a in node.args:
                go(a)
        if isinstance(node, Load):
            for i in node.indirect:
                go(i.value)
        seen.add(node)
        order.append(node)

    go(body)
    return order


def loads(body: Body) -> list[Load]:
    return [n for n in walk(body) if isinstance(n, Load)]


def size(body: Body) -> int:
    return len(walk(body))


@dataclass(frozen=True)
class LoopValue:
    """A tensor not (yet) in memory: `body` gives element (x0, ..., x{n-1}) of a `sizes` tensor.

    `dtype` is the tensor's dtype; `body.dtype` is that or, for a half dtype, float32 when the
    value is still held unrounded (it is rounded where it is stored or cast)."""

    sizes: Shape
    body: Body
    dtype: torch.dtype

    def at(self, index: tuple[sympy.Expr, ...]) -> Body:
        """The body at another index (used to inline this value into a consumer)."""
        return substitute(self.body, dict(zip(row_vars(len(self.sizes)), index)))


@dataclass(frozen=True)
class ComputeNode:
    """A value that is materialized (or a reduction): the unit the scheduler fuses.

    The iteration space is `rows` (kept dimensions, variables x*) times `reduced`
    (variables r*; empty for pointwise). `body` is over both; `store_index` (over x*) is
    where the result goes in `name`'s buffer. For a reduction, `source_sizes` is the shape
    that was reduced and `source_index` maps each of its dimensions to an x or r variable, so
    a pointwise producer of that shape can run inside the reduction loop. `dtype` is the
    buffer's; a half-precision buffer's body is float32 (see `compute_dtype`), rounded on store.

    `target`, when set, names storage the program does not allocate for this node (an input, a
    constant, state, or a view of one) that the node writes in place: the node's own `name` is
    then only its identity in the scheduler, and nothing is allocated for it.

    `store_indirect` binds data-dependent symbols of `store_index` (a scatter: `index_put_`,
    `index_copy_` into a KV cache), as `Load.indirect` does for a read: a position outside
    [0, size) stores nothing and is reported as a gather's is (mutation's `scatter_store.py`).
    """

    name: str
    dtype: torch.dtype
    rows: Shape
    body: Body
    store_index: sympy.Expr
    reduction: str | None = None
    reduced: Shape = ()
    source_sizes: Shape = ()
    source_index: tuple[sympy.Expr, ...] = ()
    acc_dtype: torch.dtype | None = None
    origin: str = ""
    target: str | None = None
    store_indirect: tuple[Indirect, ...] = ()

    @property
    def buffer(self) -> str:
        """The buffer the node's result is stored in."""
        return self.target or self.name


def node_loads(node: ComputeNode) -> list[Load]:
    """Every load a compute node makes: its body's, and those of its store's data-dependent
    positions (the index tensor of a scatter)."""
    found = loads(node.body)
    for ind in node.store_indirect:
        found += [ld for ld in loads(ind.value) if ld not in found]
    return found


# -- fusion groups: what the scheduler makes of compute nodes and kernel codegen reads ----------


@dataclass(frozen=True)
class Member:
    """A compute node in a fusion group: its body and store index in the group's variables,
    and the level it runs at: "row" (once per row), "inner" (once per element of a row, inside
    a reduction loop) or "reduction"."""

    node: ComputeNode
    level: str  # "row" | "inner" | "reduction"


@dataclass
class FusionGroup:
    """Compute nodes that share loops (one kernel): over `rows` (variables x*) and, when it
    holds a reduction, `reduced` (variables r*)."""

    rows: Shape
    reduced: Shape = ()
    source_sizes: Shape = ()
    source_index: tuple[sympy.Expr, ...] = ()
    members: list[Member] = field(default_factory=list)
    # member counts of consecutive runs that share no produced or written storage (the scheduler's
    # cluster_members sets it): a Triton kernel runs each on its own blocks; empty: one run
    parts: tuple[int, ...] = ()

    def names(self) -> set[str]:
        return {m.node.name for m in self.members}

    def member(self, name: str) -> Member | None:
        return next((m for m in self.members if m.node.name == name), None)
