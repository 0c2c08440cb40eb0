"""Graph lowering with generated kernels: ops with a loop lowering become fused kernels.

`KernelGraphLowering` walks the graph like `GraphLowering`. An op with a loop lowering
(`loop_ops`) becomes a `LoopValue`, inlined into its consumers; it is materialized (a
`ComputeNode` writing an allocated buffer) only when something other than a loop lowering
reads it, and reductions always are. Each materialization leaves a placeholder line; when
the walk ends the scheduler groups the compute nodes, the kernel code generator writes one
kernel per group, and the placeholders become `KernelDefinition` / `KernelCall` lines.
Everything else stays a library call, exactly as in `GraphLowering`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch
import torch.fx

from wrapgen.kernels.triton.runtime import prefetch
from wrapgen.loop_ir import (
    HALF_DTYPES,
    Apply,
    ComputeNode,
    Const,
    IndexValue,
    Load,
    LoopValue,
    compute_dtype,
    node_loads,
    red_vars,
    row_vars,
    size,
    walk,
)
from wrapgen.lowering.gemm_templates import apply_gemm_templates
from wrapgen.lowering.graph_lowering import Buffer, GraphLowering
from wrapgen.lowering.loop_ops import LOWERINGS, VIEW_OPS, op_key, supported
from wrapgen.lowering.loop_ops.index_put import CPP_ONLY
from wrapgen.lowering.loop_ops.recompute import full_size_reads, numel
from wrapgen.lowering.loop_order import reduction_order, reorder
from wrapgen.lowering.multi_kernel import with_reduction_variants
from wrapgen.lowering.mutation import MutationTracker, StateOrder, is_copy, writes_in_place, written_back
from wrapgen.lowering.one_hot_sums import fold_one_hot_sum
from wrapgen.lowering.scatter_store import is_scatter_in_place, store_scatter
from wrapgen.lowering.scheduler import FusionGroup, cluster_members, schedule
from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
    BindSymbol,
    KernelCall,
    KernelDefinition,
    Reinterpret,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.values import TensorRef, TensorType

# A C++ kernel takes in nodes that share no buffer with it only up to this many streams
# (buffers read or written): see scheduler.schedule.
CPU_UNRELATED_STREAMS = 12
# A pointwise value read by several consumers is computed once into a buffer when its
# expression is larger than this (else it is recomputed in each consumer).
INLINE_LIMIT = 48
# ... or when it reads more buffers than this: each inlined copy keeps every buffer it reads
# alive until its last consumer runs (a transformer's residual stream, inlined into every
# later LayerNorm, would keep every layer's projection outputs to the end).
READS_LIMIT = 3


@dataclass(frozen=True)
class PendingCompute(WrapperLine):
    """Placeholder for a compute node until the scheduler has placed its kernel; never emitted."""

    name: str
    reads: tuple[str, ...]

    def uses(self) -> tuple[str, ...]:
        return self.reads

    def format(self) -> str:
        return f"pending {self.name}({', '.join(self.reads)})"


def contiguous_strides(sizes: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    strides, running = [], sympy.Integer(1)
    for s in reversed(sizes):
        strides.append(running)
        running = running * s
    return tuple(reversed(strides))


def _linear(index: tuple, strides: tuple) -> sympy.Expr:
    return sympy.expand(sum((i * s for i, s in zip(index, strides)), sympy.Integer(0)))


class KernelGraphLowering(GraphLowering):
    """GraphLowering that generates fused kernels for what `loop_ops` can lower."""

    def __init__(self, captured, name: str = "forward", language: str | None = None) -> None:
        super().__init__(captured, name)
        self.device = kernel_device(captured.graph_module.graph)
        self.language = language or kernel_language(self.device)
        self.loop_nodes: set[torch.fx.Node] = set()
        self.static_checks: set[torch.fx.Node] = set()  # metadata asserts that hold at compile time
        self.compute: dict[str, ComputeNode] = {}
        self.stride_symbols: dict[tuple[str, int], sympy.Symbol] = {}
        self.call_symbols: dict[sympy.Expr, sympy.Symbol] = {}
        self.mutations = MutationTracker(self)
        self.in_place: dict[torch.fx.Node, torch.fx.Node] = {}  # new values of state -> the state (_plan)

    # -- planning ------------------------------------------------------------------------
    def lower(self):
        self._plan(self.captured.graph_module.graph)
        return super().lower()

    def _plan(self, graph: torch.fx.Graph) -> None:
        nodes = [n for n in graph.nodes if n.op == "call_function"]
        if self.language is None:
            return  # no kernel language for this device: library calls only
        loop = set()
        self.static_checks = {n for n in nodes if holds_statically(n)}
        for n in nodes:
            if n in self.static_checks:
                loop.add(n)  # it reads no data: not a reason to materialize what it checks
            elif n.target is operator.getitem:
                if n.args[0] in loop:
                    loop.add(n)
            elif supported(n, self.device.type) and not self._excluded(n) or is_copy(n) or is_scatter_in_place(n):
                loop.add(n)  # a copy_ or scatter stores its (fused) source in place where it can (mutation.py)
        for n in reversed(nodes):  # a view is an index remap only if only loop code reads it
            if n in loop and op_key(n) in VIEW_OPS and any(u not in loop for u in n.users):
                loop.discard(n)
        self.loop_nodes = loop
        self.in_place = written_back(graph, self.captured.mutations)
        self.mutations.active = writes_in_place(graph, self.captured.mutations)

    def _excluded(self, node: torch.fx.Node) -> bool:
        """Ops the kernel language cannot express on this device (they stay library calls)."""
        if self.language != "cpp" and op_key(node) in CPP_ONLY:
            return True  # a generated C++ kernel, not a loop body (index_put.py)
        if self.language == "triton" and self.device.type == "cpu":
            from wrapgen.kernels.triton.ops import INTERPRETER_UNSUPPORTED

            if not isinstance(node.target, torch._ops.OpOverload):
                return False
            if op_key(node) in ("aten::linalg_vector_norm.default", "aten::dist.default"):
                from wrapgen.lowering.loop_ops import BASIC_NORM_ORDERS, norm_order

                return norm_order(node) not in BASIC_NORM_ORDERS  # other orders need pow
            if node.target._schema.name not in INTERPRETER_UNSUPPORTED:
                return False
            squares = node.target._schema.name == "aten::pow" and len(node.args) > 1 and node.args[1] in (2, 0.5)
            return not squares  # x**2 and x**0.5 lower to a multiply and a sqrt
        return False

    # -- the walk ------------------------------------------------------------------------
    def _lower_call(self, node: torch.fx.Node) -> object:
        written = self.mutations.written_roots(node)
        if written:  # deferred reads of what this node overwrites are computed first
            self.mutations.before_write(written, node, node.args[1] if is_copy(node) else None)
        value = self._lower_node(node)
        self.mutations.record(node, value)
        return value

    def _lower_copy(self, node: torch.fx.Node) -> object:
        target = node.args[0]
        if isinstance(self.values.get(target), LoopValue):  # a computed value updated in place: in memory first
            self.values[target] = self.realize(self.values[target], target.meta["val"], op_key(target) or "getitem")
            self.mutations.record(target, self.values[target])
        destination, source = (self.values.get(a) if isinstance(a, torch.fx.Node) else a for a in node.args[:2])
        if isinstance(destination, Buffer) and self.mutations.copy_into(destination, source, "copy_"):
            return destination
        if isinstance(source, LoopValue):  # the library call reads it from memory
            self.values[node.args[1]] = self.realize(source, node.args[1].meta["val"], "copy_source")
        return super()._lower_call(node)

    def _lower_scatter(self, node: torch.fx.Node) -> object:
        stored = store_scatter(self, node)
        if stored is not None:
            return stored
        for argument in node.all_input_nodes:  # the library call reads its operands from memory
            if isinstance(self.values.get(argument), LoopValue):
                self.values[argument] = self.realize(self.values[argument], argument.meta["val"], "scatter_source")
                self.mutations.record(argument, self.values[argument])
        return super()._lower_call(node)

    def _write_back(self, placeholder: str, value: object) -> None:
        """A functionalized mutation's new value stored into its input by the kernel computing it."""
        destination = self._placeholder_buffer(placeholder)
        output = next(n for n in self.captured.graph_module.graph.nodes if n.op == "output")
        keep = value if isinstance(value, torch.fx.Node) else None
        self.mutations.before_write({destination.root}, output, keep)
        source = self.values.get(value) if keep is not None else value
        if self.mutations.copy_into(destination, source, "write_back"):
            return
        if isinstance(source, LoopValue):
            self.values[keep] = self.realize(source, keep.meta["val"], "write_back")
        super()._write_back(placeholder, value)

    def _lower_node(self, node: torch.fx.Node) -> object:
        if is_copy(node):
            return self._lower_copy(node)
        if is_scatter_in_place(node):
            return self._lower_scatter(node)
        if node not in self.loop_nodes:
            return super()._lower_call(node)
        if node in self.static_checks:
            return None
        if node.target is operator.getitem:
            value = self.values[node.args[0]][node.args[1]]
        else:
            value = LOWERINGS[op_key(node)](self, node)
        if isinstance(value, (tuple, Buffer)):
            return value  # several results, or a buffer a kernel of its own writes (index_put.py)
        external = any(u not in self.loop_nodes for u in node.users)
        several = op_key(node) not in VIEW_OPS and self._consumers(node) > 1
        reads = full_size_reads(value)
        shared = several and (size(value.body) > INLINE_LIMIT or len(reads) > READS_LIMIT)
        if external or shared:
            if node in self.in_place:  # a new value of state: computed into the state itself
                stored = self.mutations.realize_in_place(node, value, self.in_place[node])
                if stored is not None:
                    return stored
            return self.realize(value, node.meta["val"], op_key(node) or "getitem")
        return value

    def _consumers(self, node: torch.fx.Node) -> int:
        """The nodes that read `node`'s value, counted through its views: OPT's residual add is
        read only by a reshape, which both the next LayerNorm and the next residual add read.
        Counted as one reader, the add was inlined into both, each later layer's LayerNorm
        recomputed the whole residual stream from every earlier layer's outputs, and OPT's last
        LayerNorms took 140 us each on an H200 (a few, computed once)."""
        count = 0
        for user in node.users:
            viewed = user in self.loop_nodes and op_key(user) in VIEW_OPS
            count += self._consumers(user) if viewed else 1
        return count

    # -- LoopContext ---------------------------------------------------------------------
    def shape(self, values: object) -> tuple[sympy.Expr, ...]:
        return self.symbols.shape(values)

    def value(self, arg: object) -> LoopValue:
        lowered = self.values[arg] if isinstance(arg, torch.fx.Node) else arg
        if isinstance(lowered, LoopValue):
            return lowered
        if isinstance(lowered, Buffer):
            return self.load(lowered)
        if isinstance(lowered, sympy.Basic):
            return LoopValue((), IndexValue(lowered, torch.int64), torch.int64)
        if isinstance(lowered, (bool, int, float)):
            dtype = torch.bool if isinstance(lowered, bool) else torch.int64 if isinstance(lowered, int) else torch.float64
            return LoopValue((), Const(lowered, dtype), dtype)
        raise TypeError(f"cannot read {arg!r} in a loop body")

    def computed_once(self, arg: torch.fx.Node) -> LoopValue:
        """`arg`'s value, from memory if it computes anything: for consumers that read each
        element many times (a matrix product), where inlining would repeat the work per read."""
        value = self.value(arg)
        if isinstance(self.values[arg], LoopValue) and any(isinstance(n, Apply) for n in walk(value.body)):
            if self._realize_viewed(arg):
                return self.value(arg)
            buffer = self.realize(value, arg.meta["val"], op_key(arg) or "getitem")
            self.values[arg] = buffer
            return self.load(buffer)
        return value

    def _realize_viewed(self, arg: torch.fx.Node) -> bool:
        """When `arg` is a view (unsqueeze, expand, permute, ...) of a computed value no larger
        than it, compute that value into a buffer and lower the views again as reads of it, so
        that every other view of it reads the buffer too. A Llama-style model's rotary tables
        are one value that each layer unsqueezes: realizing each layer's view computed them
        once per layer (8 kernels of 2.6 us on the H100 at batch 1 x 32 tokens), not once."""
        chain: list[torch.fx.Node] = []
        base = arg
        while (base in self.loop_nodes and op_key(base) in VIEW_OPS and base.args
               and isinstance(base.args[0], torch.fx.Node) and base.args[0] in self.loop_nodes):
            chain.insert(0, base)
            base = base.args[0]
        viewed = self.values.get(base)
        if not chain or not isinstance(viewed, LoopValue) or not isinstance(self.values[arg], LoopValue):
            return False
        ratio = numel(self.values[arg].sizes) / numel(viewed.sizes)
        if not (ratio.is_Rational and ratio >= 1):  # a slice of a larger value: compute only the view
            return False
        self.values[base] = self.realize(viewed, base.meta["val"], op_key(base) or "getitem")
        for node in chain:
            self.values[node] = LOWERINGS[op_key(node)](self, node)
        return True

    def in_memory(self, arg: torch.fx.Node) -> LoopValue:
        """`arg`'s value as a plain load of a buffer (realized if it is computed or a constant):
        for a gather, which reads it at a data-dependent index."""
        value = self.value(arg)
        if not isinstance(value.body, Load) or value.body.indirect:
            buffer = self.realize(value, arg.meta["val"], op_key(arg) or "getitem")
            self.values[arg] = buffer
            return self.load(buffer)
        return value

    def load(self, buffer: Buffer) -> LoopValue:
        sizes = buffer.type.sizes
        strides = []
        for d, s in enumerate(sizes):
            if sympy.sympify(s) == 1:
                strides.append(sympy.Integer(0))
            elif buffer.fixed_layout:
                strides.append(buffer.type.strides[d])
            else:
                strides.append(self._stride_symbol(buffer.name, d))
        index = _linear(row_vars(len(sizes)), tuple(strides))
        return LoopValue(sizes, Load(buffer.name, index, buffer.type.dtype), buffer.type.dtype)

    def _stride_symbol(self, name: str, dim: int) -> sympy.Symbol:
        """A library call chose this buffer's layout: read its stride at run time."""
        key = (name, dim)
        if key not in self.stride_symbols:
            symbol = sympy.Symbol(self._fresh_symbol_name("st"), integer=True)
            self.stride_symbols[key] = symbol
            self.lines.append(BindSymbol(symbol, name, "stride", dim, OBSERVED))
        return self.stride_symbols[key]

    def _fresh_symbol_name(self, prefix: str) -> str:
        name = self.fresh(prefix)
        return name

    def realize(self, value: LoopValue, fake: torch.Tensor, origin: str) -> Buffer:
        """Compute `value` into a buffer with the layout torch gives the op's result."""
        type_ = self.tensor_type(fake)
        if not self._dense(type_):
            type_ = TensorType(type_.dtype, type_.device, type_.sizes, contiguous_strides(type_.sizes))
        return self._realize_as(value, type_, origin)

    def realize_dense(self, value: LoopValue, origin: str) -> Buffer:
        """Compute `value` into a new contiguous buffer (a value no fx node holds alone)."""
        return self._realize_as(value, TensorType(value.dtype, self.device, value.sizes, contiguous_strides(value.sizes)), origin)

    def _realize_as(self, value: LoopValue, type_: TensorType, origin: str) -> Buffer:
        name = self.fresh()
        self.lines.append(Allocate(name, type_))
        # a permuted layout (channels-last) is walked in memory order: see loop_order.py
        hints = {info.symbol: info.hint for info in self.symbols.infos()}
        rows, body, store = reorder(type_.sizes, type_.strides, value.body, hints)
        self._add_compute(ComputeNode(name, value.dtype, rows, body, store, origin=origin))
        return Buffer(name, type_, name, sympy.Integer(0), True)

    def reduce(self, value: LoopValue, dims: tuple[int, ...], keepdim: bool, kind: str, dtype: torch.dtype, origin: str) -> LoopValue:
        """`value` reduced over `dims` into a `dtype` result. The result of a half `dtype` is
        kept in float32 (its own buffer too) and rounded only where the op's output is stored."""
        if (folded := fold_one_hot_sum(value, dims, keepdim, kind, dtype)) is not None:
            return folded  # one nonzero term per row: no reduction (one_hot_sums.py)
        sizes = value.sizes
        kept = [d for d in range(len(sizes)) if d not in dims]
        rows = tuple(sizes[d] for d in kept)
        reduced = tuple(sizes[d] for d in dims)
        # rows walked in the order of the input's memory (loop_order.py), the buffer laid out so
        order = reduction_order(value.body, sizes, kept, {i.symbol: i.hint for i in self.symbols.infos()})
        loop_rows = tuple(rows[k] for k in order)
        var_of = {kept[k]: x for k, x in zip(order, row_vars(len(rows)))}
        rs = iter(red_vars(len(reduced)))
        index = tuple(next(rs) if d in dims else var_of[d] for d in range(len(sizes)))
        name = self.fresh()
        loop_strides = contiguous_strides(loop_rows)
        strides = tuple(loop_strides[order.index(k)] for k in range(len(rows)))
        stored = compute_dtype(dtype)
        self.lines.append(Allocate(name, TensorType(stored, self.device, rows, strides)))
        store = _linear(row_vars(len(rows)), loop_strides)
        # arg reductions keep the best value so far (in its compute dtype) beside its index
        acc = compute_dtype(value.body.dtype) if kind in ("argmax", "argmin") else accumulator_dtype(kind, dtype, origin)
        node = ComputeNode(name, stored, loop_rows, value.at(index), store, kind, reduced, sizes, index, acc, origin)
        self._add_compute(node)
        out_sizes = tuple(sympy.Integer(1) if d in dims else s for d, s in enumerate(sizes)) if keepdim else rows
        out_vars = row_vars(len(out_sizes))
        kept_vars = [out_vars[d] for d in kept] if keepdim else list(out_vars)
        return LoopValue(out_sizes, Load(name, _linear(tuple(kept_vars), strides), stored), dtype)

    def _add_compute(self, node: ComputeNode) -> None:
        self.compute[node.name] = node
        reads = tuple(dict.fromkeys(ld.buffer for ld in node_loads(node)))
        self.lines.append(PendingCompute(node.name, reads))

    # -- kernels -------------------------------------------------------------------------
    def finish_body(self, lines: list[WrapperLine]) -> list[WrapperLine]:
        lines = apply_gemm_templates(self, lines, PendingCompute)  # GEMM templates first (max_autotune, misaligned)
        if not self.compute:
            return lines
        from wrapgen.kernels import kernel_codegen

        position = {line.name: i for i, line in enumerate(lines) if isinstance(line, PendingCompute)}
        readers = _readers(lines, set(self.compute))
        order = sorted(self.compute.values(), key=lambda n: position[n.name])
        state = StateOrder(lines, self.compute, self.mutations, PendingCompute) if self.mutations.mutated else None
        cpu = self.language != "triton"
        groups = schedule(order, position, readers, unrelated_reductions=cpu,
                          blocked=state.blocked if state is not None else None,
                          unrelated_streams=CPU_UNRELATED_STREAMS if cpu else None)
        groups = [cluster_members(g, self.mutations.root) for g in groups]
        needed = {name for name, where in readers.items() if name in self.compute and _read_outside(name, where, lines, groups)}
        codegen = kernel_codegen(self.language)
        hints = {info.symbol: info.hint for info in self.symbols.infos()}
        aligned = {line.name for line in lines if isinstance(line, Allocate)}  # fresh allocations start aligned
        at_position: dict[int, list[WrapperLine]] = {}
        definitions: list[WrapperLine] = []
        shared: dict[tuple, str] = {}
        written_at: dict[str, int] = {}  # result buffer -> the line position its kernel's call takes
        allocations = {line.name: line for line in lines if isinstance(line, Allocate) and line.name in self.compute}
        dtypes = self._buffer_dtypes()  # the loop below adds no buffers: one scan of the lines, not one per kernel
        for number, group in enumerate(groups):
            kernel = codegen(group, f"{self.language}_fused_{_describe(group)}_{number}", needed, dtypes,
                             hints, aligned, self.device.type)
            if not kernel.written:
                continue  # nothing it computes is read (its reader was folded away): no launch
            calls: list[WrapperLine] = []
            for expr in kernel.host_exprs:
                if expr not in self.call_symbols:
                    self.call_symbols[expr] = sympy.Symbol(self.fresh("ks"), integer=True)
            args = tuple(TensorRef(t) for t in kernel.tensors) + tuple(self.call_symbols.get(e, e) for e in kernel.scalars)
            metadata = (("device", str(self.device)), *((k, v) for k, v in kernel.metadata if k != "device"))
            # Groups that generate the same code (a chain of identical layers) share one kernel.
            same_code = (kernel.source.replace(kernel.name, "KERNEL"), metadata)
            name = shared.setdefault(same_code, kernel.name)
            if name == kernel.name:
                definitions.append(KernelDefinition(kernel.name, self.language, kernel.source, metadata))
                if self.language == "triton":
                    prefetch(kernel.name, kernel.source, metadata)  # compiles while the rest is lowered
            # Outputs are allocated right before the call (memory planning may then write in place).
            calls += [allocations[w] for w in kernel.written if w in allocations]
            call = KernelCall(name, args, kernel.grid, tuple(kernel.written), kernel.may_alias)
            # config.multi_kernel: a reduction over a symbolic row length also gets persistent variants
            calls.append(with_reduction_variants(self, group, call, definitions, needed, dtypes, hints, aligned))
            last = max(position[m.node.name] for m in group.members)
            at_position[last] = calls
            written_at.update((w, last) for w in kernel.written if w in allocations)
        out: list[WrapperLine] = definitions
        later_views: dict[str, list[WrapperLine]] = {}  # views of a result whose kernel now runs later
        for i, line in enumerate(lines):
            if isinstance(line, PendingCompute):
                out.extend(at_position.get(i, ()))
                for root in [r for r in later_views if written_at[r] == i]:
                    out.extend(later_views.pop(root))
            elif isinstance(line, Allocate) and line.name in self.compute:
                continue  # placed before its kernel's call (or not needed at all)
            elif isinstance(line, Reinterpret) and written_at.get(line.source, -1) > i:
                later_views.setdefault(line.source, []).append(line)
            else:
                out.append(line)
        return define_before_first_use(out, [SymbolicCallArg(sym, expr) for expr, sym in self.call_symbols.items()])

    def _dense(self, type_: TensorType) -> bool:
        """Non-overlapping and dense, judged at the symbols' hints (a permuted contiguous layout)."""
        hints = {info.symbol: info.hint for info in self.symbols.infos()}
        dims = [(int(sympy.sympify(st).xreplace(hints)), int(sympy.sympify(sz).xreplace(hints)), st, sz)
                for st, sz in zip(type_.strides or (), type_.sizes) if sympy.sympify(sz) != 1]
        expected = sympy.Integer(1)
        for _, _, stride, size_ in sorted(dims, key=lambda d: (d[0], d[1])):
            if sympy.expand(stride - expected) != 0:
                return False
            expected = expected * size_
        return True

    def _buffer_dtypes(self) -> dict[str, torch.dtype]:
        return {name: t.dtype for name, t in self._known_types().items()}

    def _known_types(self) -> dict[str, TensorType]:
        types: dict[str, TensorType] = {}
        for value in self.values.values():
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, Buffer):
                    types[v.name] = v.type
        for line in self.lines:
            for name, t in line.defined_types().items():
                if isinstance(t, TensorType):
                    types[name] = t
        return types


def _readers(lines: list[WrapperLine], computed: set[str]) -> dict[str, list[int]]:
    """The positions of the lines that read each buffer. A view of a computed result reads
    nothing: the lines that read the view read the result, and the view itself moves after the
    result's kernel when fusion places that kernel later (`finish_body`). Counted as a read, a
    view blocked fusion: a Llama-style layer's key and value head copies for grouped-query
    attention, of one shape, ran as two kernels because the key's view came between them."""
    view_of = {line.name: line.source for line in lines if isinstance(line, Reinterpret) and line.source in computed}
    view_at: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        if isinstance(line, Reinterpret) and line.name in view_of:
            view_at[line.name] = i
            continue
        for used in line.uses():
            if used not in view_of:
                readers.setdefault(used, []).append(i)
            else:  # a kernel that loads the view may not join the result's kernel: read where the view is
                readers.setdefault(view_of[used], []).append(view_at[used] if isinstance(line, PendingCompute) else i)
    return readers


def _read_outside(name: str, where: list[int], lines: list[WrapperLine], groups: list[FusionGroup]) -> bool:
    """Whether anything but a member of `name`'s own group reads buffer `name`."""
    group = next(g for g in groups if name in g.names())
    for i in where:
        line = lines[i]
        if not isinstance(line, PendingCompute) or line.name not in group.names():
            return True
    return False


def define_before_first_use(lines: list[WrapperLine], definitions: list[SymbolicCallArg]) -> list[WrapperLine]:
    """`lines` with each definition inserted right before the first line that uses its symbol.

    Kernels share one host symbol per size expression, but a kernel's call goes where its
    group's last member was, not in the order the groups were generated: the kernel that
    first named an expression can run after another that takes it. So definitions are
    placed from where the symbols are used, in the final line order, for every kernel alike.
    """
    pending = {d.symbol: d for d in definitions}
    out: list[WrapperLine] = []
    for line in lines:
        used = line.symbols_used() & pending.keys() if pending else ()
        out.extend(pending.pop(d.symbol) for d in definitions if d.symbol in used)
        out.append(line)
    return out


def _describe(group: FusionGroup) -> str:
    names = []
    for m in group.members:
        for part in m.node.origin.replace("aten::", "").split(".")[:1]:
            if part and part not in names:
                names.append(part)
    return "_".join(names[:4]) or "kernel"




def holds_statically(node: torch.fx.Node) -> bool:
    """An `_assert_tensor_metadata` (torch.export puts one before each `.to()`) whose checks the
    traced metadata already proves: the program fixes its buffers' dtypes, devices and layouts
    and asserts its inputs', so the check needs no call, and a cast inside a fusion (`x.float()
    ... .to(torch.bfloat16)`) no longer materializes the value it checks."""
    if node.target is not torch.ops.aten._assert_tensor_metadata.default:
        return False
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(source, torch.Tensor):
        return False
    names = ("a", "size", "stride", "dtype")
    given = {**dict(zip(names, node.args)), **node.kwargs}
    expected = {"size": None, "stride": None, "dtype": source.dtype, "device": source.device, "layout": source.layout}
    return all(given.get(k) is None or given[k] == v for k, v in expected.items()) and given.get("size") is None \
        and given.get("stride") is None


def kernel_device(graph: torch.fx.Graph) -> torch.device:
    """The device generated kernels run on: the one most of the graph's tensors are on (the
    first of them on a tie). A CUDA graph holds CPU tensors too (constants the traced code made
    from Python data, lifted by torch.export ahead of the inputs): its first tensor may be one."""
    counts: dict[torch.device, int] = {}
    for node in graph.nodes:
        fake = node.meta.get("val")
        first = fake[0] if isinstance(fake, (list, tuple)) and fake else fake
        if isinstance(first, torch.Tensor):
            counts[first.device] = counts.get(first.device, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else torch.device("cpu")


def kernel_language(device: torch.device) -> str | None:
    """Triton on GPUs; C++ on the CPU unless `config.cpu_kernels` asks for Triton (interpreted)."""
    from wrapgen import config

    if device.type == "cpu":
        if config.cpu_kernels == "triton":
            from wrapgen.kernels.triton import compat

            if not (compat.available() and compat.interpreting()):
                raise ValueError("config.cpu_kernels='triton' needs triton installed and TRITON_INTERPRET=1: "
                                 "Triton runs kernels on CPU tensors only in its interpreter")
        return config.cpu_kernels
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return None
        return "triton"
    return None


def accumulator_dtype(kind: str, dtype: torch.dtype, origin: str = "") -> torch.dtype:
    """Sums and products of float32/64 accumulate in double (matches eager to float tolerance),
    of half dtypes in float32 (as eager and Inductor do: far below a half result's rounding);
    integer sums in int64; max/min/any/all in the value's own (compute) type. A small matrix
    product's dot products (origin "mm", at most 256 terms) accumulate in float32, as BLAS does:
    in double a C++ kernel's vectors hold half the lanes and convert every product."""
    if kind in ("sum", "prod"):
        if dtype in HALF_DTYPES or (origin == "mm" and dtype == torch.float32):
            return torch.float32
        return torch.float64 if dtype.is_floating_point else torch.int64
    return compute_dtype(dtype)
