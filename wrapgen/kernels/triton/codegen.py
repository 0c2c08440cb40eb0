"""A fusion group → one Triton kernel (the source of a small Python module, as data).

Layout of the generated kernel:

    pointwise      one program per XBLOCK flat elements of the rows; xmask only when the
                   block does not divide the element count
    persistent     (static reduced size ≤ PERSISTENT_LIMIT) XBLOCK rows × RBLOCK ≥ reduced
    reduction      elements per program: every pass over the reduced dims is one
                   in-register block, so a row is read from memory once
    looped         otherwise: each pass over the reduced dims is a loop over RBLOCK
    reduction      chunks, accumulating elementwise and reducing across the block at the
                   end; an inner value a later pass needs is recomputed from its inputs

Index expressions whose loop variables follow a contiguous pattern become `xindex` /
`rindex` (or `xindex % n`) so Triton sees contiguity and vectorizes; the rest decompose the
flat index into per-dimension variables. Sizes that are neither literals nor bare symbols are
computed on the host (`host_exprs`) and passed as scalars; the grid is of the size symbols.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

import sympy
import torch
from torch.utils._sympy.functions import CeilDiv

from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.index_ranges import always_inside
from wrapgen.kernels.online_softmax import merge_online_softmax
from wrapgen.kernels.segments import in_place_pairs, part_members, parts_read_apart, segments
from wrapgen.kernels.triton.launch_config import LaunchConfig, choose_config
from wrapgen.kernels.triton.ops import ARG_REDUCTIONS, OpRenderer, SourceWriter, compute_tl, literal
from wrapgen.kernels.triton.printer import triton_index
from wrapgen.kernels.triton.reductions import ReductionRenderer
from wrapgen.loop_ir import (
    HALF_DTYPES,
    Apply,
    Body,
    Const,
    FusionGroup,
    IndexValue,
    Load,
    Member,
    free_cast,
    is_loop_var,
    loads,
    node_loads,
    red_vars,
    row_vars,
)

INT32_LIMIT = 2**31 - 1

XFLAT = sympy.Symbol("xindex", integer=True, nonnegative=True)
RFLAT = sympy.Symbol("rindex", integer=True, nonnegative=True)


def _is_loop(s: sympy.Symbol) -> bool:
    return s in (XFLAT, RFLAT) or is_loop_var(s)


MAX_PARTS = 65535  # a CUDA grid's axis 1


class TritonKernelCodegen(ReductionRenderer, OpRenderer):
    """Generates one Triton kernel for one FusionGroup."""

    def __init__(self, group: FusionGroup, name: str, needed: set[str], dtypes: dict[str, torch.dtype],
                 hints: dict | None = None, aligned: set[str] | None = None, device_type: str = "cuda") -> None:
        self.group, self.name, self.dtypes = group, name, dtypes
        self.interpreted = device_type == "cpu"  # CPU Triton kernels run in Triton's interpreter
        self.members = {m.node.name: m for m in group.members}
        self.items = segments(group)
        self.stored = {n for n, m in self.members.items() if n in needed or m.node.target}  # state is always written
        self.aligned = aligned if aligned is not None else set()
        self.reduction = bool(group.reduced)
        self.rows = tuple(sympy.sympify(s) for s in group.rows)
        self.reduced = tuple(sympy.sympify(s) for s in group.reduced)
        self.xnumel = sympy.Mul(*self.rows)
        self.rnumel = sympy.Mul(*self.reduced) if self.reduction else None
        self.config = choose_config(self.xnumel, self.rnumel, hints or {}, *self._read_directions())
        self.counter, self.libdevice, self.index_bound_ok = 0, False, True
        self.params: dict[str, str] = {}
        self.read: list[str] = []
        self.written: list[str] = []
        self.host: dict[sympy.Expr, str] = {}
        self.symbols: set[sympy.Symbol] = set()
        self.helpers, self.used_vars = set[str](), set[str]()
        self.hints = hints or {}
        self.var_axes: dict[str, frozenset[str]] = {}  # temporaries: the loop axes their block spans
        self.gather_indices: dict[sympy.Symbol, frozenset[str]] = {}  # indices read from data: their axes
        self.checks_positions = False  # a device assert checks a gathered position (a debug build)
        self.online: dict[str, str] = {}  # sums of exp computed online with their maximum: {sum: max}
        self.deferred: set[str] = set()  # inner values only those sums read: not computed

    # -- sizes and indices -------------------------------------------------------------------
    def size(self, expr: object) -> str:
        e = sympy.sympify(expr)
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            self.symbols.add(e)
            return str(e)
        if e not in self.host:
            self.host[e] = f"ks{len(self.host)}"
        return self.host[e]

    def _is_block(self, s: sympy.Symbol) -> bool:
        """A symbol that is a block of values: a loop variable or a gathered index."""
        return _is_loop(s) or s in self.gather_indices

    def _name_of(self, s: sympy.Symbol) -> str:
        if s in self.gather_indices:
            return str(s)
        if _is_loop(s):
            self.used_vars.add(str(s))
            return str(s)
        self.symbols.add(s)
        return str(s)

    def index(self, expr: object) -> str:
        e = self._flatten(sympy.expand(sympy.sympify(expr)))
        self._check_bound(e)
        return triton_index(e, self._name_of, self.size, self._is_block)

    def _flatten(self, e: sympy.Expr) -> sympy.Expr:
        zero = {v: 0 for v, s in zip(row_vars(len(self.rows)), self.rows) if s == 1}
        zero.update({v: 0 for v, s in zip(red_vars(len(self.reduced)), self.reduced) if s == 1})
        e = sympy.expand(e.xreplace(zero)) if zero else e
        e = _flatten_dims(e, row_vars(len(self.rows)), self.rows, XFLAT)
        return _flatten_dims(e, red_vars(len(self.reduced)), self.reduced, RFLAT)

    def _read_directions(self) -> tuple[bool, bool]:
        """Whether most loads step over the reduced dimension with a stride, the kept one contiguous
        (a column reduction), and whether any steps over it with a stride (a transposed operand, or
        a shifted one: ViT's class token and patches): both get wider blocks."""
        if not self.reduction:
            return False, False
        columns = rows = transposed = 0
        kept = [v for v, n in zip(row_vars(len(self.rows)), self.rows) if n != 1][-1:]
        reduced = [v for v, n in zip(red_vars(len(self.reduced)), self.reduced) if n != 1][-1:]
        for member in self.group.members:
            for load in loads(member.node.body):
                if load.indirect:
                    continue
                e = self._flatten(sympy.expand(sympy.sympify(load.index)))
                along_r, along_x = e.coeff(RFLAT, 1), e.coeff(XFLAT, 1)
                if along_r == 1:
                    rows += 1
                elif along_r != 0 and along_x == 1:
                    columns += 1
                raw = sympy.expand(sympy.sympify(load.index))  # the innermost reduced variable's stride
                transposed += bool(kept and reduced) and raw.coeff(reduced[0], 1) not in (0, 1)
        return columns > rows, transposed > 0

    def _check_bound(self, e: sympy.Expr) -> None:
        """int32 indexing is safe only if every index stays below 2**31 for every size."""
        if not self.index_bound_ok:
            return
        top = {XFLAT: self.xnumel - 1, RFLAT: (self.rnumel or 1) - 1}
        top.update({v: s - 1 for v, s in zip(row_vars(len(self.rows)), self.rows)})
        top.update({v: s - 1 for v, s in zip(red_vars(len(self.reduced)), self.reduced)})
        try:
            bound = sympy.sympify(sympy.sympify(e).xreplace(top))
            if not bound.is_Integer or abs(int(bound)) > INT32_LIMIT:
                self.index_bound_ok = False
        except (TypeError, ValueError, ZeroDivisionError):  # e.g. a modulo by a size-1 dim's 0: use int64
            self.index_bound_ok = False

    def _in_place_pairs(self) -> tuple[tuple[str, str], ...]:
        """In-place pairs among the buffers this kernel really writes and reads (a stored member
        can be folded away, e.g. a reduction over no dimension of a 0-dim tensor)."""
        pairs = in_place_pairs(self.group, self.stored, self.dtypes)
        if self.part_axis:  # parts run concurrently: only an input the last part alone reads
            others = {ld.buffer for ms in part_members(self.group)[:-1] for m in ms for ld in node_loads(m.node)}
            pairs = tuple((out, src) for out, src in pairs if src not in others)
        return tuple((out, src) for out, src in pairs if out in self.written and src in self.read)

    # -- values --------------------------------------------------------------------------------
    def tmp(self) -> str:
        self.counter += 1
        return f"tmp{self.counter}"

    def param(self, buffer: str, write: bool) -> str:
        if buffer not in self.params:
            self.params[buffer] = f"{'out' if write else 'in'}_ptr{len(self.params)}"
        target = self.written if write else self.read
        if buffer not in target:
            target.append(buffer)
        return self.params[buffer]

    def _depends_on_r(self, expr: object) -> bool:
        names = {str(s) for s in sympy.sympify(expr).free_symbols}
        return any(n == "rindex" or (n[:1] == "r" and n[1:].isdigit()) for n in names)

    def axes(self, expr: object) -> frozenset[str]:
        """The loop axes ("x", "r") an index varies along once size-1 dims are folded away:
        the shape of the block it gives (a load from a fixed element is a scalar)."""
        flat = self._flatten(sympy.expand(sympy.sympify(expr)))
        axes = frozenset("r" if str(s).startswith("r") else "x" for s in flat.free_symbols if _is_loop(s))
        return axes.union(*(self.gather_indices[s] for s in flat.free_symbols if s in self.gather_indices))

    def level_axes(self, level: str) -> frozenset[str]:
        return frozenset("xr") if self.reduction and level == "inner" else frozenset("x")

    def mask(self, expr: object) -> str | None:
        """The mask of a load: a lane reads out of bounds only along an axis the index varies on."""
        axes = self.axes(expr)
        parts = []
        if self.needs_xmask and "x" in axes:
            parts.append("xmask")
        if self.reduction and self.needs_rmask and "r" in axes:
            parts.append("rmask")
        return " & ".join(parts) or None

    def value(self, body: Body, memo: dict, local: dict[str, str], w: SourceWriter, recompute: dict[str, Member]) -> str:
        if body in memo:
            return memo[body]
        axes: frozenset[str] = frozenset()
        if isinstance(body, Const):
            text = f"tl.full([], {literal(body.value, body.dtype)}, {compute_tl(body.dtype)})"
        elif isinstance(body, IndexValue):
            index = self.index(body.expr)
            axes = self.axes(body.expr)
            text = f"({index}).to({compute_tl(body.dtype)})" if axes else f"tl.full([], {index}, {compute_tl(body.dtype)})"
        elif isinstance(body, Load) and body.indirect:
            index, _ = self._positions(body.index, body.indirect, memo, local, w, recompute, clamp=True)
            axes, mask = self.axes(index), self.mask(index)
            text = self.widen(f"tl.load({self.param(body.buffer, False)} + ({self.index(index)}){', ' + mask if mask else ''})", body.dtype)
        elif isinstance(body, Load):
            if body.buffer in local:
                return local[body.buffer]
            if body.buffer in recompute:  # an inner value of an earlier pass (looped reductions)
                return self.value(recompute[body.buffer].node.body, memo, local, w, recompute)
            ptr = self.param(body.buffer, False)
            axes = self.axes(body.index)
            mask = self.mask(body.index)
            text = self.widen(f"tl.load({ptr} + ({self.index(body.index)}){', ' + mask if mask else ''})", body.dtype)
        else:
            assert isinstance(body, Apply)
            args = [self.value(a, memo, local, w, recompute) for a in body.args]
            if free_cast(body):
                memo[body] = args[0]
                return args[0]
            axes = frozenset().union(*(self.var_axes.get(a, frozenset()) for a in args))
            text = self.render(body.op, args, [a.dtype for a in body.args], body.dtype)
        name = self.tmp()
        w.line(f"{name} = {text}")
        memo[body] = name
        self.var_axes[name] = axes
        return name

    def _positions(self, index: object, indirect: tuple, memo: dict, local: dict[str, str], w: SourceWriter,
                   recompute: dict, clamp: bool) -> tuple[sympy.Expr, list[str]]:
        """`index` with each data-dependent position computed into a block, and the blocks that
        say each is in range. One out of range fails a device assert (checked where Triton checks
        them: debug builds and the interpreter); a gather (`clamp`) then reads position 0, so no
        lane reads outside the buffer, and a scatter masks its store with the in-range blocks."""
        mapping, guards = {}, []
        for ind in indirect:
            value = self.value(ind.value, memo, local, w, recompute)
            axes = self.var_axes.get(value, frozenset())
            name, size = self.tmp(), self.size(ind.size)
            w.line(f"{name} = ({value}).to(tl.int64)")
            if not always_inside(ind.value, ind.size):  # a position its body clamps needs no check
                inside = self.tmp()
                w.line(f"{inside} = (0 <= {name}) & ({name} < {size})")
                live = " & ".join(m for m, a in (("xmask", "x"), ("rmask", "r")) if a in axes
                                  and (self.needs_xmask if a == "x" else self.reduction and self.needs_rmask))
                w.line(f"tl.device_assert({inside}{f' | ~({live})' if live else ''}, 'index out of range')")
                self.checks_positions = True
                if clamp:
                    w.line(f"{name} = tl.where({inside}, {name}, 0)")
                guards.append(inside)
            self.var_axes[name] = axes
            symbol = sympy.Symbol(name, integer=True)
            self.gather_indices[symbol] = axes
            mapping[ind.symbol] = symbol
        return sympy.sympify(index).xreplace(mapping), guards

    def _block(self, var: str, dtype: torch.dtype, level: str) -> str:
        """`var` as a full block of the level's shape (a scalar, or a block along fewer axes,
        is broadcast: reductions and stores need the whole shape)."""
        if self.var_axes.get(var, frozenset()) >= self.level_axes(level):
            return var
        return f"({var} + tl.zeros({self._shape(level)}, {compute_tl(dtype)}))"

    def _shape(self, level: str) -> str:
        if not self.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if level == "inner" else "[XBLOCK, 1]"

    def store(self, member: Member, var: str, w: SourceWriter, memo: dict | None = None,
              local: dict[str, str] | None = None) -> None:
        if member.node.name not in self.stored:
            return
        ptr = self.param(member.node.buffer, True)
        store_index, guards = member.node.store_index, []
        if member.node.store_indirect:  # a scatter: positions read from data, the store masked to those in range
            store_index, guards = self._positions(store_index, member.node.store_indirect, memo or {}, local or {},
                                                  w, {}, clamp=False)
        index = self._flatten(sympy.expand(sympy.sympify(store_index)))
        level = "row" if member.level == "reduction" else member.level
        value_dtype = member.node.dtype if member.node.reduction else member.node.body.dtype
        value = self._block(var, value_dtype, level)
        if member.node.dtype in HALF_DTYPES:
            value = self.to_storage(value, member.node.dtype)
        offset = self.index(store_index)
        if not self.axes(index) >= self.level_axes(level):
            # fewer axes than the block (a 0-dim result, or rows folded to one): every lane
            # gets an offset and only in-bounds lanes (the full mask) store
            offset = f"({offset}) + tl.zeros({self._shape(level)}, {'tl.int64' if not self.index_bound_ok else 'tl.int32'})"
        parts = (["xmask"] if self.needs_xmask else []) + (["rmask"] if level == "inner" and self.needs_rmask else [])
        mask = " & ".join(parts + guards) or None
        w.line(f"tl.store({ptr} + ({offset}), {value}{', ' + mask if mask else ''})")

    # -- emission ------------------------------------------------------------------------------
    @property
    def needs_xmask(self) -> bool:
        return not (self.xnumel.is_Integer and int(self.xnumel) > 0 and int(self.xnumel) % self.config.xblock == 0)

    @property
    def needs_rmask(self) -> bool:
        if not self.reduction:
            return False
        # an empty reduction (sum of no elements) still runs one masked-off block
        return not (self.rnumel.is_Integer and int(self.rnumel) > 0 and int(self.rnumel) % self.config.rblock == 0)

    def generate(self) -> GeneratedKernel:
        body = SourceWriter()
        memo: dict[Body, str] = {}
        local: dict[str, str] = {}
        if self.part_axis:
            # each independent part on its own blocks (grid axis 1), with values of its own
            for number, members in enumerate(part_members(self.group)):
                body.line(f"if part == {number}:")
                branch = SourceWriter(body.depth + 1)
                self.pointwise(members, {}, {}, branch)
                body.lines += branch.lines
        elif not self.reduction:
            self.pointwise([m for _, ms in self.items for m in ms], memo, local, body)
        else:
            items = self.items
            if not self.config.persistent:
                items, self.online, self.deferred = merge_online_softmax(self.items, self.stored)
            for kind, ms in items:
                if kind == "row":
                    m = ms[0]
                    var = self.value(m.node.body, memo, local, body, {})
                    local[m.node.name] = var
                    self.store(m, var, body)
                elif self.config.persistent:
                    self.persistent_segment(ms, memo, local, body)
                else:
                    self.looped_segment(ms, memo, local, body)
        return self._finish(body)

    def pointwise(self, members: list[Member], memo: dict, local: dict[str, str], w: SourceWriter) -> None:
        for m in members:
            var = self.value(m.node.body, memo, local, w, {})
            if m.level == "reduction":
                var = self._reduce_nothing(m, var, w)
            local[m.node.name] = var
            self.store(m, var, w, memo, local)

    @cached_property
    def part_axis(self) -> bool:
        """Whether the group's independent parts run on blocks of their own (grid axis 1): a block
        then streams one part's tensors, as CUDA's multi-tensor apply does, instead of all of them
        one after another (74 small parameters' updates in one block took 176 µs on an H200, the
        optimizer step's whole budget for them; twelve large ones ran at 80% of the bandwidth)."""
        return not self.reduction and len(self.group.parts) <= MAX_PARTS and parts_read_apart(self.group)

    def persistent_segment(self, members: list[Member], memo: dict, local: dict[str, str], w: SourceWriter) -> None:
        for m in members:
            var = self.value(m.node.body, memo, local, w, {})
            if m.level == "inner":
                local[m.node.name] = var
                self.store(m, var, w)
                continue
            result = self.tmp()
            if m.node.reduction in ARG_REDUCTIONS:
                indices = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)"
                w.line(f"{result} = {self._arg_reduce(m, self._reduce_input(m, var, True), indices)}")
                self.var_axes[result] = frozenset("x")
                local[m.node.name] = result
                self.store(m, result, w)
                continue
            w.line(f"{result} = {self._finalize(m, self._combine_across(m, self._reduce_input(m, var, True)))}")
            self.var_axes[result] = frozenset("x")
            local[m.node.name] = result
            self.store(m, result, w)

    def looped_segment(self, members: list[Member], memo: dict, local: dict[str, str], w: SourceWriter) -> None:
        reductions = [m for m in members if m.level == "reduction"]
        here = {m.node.name for m in reductions}
        online = {s: mx for s, mx in self.online.items() if mx in here}  # merged sums of this pass
        online_sum = {mx: s for s, mx in online.items()}
        accs = {}
        best_index: dict[str, str] = {}
        for m in reductions:
            accs[m.node.name] = self.tmp()
            w.line(f"{accs[m.node.name]} = tl.full([XBLOCK, RBLOCK], {self._identity_literal(m)}, {compute_tl(self._acc_dtype(m))})")
            if m.node.reduction in ARG_REDUCTIONS:
                # index 0 with the identity value: it can only win when every element equals the identity
                best_index[m.node.name] = self.tmp()
                w.line(f"{best_index[m.node.name]} = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
        w.line("for roffset in range(0, rnumel, RBLOCK):")
        inner = SourceWriter(w.depth + 1)
        inner.line("rindex = roffset + rbase")
        if self.needs_rmask:
            inner.line("rmask = rindex < rnumel")
        loop_body = SourceWriter(w.depth + 1)
        inner_memo, inner_local = dict(memo), dict(local)
        recompute = {n: m for n, m in self.members.items() if m.level == "inner" and n not in inner_local}
        for m in members:
            if m.node.name in self.deferred or m.node.name in online:
                continue  # computed by the online update of its maximum
            var = self.value(m.node.body, inner_memo, inner_local, loop_body, recompute)
            if m.level == "inner":
                inner_local[m.node.name] = var
                recompute.pop(m.node.name, None)
                self.store(m, var, loop_body)
                continue
            acc = accs[m.node.name]
            update = self._reduce_input(m, var, True)
            kind = m.node.reduction
            if kind in ARG_REDUCTIONS:
                better = f"{update} {'>' if kind == 'argmax' else '<'} {acc}"
                if self._acc_dtype(m).is_floating_point:
                    better = f"({better}) | (({update} != {update}) & ({acc} == {acc}))"
                take = self.tmp()
                loop_body.line(f"{take} = {better}")
                loop_body.line(f"{best_index[m.node.name]} = tl.where({take}, rindex.to(tl.int64), {best_index[m.node.name]})")
                loop_body.line(f"{acc} = tl.where({take}, {update}, {acc})")
            elif kind == "sum":
                loop_body.line(f"{acc} = {acc} + {update}")
            elif kind == "prod":
                loop_body.line(f"{acc} = {acc} * {update}")
            elif m.node.name in online_sum:
                self._online_update(acc, accs[online_sum[m.node.name]], update, loop_body)
            else:
                loop_body.line(f"{acc} = {self._elementwise_extreme(m, acc, update)}")
        self._decompose(inner, "r")
        w.lines += inner.lines + loop_body.lines
        self.used_vars = {v for v in self.used_vars if not v.startswith("r")}
        for m in reductions:
            if m.node.name in online:
                continue  # finished with its maximum
            result = self.tmp()
            if m.node.name in online_sum:
                total = self.tmp()
                partner = self.members[online_sum[m.node.name]]
                self._online_finish(accs[m.node.name], accs[partner.node.name], result, total, w)
                for member, reduced in ((m, result), (partner, total)):
                    final = self._finalize(member, reduced)
                    if final != reduced:
                        w.line(f"{(name := self.tmp())} = {final}")
                        final = name
                    self.var_axes[final] = frozenset("x")
                    local[member.node.name] = final
                    self.store(member, final, w)
                continue
            if m.node.reduction in ARG_REDUCTIONS:
                w.line(f"{result} = {self._arg_reduce(m, accs[m.node.name], best_index[m.node.name])}")
            else:
                w.line(f"{result} = {self._finalize(m, self._combine_across(m, accs[m.node.name]))}")
            self.var_axes[result] = frozenset("x")
            local[m.node.name] = result
            self.store(m, result, w)

    def _decompose(self, w: SourceWriter, prefix: str) -> None:
        """Per-dimension loop variables from the flat index, for those the body used."""
        sizes = self.rows if prefix == "x" else self.reduced
        flat = "xindex" if prefix == "x" else "rindex"
        for d in range(len(sizes)):
            var = f"{prefix}{d}"
            if var not in self.used_vars:
                continue
            if sizes[d] == 1:
                w.line(f"{var} = 0")
                continue
            inner = sympy.Mul(*sizes[d + 1:])
            text = flat if inner == 1 else f"({flat} // {self.size(inner)})"
            if d > 0:
                text = f"({text} % {self.size(sizes[d])})"
            w.line(f"{var} = {text}")

    def _finish(self, body: SourceWriter) -> GeneratedKernel:
        cfg = self.config
        wide = not self.index_bound_ok
        head = SourceWriter()
        pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        head.line(f"xoffset = {pid} * XBLOCK")
        if self.reduction:
            head.line("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
            if self.needs_xmask:
                head.line(f"xmask = xindex < {self.size(self.xnumel)}")
            if cfg.persistent:
                head.line("rindex = tl.arange(0, RBLOCK)[None, :]")
                if self.needs_rmask:
                    head.line(f"rmask = rindex < {self.size(self.rnumel)}")
            else:
                head.line(f"rnumel = {self.size(self.rnumel)}")
                head.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        else:
            head.line("xindex = xoffset + tl.arange(0, XBLOCK)")
            if self.needs_xmask:
                head.line(f"xmask = xindex < {self.size(self.xnumel)}")
            if self.part_axis:
                head.line("part = tl.program_id(1)")
        self._decompose(head, "x")
        if cfg.persistent:
            self._decompose(head, "r")

        tensors = list(dict.fromkeys(self.read + self.written))
        symbols = sorted(self.symbols, key=str)
        host = list(self.host)
        scalars = [str(s) for s in symbols] + [self.host[e] for e in host]
        constexprs = [("XBLOCK", cfg.xblock)] + ([("RBLOCK", cfg.rblock)] if self.reduction else [])
        params = [self.params[t] for t in tensors] + scalars + [f"{k}: tl.constexpr" for k, _ in constexprs]
        lines = ["import triton", "import triton.language as tl"]
        if self.libdevice:
            lines.append("from triton.language.extra import libdevice")
        lines.append("")
        lines += self.helper_sources()
        # a kernel that checks positions read from data keeps its device asserts (debug), as Inductor's do
        decorator = "@triton.jit(debug=True)" if self.checks_positions else "@triton.jit"
        lines += ["", "", decorator, f"def {self.name}({', '.join(params)}):"]
        source = "\n".join(lines + head.lines + body.lines) + "\n"
        grid = (CeilDiv(self.xnumel, cfg.xblock) if not self.xnumel.is_Integer else sympy.Integer(-(-int(self.xnumel) // cfg.xblock)),)
        if self.part_axis:
            grid += (sympy.Integer(len(self.group.parts)),)
        origins = ",".join(dict.fromkeys(m.node.origin for m in self.group.members if m.node.origin))
        metadata = (
            ("ops", origins),
            ("arg_names", tuple([self.params[t] for t in tensors] + scalars)),
            ("arg_types", tuple([f"ptr:{str(self.dtypes[t]).removeprefix('torch.')}" for t in tensors]
                                + ["int64" if wide else "int32"] * len(scalars))),
            ("constexprs", tuple(constexprs)),
            ("num_warps", cfg.num_warps),
            ("index_dtype", "int64" if wide else "int32"),
            ("unaligned", tuple(self.params[t] for t in tensors if t not in self.aligned)),
        )
        return GeneratedKernel(self.name, source, tuple(tensors), tuple(symbols) + tuple(host), tuple(host),
                               tuple(self.written), metadata, grid, self._in_place_pairs())


@lru_cache(maxsize=65536)  # pure, and its sympy.simplify is slow: identical layers repeat each index
def _flatten_dims(e: sympy.Expr, variables: tuple, sizes: tuple, flat: sympy.Symbol) -> sympy.Expr:
    """Rewrite the contiguous part of a linear index, Σ c·x_d with c_d = c_last·Π sizes after d,
    as c_last·flat (every dimension) or c_last·(flat % Π suffix sizes) (a trailing suffix)."""
    dims = [d for d, s in enumerate(sizes) if s != 1]
    if not dims:
        return e
    coeffs: dict[int, sympy.Expr] = {}
    rest = sympy.Integer(0)
    position = {v: d for d, v in enumerate(variables)}
    for term in sympy.Add.make_args(e):
        used = [s for s in term.free_symbols if s in position]
        if not used:
            rest += term
            continue
        if len(used) != 1:
            return e
        c = term / used[0]
        if not all(f.is_Rational or f.is_Symbol for f in sympy.Mul.make_args(c)):  # a monomial is simplest already
            c = sympy.simplify(c)
        if c.free_symbols & set(variables) or any(_is_loop(s) for s in c.free_symbols):
            return e
        coeffs[position[used[0]]] = coeffs.get(position[used[0]], sympy.Integer(0)) + c
    last = dims[-1]
    if last not in coeffs:
        return e
    scale = coeffs[last]
    start = len(dims)
    running = sympy.Integer(1)
    for d in reversed(dims):
        if sympy.expand(coeffs.get(d, sympy.Integer(0)) - scale * running) != 0:
            break
        start -= 1
        running = running * sizes[d]
    if start == len(dims):
        return e
    suffix = dims[start:]
    suffix_size = sympy.Mul(*tuple(sizes[d] for d in suffix))
    whole = start == 0 and all(sizes[d] == 1 for d in range(dims[0]))
    flat_part = flat if whole else sympy.Mod(flat, suffix_size, evaluate=False)
    kept = sum((coeffs[d] * variables[d] for d in dims[:start] if d in coeffs), sympy.Integer(0))
    return scale * flat_part + kept + rest


def generate_triton(group: FusionGroup, name: str, needed: set[str], dtypes: dict[str, torch.dtype],
                    hints: dict | None = None, aligned: set[str] | None = None, device_type: str = "cuda") -> GeneratedKernel:
    return TritonKernelCodegen(group, name, needed, dtypes, hints, aligned, device_type).generate()


__all__ = ["LaunchConfig", "TritonKernelCodegen", "choose_config", "generate_triton", "loads"]
