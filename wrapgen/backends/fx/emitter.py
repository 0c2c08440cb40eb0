"""FxEmitter: a Wrapper IR program as a runnable `torch.fx.GraphModule`, for out-of-tree compilers.

The graph takes the program's inputs as placeholders (called like the Python target's
`call(args)`, unpacked), binds size symbols with `aten.sym_size` / `aten.sym_stride` nodes,
computes every size expression once (`exprs.py`), and turns each line into nodes a consumer can
read: `torch.empty_strided` allocations, `torch.as_strided` views for reused and pooled
buffers, ATen op calls, `operator.getitem`, C++ kernels as the `wrapgen::cpp_kernel` op,
Triton kernels as `triton_kernel_wrapper_mutation`, and `runtime.py`'s checks, frees and
huge-page advice for large CPU buffers.
Each node's `meta["wrapgen_line"]` names the line it came from.

Subclasses override `compile_graph(gm)` to hand the graph to their own compiler (the
`torch.compile` custom-backend contract: return any callable taking the inputs).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, NoReturn

import sympy
import torch
import torch.fx

from wrapgen.backends.devices import device_overrides, kernel_device, returns_status
from wrapgen.backends.emitter import CompiledArtifact, Emitter
from wrapgen.backends.fx import runtime as fx_runtime
from wrapgen.backends.fx.exprs import ExpressionError, ExpressionNodes, Value, is_integer_expression
from wrapgen.backends.fx.multi_kernel import FxMultiKernelMixin
from wrapgen.backends.runtime import check_arg_count, resolve_op
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.collectives import WAIT_OP, CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.graphs import GraphBegin, GraphEnd
from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
    AllocateFromPool,
    AssertFinite,
    AssertInput,
    AssertScalar,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import Arg, TensorRef, TensorType

_aten = torch.ops.aten
_OBSERVE = {"size": _aten.sym_size.int, "stride": _aten.sym_stride.int}  # (tensor, dim)
_OBSERVE_WHOLE = {"offset": _aten.sym_storage_offset.default, "item": _aten._local_scalar_dense.default}  # (tensor,)


class FxEmitter(FxMultiKernelMixin, Emitter):
    """Emits a `torch.fx.GraphModule`; `compile` runs it through `compile_graph`."""

    name = "fx"

    # -- the hook for out-of-tree compilers ---------------------------------------------------
    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable[..., Any]:
        """Turn the graph into a callable taking the program's inputs; default: the graph itself."""
        return gm

    def compile(self, program: Program) -> CompiledArtifact:
        gm = self.emit(program)
        count = len(program.inputs)
        # run as it is, the graph empties `args` (each input dies at its last use in it); a
        # user's compiler gets `gm` and its callable takes the inputs positionally
        run = _boxed_runner(gm) if type(self).compile_graph is FxEmitter.compile_graph else None
        if run is None:
            compiled = self.compile_graph(gm)
            run = lambda args: compiled(*args)  # noqa: E731

        def call(args: list) -> Any:
            if len(args) != count:
                check_arg_count(args, count)
            return run(args)

        return CompiledArtifact(call, gm.code)

    # -- program ------------------------------------------------------------------------------
    def begin(self, program: Program) -> None:
        self.graph = torch.fx.Graph()
        self.env: dict[str, torch.fx.Node] = {}
        self.constants = {c.name: c for c in program.constants}
        self.attributes: dict[str, torch.Tensor | None] = {}
        self.exprs = ExpressionNodes(self._expression_node)
        self.hints = {s.symbol: s.hint for s in program.symbols}
        self.types = program.value_types()
        self.allocated: set[str] = set()  # names whose storage starts at offset 0
        self.observations: dict[tuple[str, str, int | None], torch.fx.Node] = {}
        self.storage_offsets: dict[str, torch.fx.Node] = {}
        self.pool_views: dict[tuple[str, torch.dtype], torch.fx.Node] = {}
        self.kernels: dict[str, KernelDefinition] = {}
        self.kernel_state: dict[str, Any] = {}  # per kernel: what its calls need (library, side-table ids)
        self.cpp_library: str | None = None
        self.comments: list[str] = []
        self.line: WrapperLine | None = None
        self.line_number = 0
        for spec in program.inputs:
            node = self.graph.placeholder(spec.name)
            node.meta["wrapgen_input"] = spec.format()
            self.env[spec.name] = node

    def finish(self, program: Program) -> torch.fx.GraphModule:
        self.graph.lint()
        gm = torch.fx.GraphModule(self.attributes, self.graph, class_name=f"WrapgenGraph_{program.name}")
        gm.meta["wrapgen_program"] = program.name
        gm.meta["wrapgen_kernels"] = {name: k.source for name, k in self.kernels.items()}
        return gm

    def dispatch(self, line: WrapperLine) -> None:
        self.line = line
        try:
            super().dispatch(line)
        except ExpressionError as error:
            self.refuse(str(error))

    def refuse(self, reason: str) -> NoReturn:
        """Raise UnsupportedLineError naming the current line."""
        line = self.line.format() if self.line is not None else "?"
        raise UnsupportedLineError(f"{type(self).__name__} cannot emit line {self.line_number} ({line}): {reason}")

    # -- nodes --------------------------------------------------------------------------------
    def node(
        self,
        target: Callable[..., Any] | str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        op: str = "call_function",
    ) -> torch.fx.Node:
        """One node at the end of the graph, tagged with the line it implements."""
        node = self.graph.create_node(op, target, args, kwargs or {}, name)
        if self.line is not None:
            node.meta["wrapgen_line"] = f"{self.line_number}: {self.line.format()}"
        if self.comments:
            node.meta["wrapgen_comments"] = tuple(self.comments)
            self.comments = []
        if getattr(self, "cuda_graph", None) is not None:
            node.meta["wrapgen_cuda_graph"] = self.cuda_graph
        return node

    def _expression_node(self, target: Callable, args: tuple, expr: sympy.Basic) -> torch.fx.Node:
        node = self.node(target, args)
        node.meta["wrapgen_expr"] = str(expr)
        if expr.free_symbols <= self.hints.keys():
            try:
                node.meta["val"] = _number(expr.xreplace(self.hints))
            except (TypeError, ValueError):
                pass
        return node

    def lookup(self, name: str) -> torch.fx.Node:
        """The node holding tensor `name` (constants become get_attr nodes at first use)."""
        if name in self.env:
            return self.env[name]
        constant = self.constants.get(name)
        if constant is None:
            self.refuse(f"{name} is not defined")
        self.attributes[name] = constant.value
        node = self.node(name, op="get_attr", name=name)
        node.meta["wrapgen_constant"] = constant.format()
        self.env[name] = node
        return node

    def value(self, arg: Arg) -> Any:
        """An FX argument for a Wrapper IR argument: tensors and expressions become nodes."""
        if isinstance(arg, TensorRef):
            return self.lookup(arg.name)
        if isinstance(arg, tuple):
            return tuple(self.value(a) for a in arg)
        if isinstance(arg, sympy.Basic):
            return self.exprs.value(arg)
        return arg

    def shape(self, exprs: tuple) -> tuple:
        return tuple(self.exprs.value(sympy.sympify(e)) for e in exprs)

    def define(self, name: str, node: torch.fx.Node) -> None:
        self.env[name] = node
        type_ = self.types.get(name)
        if type_ is not None:
            node.meta["wrapgen_type"] = str(type_) if not isinstance(type_, tuple) else tuple(map(str, type_))

    # -- inputs and symbols -------------------------------------------------------------------
    def emit_bind_symbol(self, line: BindSymbol) -> None:
        source = self.lookup(line.source)
        if line.kind == "value":
            observed: Value = source
        else:
            key = (line.source, line.kind, line.dim)
            if key not in self.observations:
                name = str(line.symbol) if line.expr == OBSERVED else f"{line.source}_{line.kind}{line.dim}"
                if line.kind in _OBSERVE_WHOLE:
                    self.observations[key] = self.node(_OBSERVE_WHOLE[line.kind], (source,), name=name)
                else:
                    self.observations[key] = self.node(_OBSERVE[line.kind], (source, line.dim), name=name)
            observed = self.observations[key]
        if line.expr == OBSERVED:
            value = observed
        else:
            stand_in = sympy.Symbol(f"_observed_{line.source}_{line.kind}_{line.dim}", integer=True)
            self.exprs.bind(stand_in, observed)
            value = self.exprs.value(line.expr.xreplace({OBSERVED: stand_in}))
        if isinstance(value, torch.fx.Node) and line.symbol in self.hints:
            value.meta["val"] = self.hints[line.symbol]
            value.meta["wrapgen_symbol"] = str(line.symbol)
        self.exprs.bind(line.symbol, value)
        low, high = line.checked_bounds()
        if low is not None or high is not None:
            self.node(fx_runtime.check_symbol, (value, str(line.symbol), low, high, line.min, line.max))

    def emit_assert_input(self, line: AssertInput) -> None:
        strides = tuple(None if s is None else self.exprs.value(sympy.sympify(s)) for s in line.strides)
        args = (self.lookup(line.name), line.name, self.shape(line.sizes), strides, line.dtype, line.device)
        self.node(fx_runtime.check_input, args)

    def emit_assert_scalar(self, line: AssertScalar) -> None:
        self.node(fx_runtime.check_scalar, (self.lookup(line.name), line.name, self.value(line.expected)))

    # -- buffers ------------------------------------------------------------------------------
    def emit_allocate(self, line: Allocate) -> None:
        t = line.type
        node = self.node(
            torch.empty_strided,
            (self.shape(t.sizes), self.shape(t.strides or ())),
            {"dtype": t.dtype, "device": t.device},
            name=line.name,
        )
        if device_overrides(t.device).advises_huge_pages(t):
            self.node(fx_runtime.advise_huge_pages, (node,))
        self.allocated.add(line.name)
        self.define(line.name, node)

    def emit_reuse_buffer(self, line: ReuseBuffer) -> None:
        t, source = line.type, self.types.get(line.source)
        base = self.lookup(line.source)
        if not (isinstance(source, TensorType) and source.dtype == t.dtype):
            base = self.node(_aten.view.dtype, (base, t.dtype))
        node = self.node(torch.as_strided, (base, self.shape(t.sizes), self.shape(t.strides or ()), 0), name=line.name)
        self.allocated.add(line.name)
        self.define(line.name, node)

    def emit_allocate_from_pool(self, line: AllocateFromPool) -> None:
        t = line.type
        key = (line.pool, t.dtype)
        if key not in self.pool_views:
            pool_type = self.types.get(line.pool)
            pool = self.lookup(line.pool)
            same = isinstance(pool_type, TensorType) and pool_type.dtype == t.dtype
            self.pool_views[key] = pool if same else self.node(_aten.view.dtype, (pool, t.dtype))
        offset = sympy.simplify(sympy.sympify(line.offset) / t.dtype.itemsize)
        args = (self.pool_views[key], self.shape(t.sizes), self.shape(t.strides or ()), self.exprs.value(offset))
        self.define(line.name, self.node(torch.as_strided, args, name=line.name))

    def emit_free(self, line: Free) -> None:
        views = [
            v for (pool, _), v in self.pool_views.items() if pool == line.name and v is not self.env.get(line.name)
        ]
        self.node(fx_runtime.free, (self.lookup(line.name), *views))
        self.env.pop(line.name, None)
        self.pool_views = {k: v for k, v in self.pool_views.items() if k[0] != line.name}

    def emit_reinterpret(self, line: Reinterpret) -> None:
        source = self.lookup(line.source)
        offset = self.exprs.value(sympy.sympify(line.offset))
        if line.source not in self.allocated:
            if line.source not in self.storage_offsets:
                self.storage_offsets[line.source] = self.node(_aten.sym_storage_offset.default, (source,))
            base = self.storage_offsets[line.source]
            offset = base if offset == 0 else self.node(operator.add, (base, offset))
        args = (source, self.shape(line.sizes), self.shape(line.strides), offset)
        self.define(line.name, self.node(torch.as_strided, args, name=line.name))

    # -- library calls ------------------------------------------------------------------------
    def emit_extern_kernel(self, line: ExternKernel) -> None:
        try:
            op = resolve_op(line.op)
        except (AttributeError, RuntimeError) as error:
            self.refuse(f"no operator {line.op} ({error})")
        args = tuple(self.value(a) for a in line.args)
        kwargs = {k: self.value(v) for k, v in line.kwargs}
        node = self.node(op, args, kwargs, name=line.name)
        if line.name is not None:
            self.define(line.name, node)

    def emit_collective_start(self, line: CollectiveStart) -> None:
        args = tuple(self.value(a) for a in line.op_args())
        self.define(line.name, self.node(resolve_op(line.op), args, name=line.name))

    def emit_collective_wait(self, line: CollectiveWait) -> None:
        # later readers take the wait's node: the graph's data flow orders them after it, as in
        # the graphs torch traces (a downstream compiler sees the same start/wait pair)
        waited = self.node(resolve_op(WAIT_OP), (self.lookup(line.name),), name=f"wait_{line.name}")
        self.define(line.name, waited)

    def emit_multi_output(self, line: MultiOutput) -> None:
        node = self.lookup(line.source)
        for depth, index in enumerate(line.index):
            last = depth == len(line.index) - 1
            node = self.node(operator.getitem, (node, index), name=line.name if last else None)
        self.define(line.name, node)

    # -- generated kernels --------------------------------------------------------------------
    def emit_kernel_definition(self, line: KernelDefinition) -> None:
        device = torch.device(kernel_device(line))
        define = getattr(self, f"define_{line.language}_kernel", None)
        if define is None or line.language not in device_overrides(device).kernel_languages():
            self.refuse(f"no FX launch for {line.language} kernels on {device}")
        self.kernels[line.name] = line
        define(line)

    def emit_kernel_call(self, line: KernelCall) -> None:
        definition = self.kernels.get(line.kernel)
        if definition is None:
            self.refuse(f"kernel {line.kernel} is not defined")
        getattr(self, f"call_{definition.language}_kernel")(definition, line)

    def define_cpp_kernel(self, line: KernelDefinition) -> None:
        if self.cpp_library is None:
            from wrapgen.kernels.cpp.custom_op import library_for

            # Every C++ kernel of the program goes into one library, built (or found) once.
            sources = [k.source for k in self.program.lines if isinstance(k, KernelDefinition) and k.language == "cpp"]
            self.cpp_library = library_for(sources)

    def call_cpp_kernel(self, definition: KernelDefinition, line: KernelCall) -> None:
        from wrapgen.kernels.cpp.custom_op import cpp_kernel

        order, reads, writes, ints = [], [], [], []
        for arg in line.args:
            if isinstance(arg, TensorRef):
                written = arg.name in line.writes
                order.append("w" if written else "r")
                (writes if written else reads).append(self.lookup(arg.name))
            elif _is_integer_arg(arg):
                order.append("i")
                ints.append(self.value(arg))
            else:
                self.refuse(f"argument {arg!r} of a C++ kernel is neither a tensor nor an integer")
        status = "!" if returns_status(definition) else ""  # the op raises IndexError on a nonzero status
        args = (self.cpp_library, line.kernel, status + "".join(order), reads, writes, ints)
        self.node(cpp_kernel, args, name=line.kernel)

    def define_triton_kernel(self, line: KernelDefinition) -> None:
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        metadata = dict(line.metadata)
        if "arg_names" not in metadata:
            self.refuse("a Triton kernel needs its parameter names (metadata arg_names)")
        warps = metadata.get("num_warps")
        stages = int(metadata.get("num_stages", 1))  # type: ignore[arg-type]
        kernel = _triton_kernel(line.source, line.name, None if warps is None else int(warps), stages)  # type: ignore[arg-type]
        constants = {str(k): v for k, v in metadata.get("constexprs", ())}  # type: ignore[union-attr]
        self.kernel_state[line.name] = (
            kernel_side_table.add_kernel(kernel),
            kernel_side_table.add_constant_args(constants),
            tuple(metadata["arg_names"]),  # type: ignore[arg-type]
        )

    def call_triton_kernel(self, definition: KernelDefinition, line: KernelCall) -> None:
        from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

        kernel_idx, constants_idx, names = self.kernel_state[line.kernel]
        if len(names) != len(line.args):
            self.refuse(f"{len(line.args)} arguments but the kernel names {len(names)} parameters")
        grid = tuple(self.exprs.value(sympy.sympify(g)) for g in line.grid)
        if not 1 <= len(grid) <= 3:
            self.refuse(f"a Triton launch grid has 1 to 3 dimensions, got {len(grid)}")
        kwargs = {
            "kernel_idx": kernel_idx,
            "constant_args_idx": constants_idx,
            "grid": [grid + (1,) * (3 - len(grid))],
            "tma_descriptor_metadata": {},
            "kwargs": {name: self.value(arg) for name, arg in zip(names, line.args)},
        }
        self.node(triton_kernel_wrapper_mutation, (), kwargs, name=line.kernel)

    def emit_symbolic_call_arg(self, line: SymbolicCallArg) -> None:
        value = self.exprs.value(line.expr)
        if isinstance(value, torch.fx.Node):
            value.meta.setdefault("wrapgen_symbol", str(line.symbol))
        self.exprs.bind(line.symbol, value)

    # -- the rest -----------------------------------------------------------------------------
    def emit_assert_finite(self, line: AssertFinite) -> None:
        self.node(fx_runtime.assert_finite, (self.lookup(line.name), line.name))

    def emit_ensure_strides(self, line: EnsureStrides) -> None:
        node = self.node(fx_runtime.with_strides, (self.lookup(line.name), self.shape(line.sizes), self.shape(line.strides)))
        self.define(line.name, node)

    def emit_comment(self, line: Comment) -> None:
        self.comments.append(line.text)  # kept in the meta of the next node

    def emit_graph_begin(self, line: GraphBegin) -> None:
        # The GraphModule runs a region's lines as they are; its nodes carry the region's name
        # (meta "wrapgen_cuda_graph") for a compiler that records graphs itself.
        self.cuda_graph = line.graph

    def emit_graph_end(self, line: GraphEnd) -> None:
        self.cuda_graph = None

    def emit_output(self, line: Output) -> None:
        self.node("output", (tuple(self.value(v) for v in line.values),), op="output", name="output")


@functools.cache
def _triton_kernel(source: str, name: str, num_warps: int | None, num_stages: int = 1) -> Any:
    """The kernel's JITFunction; with launch options, wrapped the way torch represents a user
    kernel launched with them: an Autotuner holding one Config (it never benchmarks). Cached, so
    the side table holds each kernel once."""
    from wrapgen.kernels.triton.runtime import jit_function

    kernel = jit_function(source, name)
    if num_warps is None:
        return kernel
    import triton

    # num_stages: what the Python target compiles the kernel with (1 unless a GEMM template asks more).
    return triton.autotune(configs=[triton.Config({}, num_warps=num_warps, num_stages=num_stages)], key=[])(kernel)


def _is_integer_arg(arg: Arg) -> bool:
    if isinstance(arg, (bool, int)):
        return True
    if isinstance(arg, sympy.Rational):
        return isinstance(arg, sympy.Integer)
    return isinstance(arg, sympy.Expr) and is_integer_expression(arg)


def _number(value: sympy.Basic) -> int | float:
    if value.is_integer:
        return int(value)
    return float(value)


def _boxed_runner(gm: torch.fx.GraphModule) -> Callable[[list], Any] | None:
    """The graph as a function of one list it empties (aot_autograd's boxed convention), so a
    backward's saved activations are freed at their last use, not when the call returns.
    `gm` itself keeps its positional signature (what `compile_graph` hands a user's compiler).
    None where torch's FX has no boxed code generator."""
    codegen = getattr(torch.fx.graph, "_BoxedCodeGen", None)
    if codegen is None:
        return None
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))  # the copy's output: the original's, remapped
    graph.set_codegen(codegen())
    return torch.fx.GraphModule(gm, graph)
