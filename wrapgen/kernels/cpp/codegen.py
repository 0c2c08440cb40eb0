"""A fusion group → one C++ kernel function (extern "C"), OpenMP-parallel over rows.

Layout of the generated function:

    for x0.. (parallel when the work is large)        rows; for pointwise groups the last
      row-level statements                            row loop is the vectorized (simd) one
      { accumulators; simd loop over r0..: inner statements, accumulate; finalize }
      ...                                              one such block per reduction segment

Reductions of float data accumulate in double (see `accumulator_dtype`; a small matrix product's
dot products in float32, as BLAS's); max/min carry a
separate NaN flag so they propagate NaN like eager yet still vectorize.

bfloat16 / float16 buffers are uint16_t; every value of a half dtype is a float local (loads
widen, `cast` to a half dtype and stores round, through the prelude's conversions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch

from wrapgen.kernels.cpp import epilogue_tiles
from wrapgen.kernels.cpp.loop_split import emit_in_ranges, split_ranges
from wrapgen.kernels.cpp.parallel_work import weighted_work
from wrapgen.kernels.cpp.printer import cpp_index
from wrapgen.kernels.cpp.row_cache import plan_row_cache
from wrapgen.kernels.cpp.row_offsets import hoist_row_offsets
from wrapgen.kernels.segments import in_place_pairs, read_in_later_segment, segments
from wrapgen.loop_ir import (
    Apply,
    Body,
    Const,
    FusionGroup,
    IndexValue,
    Load,
    Member,
    compute_dtype,
    free_cast,
    is_loop_var,
    loads,
    red_vars,
    row_vars,
    walk,
)

PARALLEL_THRESHOLD = 32768

CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
# half dtypes: the element type of their buffers, and the prelude's name for their conversions
STORAGE_CTYPES = {**CTYPES, torch.bfloat16: "uint16_t", torch.float16: "uint16_t"}
_HALF = {torch.bfloat16: "bf16", torch.float16: "half"}


def ctype(dtype: torch.dtype) -> str:
    """The C++ type of a local of `dtype`: its compute type (float for half dtypes)."""
    return CTYPES[compute_dtype(dtype)]


def widen(text: str, dtype: torch.dtype) -> str:
    """An element read from a `dtype` buffer, as a value of its compute type. A bool is read as
    its byte: g++ 12 vectorizes no loop that loads a `bool` (MPT's masked softmax ran scalar)."""
    if dtype == torch.bool:
        return f"(reinterpret_cast<const uint8_t&>({text}) != 0)"
    return f"wg_{_HALF[dtype]}_to_float({text})" if dtype in _HALF else text


def narrow(text: str, value_dtype: torch.dtype, dtype: torch.dtype) -> str:
    """A `value_dtype` value as an element of a `dtype` buffer (half dtypes round to nearest even)."""
    if dtype in _HALF:
        return f"wg_float_to_{_HALF[dtype]}({text if value_dtype == torch.float32 else f'static_cast<float>({text})'})"
    return text


@dataclass(frozen=True)
class GeneratedKernel:
    """Kernel source plus what the launch passes: tensors, then scalars (symbols or host expressions)."""

    name: str
    source: str
    tensors: tuple[str, ...]
    scalars: tuple[sympy.Expr, ...]
    host_exprs: tuple[sympy.Expr, ...]
    written: tuple[str, ...]
    metadata: tuple[tuple[str, object], ...]
    grid: tuple[sympy.Expr, ...] = ()  # launch grid (Triton); C++ kernels run on the host
    may_alias: tuple[tuple[str, str], ...] = ()  # (output, input) pairs safe to compute in place


def _fn(name: str, dtype: torch.dtype) -> str:
    if compute_dtype(dtype) != torch.float32:
        return name
    return "wg_expf" if name == "exp" else f"{name}f"  # the prelude's exp: see prelude.EXP


def _literal(value: object, dtype: torch.dtype) -> str:
    dtype = compute_dtype(dtype)
    t = CTYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'' if v > 0 else '-'}std::numeric_limits<{t}>::infinity()"
        text = repr(v)
        return f"{text}f" if dtype == torch.float32 else text
    v = int(value)
    return f"static_cast<{t}>(INT64_C({v}))"


def render_op(op: str, args: list[str], arg_dtypes: list[torch.dtype], dtype: torch.dtype) -> str:
    """C++ for one op; arguments are variable names or literals of the right type."""
    t = ctype(dtype)
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    floating = dtype.is_floating_point
    simple = {
        "add": f"{a} + {b}", "sub": f"{a} - {b}", "mul": f"{a} * {b}", "div": f"{a} / {b}",
        "eq": f"{a} == {b}", "ne": f"{a} != {b}", "lt": f"{a} < {b}", "le": f"{a} <= {b}",
        "gt": f"{a} > {b}", "ge": f"{a} >= {b}", "and": f"{a} && {b}", "or": f"{a} || {b}",
        "xor": f"{a} != {b}", "not": f"!{a}", "bitwise_and": f"{a} & {b}", "bitwise_or": f"{a} | {b}",
        "bitwise_xor": f"{a} ^ {b}", "neg": f"-{a}", "where": f"{a} ? {b} : {args[-1]}",
        "cast": f"static_cast<{t}>({a})", "maximum": f"wg_maximum<{t}>({a}, {b})",
        "minimum": f"wg_minimum<{t}>({a}, {b})", "clamp_min": f"std::max<{t}>({a}, {b})",
        "clamp_max": f"std::min<{t}>({a}, {b})", "relu": f"std::max<{t}>({a}, {t}(0))",
        "isnan": f"{a} != {a}",
    }
    if op == "cast" and dtype in _HALF:  # a float held to a half dtype's precision
        return f"wg_round_{_HALF[dtype]}({a if arg_dtypes[0] == torch.float32 else f'static_cast<float>({a})'})"
    if op in simple:
        return simple[op]
    if op == "bitwise_not":
        return f"!{a}" if dtype == torch.bool else f"~{a}"
    if op == "abs":
        return f"std::abs({a})"
    if op in ("floor", "ceil", "trunc", "round"):
        if not floating:
            return a
        return f"std::nearbyint({a})" if op == "round" else f"std::{op}({a})"
    if op == "sign":
        core = f"static_cast<{t}>(({t}(0) < {a}) - ({a} < {t}(0)))"
        return f"({a} != {a} ? {a} : {core})" if floating else core
    if op == "sqrt":
        return f"std::sqrt({a})"
    if op == "rsqrt":
        return f"{t}(1) / std::sqrt({a})"
    if op == "reciprocal":
        return f"{t}(1) / {a}"
    if op == "sigmoid":
        return f"{t}(1) / ({t}(1) + {_fn('exp', dtype)}(-{a}))"
    if op == "gelu":
        return f"{t}(0.5) * {a} * ({t}(1) + {_fn('erf', dtype)}({a} * {t}(0.70710678118654752440)))"
    if op == "gelu_tanh":
        inner = f"{t}(0.79788456080286535588) * ({a} + {t}(0.044715) * {a} * {a} * {a})"
        return f"{t}(0.5) * {a} * ({t}(1) + {_fn('tanh', dtype)}({inner}))"
    if op in ("pow", "atan2"):
        return f"{_fn(op, dtype)}({a}, {b})"
    if op == "fmod":
        return f"std::fmod({a}, {b})"
    if op == "remainder":
        return f"({a} - std::floor({a} / {b}) * {b})"
    if op in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
              "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf"):
        return f"{_fn(op, dtype)}({a})"
    raise NotImplementedError(f"no C++ rendering for op {op!r}")


_REDUCE = {
    # kind: (init, update, omp reduction operator)
    "sum": ("0", "{acc} += static_cast<{A}>({v});", "+"),
    "prod": ("1", "{acc} *= static_cast<{A}>({v});", "*"),
    "max": (None, "{acc} = std::max<{A}>({acc}, {v});", "max"),
    "min": (None, "{acc} = std::min<{A}>({acc}, {v});", "min"),
    "any": ("false", "{acc} = {acc} || {v};", "||"),
    "all": ("true", "{acc} = {acc} && {v};", "&&"),
}


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)


class CppKernelCodegen:
    """Generates one kernel for one FusionGroup."""

    def __init__(self, group: FusionGroup, name: str, needed: set[str], dtypes: dict[str, torch.dtype]) -> None:
        self.group, self.name, self.dtypes = group, name, dtypes
        self.members = {m.node.name: m for m in group.members}
        self.counter = 0
        self.params: dict[str, str] = {}  # buffer -> C parameter name
        self.written: list[str] = []
        self.read_from_memory: list[str] = []
        self.host: dict[sympy.Expr, str] = {}
        self.symbols: set[sympy.Symbol] = set()
        self.gather_indices: set[sympy.Symbol] = set()  # locals holding indices read from data
        self.hoisted: dict = {}  # index -> the same with its row-invariant part in a local (row_offsets.py)
        self.row_locals: set[sympy.Symbol] = set()  # those locals (not kernel parameters)
        self.items = segments(group)
        # inner results read by a later pass go through memory
        self.stored = {n for n, m in self.members.items() if n in needed or m.node.target} | read_in_later_segment(self.items, self.members)
        passes = {i: [m.node.body for m in ms] for i, (kind, ms) in enumerate(self.items) if kind == "segment"}
        self.row_cache = plan_row_cache(passes, sympy.Mul(*group.reduced)) if len(passes) > 1 else {}
        self.current_item = -1

    # -- names -----------------------------------------------------------------------------
    def tmp(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def param(self, buffer: str, write: bool) -> str:
        if buffer not in self.params:
            # named by position, not by buffer: groups that compute the same thing on other
            # buffers (a chain of identical layers) then generate identical code and share a kernel
            self.params[buffer] = f"{'out' if write else 'in'}_ptr{len(self.params)}"
        if write and buffer not in self.written:
            self.written.append(buffer)
        if not write and buffer not in self.read_from_memory:
            self.read_from_memory.append(buffer)
        return self.params[buffer]

    def index(self, expr: object) -> str:
        e = sympy.sympify(expr)
        text = cpp_index(e, hoist=self.size)
        self.symbols |= {s for s in e.free_symbols if not is_loop_var(s) and s not in self.gather_indices | self.row_locals}
        return text

    def size(self, expr: object) -> str:
        """A loop bound or work size: a literal, a size symbol, or a host-computed parameter."""
        e = sympy.sympify(expr)
        if e.is_Integer or e.is_Symbol:
            return self.index(e)
        if e not in self.host:
            self.host[e] = f"h{len(self.host)}"
        return self.host[e]

    # -- values ----------------------------------------------------------------------------
    def value(self, body: Body, memo: dict, local: dict[str, str], w: _Writer) -> str:
        if body in memo:
            return memo[body]
        cached = self.row_cache.get(body)
        if cached is not None and cached.producer < self.current_item:
            name = self.tmp()
            w.line(f"const {ctype(body.dtype)} {name} = {cached.array}[{self.index(_flat_reduced_index(self.group))}];")
            memo[body] = name
            return name
        if isinstance(body, Const):
            return _literal(body.value, body.dtype)
        if isinstance(body, IndexValue):
            text = f"static_cast<{ctype(body.dtype)}>({self.index(body.expr)})"
        elif isinstance(body, Load) and body.indirect:
            text = widen(f"{self.param(body.buffer, False)}[{self.index(self._gather_index(body, memo, local, w))}]", body.dtype)
        elif isinstance(body, Load):
            if body.buffer in local:
                return local[body.buffer]
            text = widen(f"{self.param(body.buffer, False)}[{self.index(self.hoisted.get(body.index, body.index))}]", body.dtype)
        else:
            assert isinstance(body, Apply)
            args = [self.value(a, memo, local, w) for a in body.args]
            if free_cast(body):
                memo[body] = args[0]
                if cached is not None and cached.producer == self.current_item:  # a cached upcast is still stored
                    w.line(f"{cached.array}[{self.index(_flat_reduced_index(self.group))}] = {args[0]};")
                return args[0]
            text = render_op(body.op, args, [a.dtype for a in body.args], body.dtype)
        name = self.tmp()
        w.line(f"const {ctype(body.dtype)} {name} = {text};")
        if cached is not None and cached.producer == self.current_item:
            w.line(f"{cached.array}[{self.index(_flat_reduced_index(self.group))}] = {name};")
        memo[body] = name
        return name

    def _gather_index(self, load: Load, memo: dict, local: dict[str, str], w: _Writer) -> sympy.Expr:
        """The load's index with each data-dependent position computed into a local (once per
        scope: `memo`); a position out of range sets the kernel's status (the caller raises)
        and reads position 0 instead, so nothing is read outside the buffer. The check is
        branch-free and the status an OpenMP `|` reduction (`_finish`), so the loop still
        vectorizes (a conditional atomic store kept gcc from if-converting it)."""
        mapping = {}
        for ind in load.indirect:
            key = ("gather", ind.value, ind.size)
            if key not in memo:
                value = self.value(ind.value, memo, local, w)
                name, size, bad = self.tmp(), self.size(ind.size), self.tmp()
                w.line(f"const int64_t {name}_raw = static_cast<int64_t>({value});")
                w.line(f"const bool {bad} = {name}_raw < 0 || {name}_raw >= {size};")
                w.line(f"const int64_t {name} = {bad} ? 0 : {name}_raw;")
                w.line(f"wg_bad_index |= {bad};")
                memo[key] = name
            symbol = sympy.Symbol(memo[key], integer=True)
            self.gather_indices.add(symbol)
            mapping[ind.symbol] = symbol
        return sympy.sympify(load.index).xreplace(mapping)

    def _hoist_gathers(self, members: list[Member], memo: dict, local: dict[str, str], w: _Writer) -> None:
        """Compute, at row level, the gather positions of `members` that do not change along the
        reduced dimensions (an embedding row's token id under a LayerNorm of that row): once per
        row instead of once per element and pass."""
        for m in members:
            for load in loads(m.node.body):
                if load.indirect and all(_row_invariant(ind.value) for ind in load.indirect):
                    self._gather_index(load, memo, local, w)

    def _hoist_invariants(self, members: list[Member], memo: dict, local: dict[str, str], w: _Writer) -> None:
        """Compute, once per row before the reduced loops, each largest part of the members'
        bodies that reads nothing changing along them (a batch norm's per-channel scale under a
        max-pool window, fused in: a square root and a division per tap otherwise)."""
        known: dict[Body, bool] = {}

        def invariant(body: Body) -> bool:
            if body not in known:
                reads_loop_values = any(isinstance(n, Load) and (n.indirect or (n.buffer in self.members and n.buffer not in local))
                                        for n in walk(body))
                known[body] = not reads_loop_values and _row_invariant(body)
            return known[body]

        def visit(body: Body) -> None:
            if not isinstance(body, Apply) or body in memo or body in self.row_cache:
                return
            if invariant(body):
                self.value(body, memo, local, w)
                return
            for arg in body.args:
                visit(arg)

        for m in members:
            visit(m.node.body)

    def store(self, member: Member, var: str, w: _Writer, memo: dict | None = None,
              local: dict[str, str] | None = None) -> None:
        if member.node.name in self.stored:
            node = member.node
            value_dtype = compute_dtype(node.dtype if node.reduction else node.body.dtype)
            index = self.hoisted.get(node.store_index, node.store_index)
            pointer, stored = self.param(node.buffer, True), narrow(var, value_dtype, node.dtype)
            if not node.store_indirect:
                w.line(f"{pointer}[{self.index(index)}] = {stored};")
                return
            # a scatter: positions read from data; one out of range stores nothing and sets the status
            memo, local = memo if memo is not None else {}, local if local is not None else {}
            mapping, bad = {}, []
            for ind in node.store_indirect:
                value = self.value(ind.value, memo, local, w)
                name, size = self.tmp(), self.size(ind.size)
                w.line(f"const int64_t {name} = static_cast<int64_t>({value});")
                bad.append(f"{name} < 0 || {name} >= {size}")
                symbol = sympy.Symbol(name, integer=True)
                self.gather_indices.add(symbol)
                mapping[ind.symbol] = symbol
            flag = self.tmp()
            w.line(f"const bool {flag} = {' || '.join(bad)};")
            w.line(f"wg_bad_index |= {flag};")
            w.line(f"if (!{flag}) {pointer}[{self.index(sympy.sympify(index).xreplace(mapping))}] = {stored};")

    # -- emission --------------------------------------------------------------------------
    def generate(self) -> GeneratedKernel:
        g = self.group
        body = _Writer()
        parallel = self._parallel_clause()
        xs, local, memo = row_vars(len(g.rows)), {}, {}
        tile = epilogue_tiles.tile_size(self)
        ranges = None  # the innermost loop of a pointwise kernel, split where its body selects by index
        if xs and not g.reduced and tile is None and all(kind == "row" for kind, _ in self.items):
            ranges = split_ranges([m.node.body for _, ms in self.items for m in ms], xs[-1], g.rows[-1])
        for d, (x, extent) in enumerate(zip(xs, g.rows)):
            last = d == len(xs) - 1
            if not g.reduced and last:
                pragma = f"#pragma omp parallel for simd{parallel}" if d == 0 and parallel is not None else "#pragma omp simd"
                if ranges is not None:
                    emit_in_ranges(body, x, ranges, pragma, lambda: self._rows(dict(memo), dict(local), body))
                    break
                body.line(pragma)
            elif d == 0 and parallel is not None:
                collapse = len(xs) if g.reduced else len(xs) - 1
                clause = f" collapse({collapse})" if collapse > 1 else ""
                body.line(f"#pragma omp parallel for{clause}{parallel}")
            if tile is not None and last:
                body.line(f"for (int64_t {x}t = 0; {x}t < {self.size(extent)}; {x}t += {tile}) {{")
            else:
                body.line(f"for (int64_t {x} = 0; {x} < {self.size(extent)}; ++{x}) {{")
            body.depth += 1
        if not xs:
            body.line("{")
            body.depth += 1
        for cached in self.row_cache.values():
            body.line(f"alignas(64) {ctype(cached.body.dtype)} {cached.array}[{self.size(sympy.Mul(*g.reduced))}];")
        if ranges is None:
            self._rows(memo, local, body, self.items if tile is None else ())
        if tile is not None:
            epilogue_tiles.emit(self, xs[-1], int(g.rows[-1]), tile, memo, local, body, ctype)
        for _ in range(max(len(xs), 1) - (ranges is not None)):
            body.depth -= 1
            body.line("}")
        return self._finish(body)

    def _rows(self, memo: dict, local: dict[str, str], body: _Writer, items: list | tuple | None = None) -> None:
        """The items' code inside the row loops: each row member stored, each segment run."""
        for item, (kind, ms) in enumerate(self.items if items is None else items):
            self.current_item = item
            if kind == "row":
                m = ms[0]
                var = self.value(m.node.body, memo, local, body)
                local[m.node.name] = var
                self.store(m, var, body, memo, local)
            else:
                self.segment(ms, memo, local, body)

    def _parallel_clause(self) -> str | None:
        """Parallel once the group's elements × their weight (parallel_work) reach PARALLEL_THRESHOLD;
        a symbolic count is compared with the threshold over the weight, so kernels of one
        iteration space share its size argument."""
        if not self.group.rows:
            return None
        elements, weight = weighted_work(self.group)
        if elements.is_Integer:
            return "" if int(elements) * weight >= PARALLEL_THRESHOLD else None
        return f" if({self.size(elements)} >= {-(-PARALLEL_THRESHOLD // weight)})"

    def segment(self, members: list[Member], memo: dict, local: dict[str, str], w: _Writer) -> None:
        """One pass over the reduced dimensions: accumulate its reductions, run its inner members."""
        reductions = [m for m in members if m.level == "reduction"]
        self._hoist_gathers(members, memo, local, w)
        self._hoist_invariants(members, memo, local, w)
        results = {}
        for m in reductions:
            results[m.node.name] = f"red{self.tmp()}"
            w.line(f"{ctype(m.node.dtype)} {results[m.node.name]};")
        w.line("{")
        w.depth += 1
        accs: dict[str, tuple[str, str | None]] = {}
        clauses = []
        for m in reductions:
            if m.node.reduction in ARG_REDUCTIONS:
                acc, best = self.tmp(), self.tmp()
                w.line(f"{ctype(m.node.acc_dtype)} {acc} = {_extreme(m.node.acc_dtype, m.node.reduction[3:])};")
                w.line(f"int64_t {best} = 0;")
                accs[m.node.name] = (acc, best)
                continue
            acc, nan = self.tmp(), None
            init, _, op = _REDUCE[m.node.reduction]
            if init is None:
                init = _extreme(m.node.acc_dtype, m.node.reduction)
                if m.node.dtype.is_floating_point:
                    nan = self.tmp()
                    w.line(f"int {nan} = 0;")
                    clauses.append(f"reduction(|:{nan})")
            w.line(f"{ctype(m.node.acc_dtype)} {acc} = {init};")
            clauses.append(f"reduction({op}:{acc})")
            accs[m.node.name] = (acc, nan)
        rs = red_vars(len(self.group.reduced))
        self.hoisted = hoist_row_offsets(self, members, rs, w)
        ordered = any(m.node.reduction in ARG_REDUCTIONS for m in reductions)  # first index wins: no simd
        ranges = split_ranges([m.node.body for m in members], rs[-1], self.group.reduced[-1]) if rs else None
        for d, (r, extent) in enumerate(zip(rs, self.group.reduced)):
            if d == len(rs) - 1 and ranges is not None:  # the innermost loop in pieces, in order
                pragma = None if ordered else " ".join(["#pragma omp simd", *clauses])
                emit_in_ranges(w, r, ranges, pragma, lambda: self._inner(members, accs, dict(memo), dict(local), w))
                break
            if d == len(rs) - 1 and not ordered:
                w.line(" ".join(["#pragma omp simd", *clauses]))
            w.line(f"for (int64_t {r} = 0; {r} < {self.size(extent)}; ++{r}) {{")
            w.depth += 1
        else:
            self._inner(members, accs, dict(memo), dict(local), w)
        for _ in rs[:-1] if ranges is not None else rs:
            w.depth -= 1
            w.line("}")
        self.hoisted = {}  # its locals end with the segment's block
        self._finish_segment(reductions, results, accs, local, w)

    def _inner(self, members: list[Member], accs: dict[str, tuple[str, str | None]], inner_memo: dict,
               inner_local: dict[str, str], w: _Writer) -> None:
        """The body of a segment's innermost loop: inner members stored, reductions accumulated."""
        for m in members:
            var = self.value(m.node.body, inner_memo, inner_local, w)
            if m.level == "inner":
                inner_local[m.node.name] = var
                self.store(m, var, w)
                continue
            acc, nan = accs[m.node.name]
            if m.node.reduction in ARG_REDUCTIONS:
                better = f"{var} > {acc}" if m.node.reduction == "argmax" else f"{var} < {acc}"
                if m.node.acc_dtype.is_floating_point:  # the first NaN wins, as in eager
                    better = f"{better} || ({var} != {var} && {acc} == {acc})"
                w.line(f"if ({better}) {{ {acc} = {var}; {nan} = {self.index(_flat_reduced_index(self.group))}; }}")
                continue
            w.line(_REDUCE[m.node.reduction][1].format(acc=acc, v=var, A=ctype(m.node.acc_dtype)))
            if nan is not None:
                w.line(f"{nan} |= ({var} != {var});")

    def _finish_segment(self, reductions: list[Member], results: dict[str, str],
                        accs: dict[str, tuple[str, str | None]], local: dict[str, str], w: _Writer) -> None:
        for m in reductions:
            acc, nan = accs[m.node.name]
            t = ctype(m.node.dtype)
            if m.node.reduction in ARG_REDUCTIONS:
                w.line(f"{results[m.node.name]} = {nan};")
                continue
            result = f"static_cast<{t}>({acc})"
            if nan is not None:
                result = f"{nan} ? std::numeric_limits<{t}>::quiet_NaN() : {result}"
            w.line(f"{results[m.node.name]} = {result};")
        w.depth -= 1
        w.line("}")
        for m in reductions:
            local[m.node.name] = results[m.node.name]
            self.store(m, results[m.node.name], w)

    def _finish(self, body: _Writer) -> GeneratedKernel:
        tensors = list(dict.fromkeys(self.read_from_memory + self.written))
        may_alias = in_place_pairs(self.group, self.stored, self.dtypes)
        aliased = {name for pair in may_alias for name in pair}
        params = []
        for t in tensors:
            element = STORAGE_CTYPES[self.dtypes[t]]
            restrict = "" if t in aliased else " __restrict__"  # buffers that may share storage are not restrict
            if t in self.written:
                params.append(f"{element}*{restrict} {self.params[t]}")
            else:
                params.append(f"const {element}*{restrict} {self.params[t]}")
        symbols = sorted(self.symbols, key=str)
        params += [f"int64_t {s}" for s in symbols]
        host = list(self.host)
        params += [f"int64_t {self.host[e]}" for e in host]
        origins = ",".join(dict.fromkeys(m.node.origin for m in self.group.members if m.node.origin))
        metadata = (("device", "cpu"), ("ops", origins))
        if self.gather_indices:
            # a kernel that reads indices from data returns a status: nonzero if one was out of
            # range; every loop combines its iterations' flags by `|`
            body.lines = [f"{line} reduction(|:wg_bad_index)" if _omp_loop(line) else line for line in body.lines]
            head = f'extern "C" int64_t {self.name}({", ".join(params)}) {{'
            lines = [head, "  int64_t wg_bad_index = 0;", *body.lines, "  return wg_bad_index;", "}"]
            metadata += ((STATUS_KEY, True),)
        else:
            lines = [f'extern "C" void {self.name}({", ".join(params)}) {{', *body.lines, "}"]
        source = "\n".join(lines) + "\n"
        return GeneratedKernel(self.name, source, tuple(tensors), tuple(symbols) + tuple(host), tuple(host),
                               tuple(self.written), metadata, may_alias=may_alias)


ARG_REDUCTIONS = ("argmax", "argmin")
# KernelDefinition metadata of a C++ kernel that returns an int64 status (nonzero: an index
# read from data was out of range); callers check it and raise IndexError
STATUS_KEY = "returns_status"
OUT_OF_RANGE = "an index read from tensor data is out of range"  # what callers raise on a nonzero status


def _omp_loop(line: str) -> bool:
    text = line.strip()
    return text.startswith("#pragma omp") and (" simd" in text or " for" in text)


def _row_invariant(body: Body) -> bool:
    """Whether `body` reads nothing that changes along a reduced dimension (no r<d> variable)."""
    for node in walk(body):
        exprs = [node.index] if isinstance(node, Load) else [node.expr] if isinstance(node, IndexValue) else []
        if any(is_loop_var(s, "r") for e in exprs for s in sympy.sympify(e).free_symbols):
            return False
    return True


def _flat_reduced_index(group: FusionGroup) -> sympy.Expr:
    """The row-major position within the reduced dimensions (what argmax/argmin return)."""
    flat, stride = sympy.Integer(0), sympy.Integer(1)
    for r, extent in reversed(list(zip(red_vars(len(group.reduced)), group.reduced))):
        flat += r * stride
        stride = stride * extent
    return flat


def _extreme(dtype: torch.dtype, kind: str) -> str:
    dtype = compute_dtype(dtype)
    t = CTYPES[dtype]
    if dtype == torch.bool:
        return "false" if kind == "max" else "true"
    if dtype.is_floating_point:
        return f"{'-' if kind == 'max' else ''}std::numeric_limits<{t}>::infinity()"
    return f"std::numeric_limits<{t}>::{'lowest' if kind == 'max' else 'max'}()"


def generate_cpp(group: FusionGroup, name: str, needed: set[str], dtypes: dict[str, torch.dtype],
                 hints: dict | None = None, aligned: set[str] | None = None, device_type: str = "cpu") -> GeneratedKernel:
    return CppKernelCodegen(group, name, needed, dtypes).generate()
