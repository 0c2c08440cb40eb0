"""Reductions down the columns of a row-major tensor (bias and norm-weight gradients, pooling
windows and spatial means of NHWC activations) as C++ kernels that run along memory.

The general kernel puts each output element in the outer loop and walks the reduced dimension
inside it: for `grad.sum(0)` of a [tokens, features] gradient that is a strided walk per
feature, one scalar accumulator, nothing to vectorize. Here the output is cut into blocks of
`BLOCK` adjacent elements (parallel over blocks): each block keeps `BLOCK` accumulators and the
reduced loop, outside, feeds them a contiguous `BLOCK`-wide slice of each row (the simd loop),
so every load is contiguous and every row is read once per block. The sum of each output
element still runs over the reduced elements in order (accumulating in the same type). Max and
min (a channels-last max pool, with the batch norm and ReLU before it fused in) keep a NaN flag
per element beside each accumulator, as the general kernel keeps one: a NaN anywhere wins.

A sum that reads another sum's result (a variance after its mean: batch-norm statistics over an
NHWC activation, where the channel is the contiguous kept dimension) runs in a later pass over
the reduced elements: each pass ends with the block's results (and the per-element work on
them) held in `BLOCK`-wide arrays, which the next pass's sums read at their element.
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.kernels.cpp import lane_tiles
from wrapgen.kernels.cpp.codegen import (
    _REDUCE,
    PARALLEL_THRESHOLD,
    CppKernelCodegen,
    GeneratedKernel,
    _extreme,
    _Writer,
    ctype,
    generate_cpp,
)
from wrapgen.kernels.cpp.merged_reductions import merge_reduced
from wrapgen.loop_ir import FusionGroup, Load, loads, red_vars, row_vars

BLOCK = 16  # output elements per block: one or two vector registers of float
WIDE_VECTORS = 8  # multiply-add chains in flight in a small product's block (see `wide_block`, `chains`)
WIDE_WORK = 1 << 20  # multiply-adds up to which a kernel is small (one thread, weights in L2)
KINDS = ("sum", "prod", "max", "min")  # reductions a block of accumulators can carry


def is_column_reduction(group: FusionGroup) -> bool:
    """Reductions (`KINDS`, and per-element work on their results) whose loads are contiguous
    along the innermost kept dimension (coefficient 1) and not along the innermost reduced
    dimension (a window's clamped index along it is not contiguous either); a reduction may read
    the group's earlier results (a later pass, see `passes`)."""
    if not group.rows or not group.reduced or not group.members:
        return False
    sums = [m for m in group.members if m.level == "reduction"]
    if not sums or any(m.level not in ("reduction", "row") for m in group.members):
        return False
    if any(m.node.reduction not in KINDS or not m.node.dtype.is_floating_point for m in sums):
        return False
    if passes(group) is None:
        return False
    x0, inner = row_vars(len(group.rows))[-1], red_vars(len(group.reduced))[-1]
    produced = {m.node.name for m in group.members}
    columns = False
    for m in sums:
        for load in loads(m.node.body):
            if load.buffer in produced:
                continue  # an earlier pass's result, read at the sum's own element
            step = _coefficient(load, x0)
            if step is None or step not in (0, 1):
                return False
            if step == 1:
                if _coefficient(load, inner) == 1:
                    return False  # contiguous along the reduction: the row-wise kernel suits it
                columns = True
    return columns


def passes(group: FusionGroup) -> dict[str, int] | None:
    """Each member's pass over the reduced elements: a sum's is one more than the latest pass of
    the group's results it reads, a per-element member's the latest it reads (0: reads none);
    None when a member reads a later one."""
    position = {m.node.name: i for i, m in enumerate(group.members)}
    out: dict[str, int] = {}
    for m in group.members:
        reads = [ld.buffer for ld in loads(m.node.body) if ld.buffer in position]
        if any(position[b] >= position[m.node.name] for b in reads):
            return None
        latest = max((out[b] for b in reads), default=0)
        out[m.node.name] = latest + 1 if m.level == "reduction" else latest
    return out


def _coefficient(load: Load, var: sympy.Symbol) -> int | None:
    """How far `load`'s index moves when `var` grows by one (None: not affine in it, or gathered)."""
    if load.indirect:
        return None
    index = sympy.expand(sympy.sympify(load.index))
    if not index.is_polynomial(var) or sympy.degree(index, var) > 1:
        return None
    step = index.coeff(var, 1) if index.has(var) else sympy.Integer(0)
    return int(step) if step.is_Integer else None


def wide_block(group: FusionGroup) -> int | None:
    """Output elements per block of a small product, None for others (they take `BLOCK`). A small
    matrix-vector product over a K-major weight (a vector times a [K, N] matrix:
    graph_passes/product_weights.py lays linear layers' weights out so for them) is a column sum
    whose block of 16 leaves one or two vector accumulators, each a chain of K dependent
    multiply-adds: latency-bound. A wide block (`WIDE_VECTORS` vectors; the whole row when it is
    narrower; else the widest whole number of vectors that divides the row), with `chains` cutting
    its reduced loop when it is narrow, keeps `WIDE_VECTORS` chains in flight, which streams the
    weight at about the speed of L2 (the demo's 64x256 product with its GELU: 2.3 us row-major with
    lane tiles, 1.2 us so, on a 2-core Zen 3 VM). It is taken for single-pass float sums whose
    work is small enough to run on one thread (`WIDE_WORK` for whole wide blocks; a narrower one
    only where `BLOCK` would not have run in parallel either)."""
    lanes = lane_tiles.lanes(torch.float32)
    wide = WIDE_VECTORS * lanes
    extent = sympy.sympify(group.rows[-1])
    work = sympy.Mul(*group.rows, *group.reduced)
    sums = [m for m in group.members if m.level == "reduction"]
    order = passes(group)
    if not extent.is_Integer or not work.is_Integer or int(work) > WIDE_WORK:
        return None
    if order is None or max(order.values()) != 1 or any(m.node.reduction != "sum" for m in sums):
        return None
    if any(m.node.acc_dtype != torch.float32 for m in sums) or any(m.node.store_indirect for m in group.members):
        return None
    if any(ld.indirect for m in group.members for ld in loads(m.node.body)):
        return None
    n = int(extent)
    if n % wide == 0:
        return wide
    if int(work) >= PARALLEL_THRESHOLD:
        return None  # `BLOCK` would run it on every thread: a narrower wide block keeps one
    if n <= wide:
        return n
    return next((w for w in range(wide - lanes, 0, -lanes) if n % w == 0), None)


def chains(group: FusionGroup, width: int) -> int:
    """Interleaved partial sums per output element of a wide block narrower than `WIDE_VECTORS`
    vectors (a 256x64 product's 64 columns are 4 AVX-512 vectors): its reduced loop is cut into
    that many chains so that `WIDE_VECTORS` multiply-add chains are in flight either way (the
    demo's 256x64 product: 0.85 -> 0.40 us on a 2-core Zen 5 VM). Each element's sum is then added
    in another order than one chain's, as any blocked sum is. Needs one static reduced dimension
    that the count divides."""
    if len(group.reduced) != 1 or not sympy.sympify(group.reduced[0]).is_Integer:
        return 1
    lanes = lane_tiles.lanes(torch.float32)
    want = max(1, WIDE_VECTORS // -(-width // lanes))
    k = int(sympy.sympify(group.reduced[0]))
    return next(c for c in range(max(1, min(want, k)), 0, -1) if k % c == 0)


class ColumnReductionCodegen(CppKernelCodegen):
    """The column-blocked loop nest of `is_column_reduction` groups (see the module docstring)."""

    def generate(self) -> GeneratedKernel:
        g = self.group
        self.row_cache = {}  # one pass over the reduced elements: nothing to carry between passes
        wide = wide_block(g)
        self.block = wide or BLOCK
        self.wide = wide is not None
        self.chains = chains(g, wide) if wide else 1
        body = _Writer()
        xs = row_vars(len(g.rows))
        x0 = xs[-1]  # the blocked dimension; the others are plain outer loops
        extent = self.size(g.rows[-1])
        parallel = None if wide else self._parallel_clause()
        if parallel is not None:
            collapse = f" collapse({len(xs)})" if len(xs) > 1 else ""
            body.line(f"#pragma omp parallel for{collapse}{parallel}")
        for x, outer in zip(xs[:-1], g.rows[:-1]):
            body.line(f"for (int64_t {x} = 0; {x} < {self.size(outer)}; ++{x}) {{")
            body.depth += 1
        body.line(f"for (int64_t xb = 0; xb < {extent}; xb += {self.block}) {{")
        body.depth += 1
        if not wide:
            body.line(f"const int64_t xe = std::min<int64_t>(xb + {BLOCK}, {extent});")
        else:  # whole blocks: a constant trip count, so the accumulators live in registers
            body.line(f"const int64_t xe = xb + {self.block};")
        order = passes(g)
        assert order is not None
        read = {ld.buffer for m in g.members for ld in loads(m.node.body)}
        held: dict[str, str] = {}  # the block's results of a member another reads (maybe a later pass's)
        for m in g.members:
            if m.node.name in read and max(order.values()) > 1:
                held[m.node.name] = f"blk{self.tmp()}"
                value_dtype = m.node.dtype if m.level == "reduction" else m.node.body.dtype
                body.line(f"{ctype(value_dtype)} {held[m.node.name]}[{self.block}];")
        for number in range(1, max(order.values()) + 1):
            self._pass(g, number, order, held, x0, body)
        for _ in range(len(xs)):
            body.depth -= 1
            body.line("}")
        return self._finish(body)

    def _pass(self, g: FusionGroup, number: int, order: dict[str, int], held: dict[str, str], x0: sympy.Symbol,
              body: _Writer) -> None:
        """One pass over the reduced elements for the sums of pass `number`, then the per-element
        work of that pass (and, in the first, of pass 0), each result stored and, where a later
        sum reads it, kept in its block array."""
        sums = [m for m in g.members if m.level == "reduction" and order[m.node.name] == number]
        accs, nans = {}, {}
        for m in sums:
            acc = accs[m.node.name] = f"acc{self.tmp()}"
            kind, acc_type = m.node.reduction, ctype(m.node.acc_dtype)
            init = _REDUCE[kind][0] or _extreme(m.node.acc_dtype, kind)
            if self.chains > 1:  # wide blocks hold single-pass sums only (`wide_block`)
                body.line(f"alignas(64) {acc_type} {acc}[{self.chains}][{self.block}] = {{}};")
            elif init == "0":
                body.line(f"alignas(64) {acc_type} {acc}[{self.block}] = {{}};")
            else:
                body.line(f"{acc_type} {acc}[{self.block}];")
                body.line(f"std::fill_n({acc}, {self.block}, {acc_type}({init}));")
            if kind in ("max", "min"):
                nans[m.node.name] = f"nan{self.tmp()}"
                body.line(f"int {nans[m.node.name]}[{BLOCK}] = {{}};")
        if self.chains > 1:  # one reduced dimension, cut into interleaved chains (`chains`)
            (r,), c = red_vars(1), self.chains
            body.line(f"for (int64_t rb = 0; rb < {self.size(g.reduced[0])}; rb += {c}) {{")
            body.line(f"  #pragma GCC unroll {c}")
            body.line(f"  for (int64_t rc = 0; rc < {c}; ++rc) {{")
            body.line(f"    const int64_t {r} = rb + rc;")
            body.depth += 2
        else:
            for r, r_extent in zip(red_vars(len(g.reduced)), g.reduced):
                body.line(f"for (int64_t {r} = 0; {r} < {self.size(r_extent)}; ++{r}) {{")
                body.depth += 1
        body.line("#pragma omp simd")
        body.line(f"for (int64_t {x0} = xb; {x0} < xe; ++{x0}) {{")
        body.depth += 1
        earlier = {name: f"{array}[{x0} - xb]" for name, array in held.items() if order[name] < number}
        memo: dict = {}
        for m in sums:
            var = self.value(m.node.body, memo, dict(earlier), body)
            slot = f"{accs[m.node.name]}{'[rc]' if self.chains > 1 else ''}[{x0} - xb]"
            body.line(_REDUCE[m.node.reduction][1].format(acc=slot, v=var, A=ctype(m.node.acc_dtype)))
            if m.node.name in nans:
                body.line(f"{nans[m.node.name]}[{x0} - xb] |= ({var} != {var});")
        for _ in range((2 if self.chains > 1 else len(g.reduced)) + 1):
            body.depth -= 1
            body.line("}")
        if self.wide:  # element-wise work on whole blocks: libmvec serves its exp/erf
            body.line("#pragma omp simd")
        body.line(f"for (int64_t {x0} = xb; {x0} < xe; ++{x0}) {{")
        body.depth += 1
        local: dict[str, str] = dict(earlier)
        row_memo: dict = {}
        for m in g.members:  # this pass's sums in order, with the per-element work that follows them
            mine = order[m.node.name] == number or (number == 1 and order[m.node.name] == 0)
            if not mine:
                continue
            if m.level == "reduction":
                var, t = self.tmp(), ctype(m.node.dtype)
                parts = [f"{accs[m.node.name]}{f'[{c}]' if self.chains > 1 else ''}[{x0} - xb]"
                         for c in range(self.chains)]
                result = f"static_cast<{t}>({' + '.join(parts)})"
                if m.node.name in nans:
                    result = f"{nans[m.node.name]}[{x0} - xb] ? std::numeric_limits<{t}>::quiet_NaN() : {result}"
                body.line(f"const {t} {var} = {result};")
            else:
                var = self.value(m.node.body, row_memo, local, body)
            local[m.node.name] = var
            if m.node.name in held:
                body.line(f"{held[m.node.name]}[{x0} - xb] = {var};")
            self.store(m, var, body)
        body.depth -= 1
        body.line("}")


def generate_cpp_kernel(group: FusionGroup, name: str, needed: set[str], dtypes: dict, hints: dict | None = None,
                        aligned: set[str] | None = None, device_type: str = "cpu") -> GeneratedKernel:
    """`generate_cpp`, with column sums generated by `ColumnReductionCodegen`, after merging the
    reduced dimensions that run through memory as one (merged_reductions.py)."""
    group = merge_reduced(group)
    if is_column_reduction(group):
        return ColumnReductionCodegen(group, name, needed, dtypes).generate()
    return generate_cpp(group, name, needed, dtypes, hints, aligned, device_type)
