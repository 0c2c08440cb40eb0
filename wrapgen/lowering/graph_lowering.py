"""Walk an ATen fx graph and produce the Wrapper IR lines for it.

In this layer every op is a library call: the op's out= overload into an allocated buffer
where one exists, else the op itself returning its own result. Views of buffers whose
layout the program controls become `Reinterpret` lines; in-place ops become calls that
write the buffer they mutate.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import sympy
import torch
import torch.fx

from wrapgen.errors import LoweringError
from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.collectives import InFlightCollectives, collective_of, is_wait
from wrapgen.lowering.constant_folding import folded_value
from wrapgen.lowering.extern_layout import expected_layout
from wrapgen.lowering.lifetimes import insert_frees, remove_unused_views
from wrapgen.lowering.out_variants import find_out_variant
from wrapgen.lowering.symbols import BindingSource, SymbolTable, plan_bindings
from wrapgen.lowering.user_triton import is_user_triton, lower_user_triton
from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
    AssertInput,
    AssertScalar,
    BindSymbol,
    ExternKernel,
    MultiOutput,
    Output,
    Reinterpret,
    WrapperLine,
)
from wrapgen.wrapper_ir.passes.state_versions import annotate_state_versions
from wrapgen.wrapper_ir.program import Constant, Program, ScalarInput, TensorInput
from wrapgen.wrapper_ir.values import Arg, TensorRef, TensorType

_SIZE_QUERIES = frozenset({"aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset"})
_SYMBOL_NAME = re.compile(r"^[suf]\d+$")

# Ops that return a view of their first argument although their schema does not say so.
_UNANNOTATED_VIEWS = frozenset({"aten::_unsafe_view"})


@dataclass(frozen=True)
class Buffer:
    """A lowered tensor value: its IR name, type, the storage it lives in, and whether the
    program knows its layout (inputs are checked, allocations are ours) or the library chose it."""

    name: str
    type: TensorType
    root: str
    root_offset: sympy.Expr
    fixed_layout: bool


@dataclass(frozen=True)
class TupleResult:
    """A tuple returned by a library call, picked apart by MultiOutput lines."""

    name: str
    types: tuple[TensorType | None, ...]


def _python_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"v_{cleaned}"


class GraphLowering:
    """Lowers one CapturedGraph to a Program."""

    def __init__(self, captured: CapturedGraph, name: str = "forward") -> None:
        self.captured = captured
        self.name = name
        self.symbols = SymbolTable()
        self.lines: list[WrapperLine] = []
        self.values: dict[torch.fx.Node, object] = {}
        self.taken_names: set[str] = set()
        self.counter = 0
        self.bound_unbacked: set[sympy.Symbol] = set()
        self.tensor_inputs: set[str] = set()
        self.folded: list[Constant] = []  # small constants computed at compile time
        self.collectives = InFlightCollectives()

    # -- naming -------------------------------------------------------------------------
    def fresh(self, prefix: str = "buf") -> str:
        while f"{prefix}{self.counter}" in self.taken_names:
            self.counter += 1
        name = f"{prefix}{self.counter}"
        self.counter += 1
        self.taken_names.add(name)
        return name

    def claim(self, wanted: str) -> str:
        """A unique Python-safe name close to `wanted`, never one of the size-symbol names."""
        name = _python_name(wanted)
        if _SYMBOL_NAME.match(name):
            name = f"arg_{name}"
        base, n = name, 1
        while name in self.taken_names:
            name = f"{base}_{n}"
            n += 1
        self.taken_names.add(name)
        return name

    # -- types ------------------------------------------------------------------------------
    def tensor_type(self, fake: torch.Tensor, with_strides: bool = True) -> TensorType:
        sizes = self.symbols.shape(fake.shape)
        strides = self.symbols.shape(fake.stride()) if with_strides else None
        return TensorType(fake.dtype, fake.device, sizes, strides)

    # -- entry ------------------------------------------------------------------------------
    def lower(self) -> Program:
        graph = self.captured.graph_module.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        inputs, sources = self._lower_inputs(placeholders)
        constants = self._lower_constants(placeholders, graph)
        header_lines = list(self.lines)
        self.lines = []
        for node in graph.nodes:
            if node.op == "call_function":
                self._wait_for_reads(node)
                self.values[node] = self._lower_call(node)
                self._bind_data_dependent_sizes(self.values[node], node.meta.get("val"))
            elif node.op == "output":
                self._wait_for_reads(node)
                self._lower_output(node)
            elif node.op not in ("placeholder", "get_attr"):
                raise LoweringError(f"node {node.name}: op kind {node.op!r} is not supported")
        constants += self.folded
        bindings = plan_bindings(sources, self.symbols)
        # Inputs are freed after their last use too: under the boxed calling convention the
        # program owns the argument list, so a dropped input can be released early.
        body = remove_unused_views(self.finish_body(self.lines))
        lines = insert_frees(bindings + header_lines + body, keep={c.name for c in constants})
        lines = annotate_state_versions(lines, {i.name for i in inputs} | {c.name for c in constants})
        return Program(self.name, tuple(inputs), self.symbols.infos(), tuple(constants), tuple(lines))

    def finish_body(self, lines: list[WrapperLine]) -> list[WrapperLine]:
        """Hook for subclasses to rewrite the lowered lines (e.g. place generated kernels)."""
        return lines

    def _bind_data_dependent_sizes(self, value: object, fake: object) -> None:
        """A result whose size the op chose from the data (nonzero, unique, masked_select, a
        slice up to an `.item()`, ...) carries unbacked symbols (u0, ...) in its sizes, strides
        or storage offset: bind each from the result, before anything uses it."""
        buffers = value if isinstance(value, tuple) else (value,)
        fakes = fake if isinstance(fake, (list, tuple)) else (fake,)
        for buffer, buffer_fake in zip(buffers, fakes):
            if not isinstance(buffer, Buffer):
                continue
            observed = [("size", dim, size) for dim, size in enumerate(buffer.type.sizes)]
            observed += [("stride", dim, stride) for dim, stride in enumerate(buffer.type.strides or ())]
            if isinstance(buffer_fake, torch.Tensor) and _has_unbacked(buffer_fake.storage_offset()):
                observed.append(("offset", None, sympy.sympify(self.symbols.expr(buffer_fake.storage_offset()))))
            for kind, dim, expr in observed:
                if isinstance(expr, sympy.Symbol) and str(expr).startswith("u") and expr not in self.bound_unbacked:
                    info = self.symbols.info(expr)
                    self.lines.append(BindSymbol(expr, buffer.name, kind, dim, OBSERVED, info.min, info.max))  # type: ignore[arg-type]
                    self.bound_unbacked.add(expr)

    def _lower_item(self, node: torch.fx.Node, fake: object) -> object:
        """`.item()` / `.tolist()`: a symbol bound at run time from the tensor's one element. Its
        range is what torch proved (torch._check); the graph's own asserts are lowered too."""
        value = self.symbols.expr(fake)
        if not isinstance(value, sympy.Symbol):
            raise LoweringError(f"node {node.name}: aten::_local_scalar_dense gives {value}, not a fresh symbol")
        source = self.to_arg(node.args[0])  # materializes a fused value the kernel lowering holds
        if not isinstance(source, TensorRef):
            raise LoweringError(f"node {node.name}: aten::_local_scalar_dense of a value that is not a tensor")
        info = self.symbols.info(value)
        self.lines.append(BindSymbol(value, source.name, "item", None, OBSERVED, info.min, info.max))
        self.bound_unbacked.add(value)
        return value

    def _fold(self, node: torch.fx.Node, value: torch.Tensor) -> Buffer:
        name = self.claim(f"{node.name}_folded")
        type_ = self.tensor_type(value)
        self.folded.append(Constant(name, type_, f"{_qualified(node.target)} folded", value))
        return Buffer(name, type_, name, sympy.Integer(0), True)

    def _unbound_unbacked(self, fake: torch.Tensor) -> bool:
        """Whether `fake`'s layout holds an unbacked symbol not bound yet (the op must run to tell)."""
        # Only unbacked parts are named here: naming an input's symbolic storage offset would
        # make it a program symbol nothing can bind (see _try_view).
        exprs = [e for e in (*fake.shape, *fake.stride(), fake.storage_offset()) if _has_unbacked(e)]
        symbols = {s for e in exprs for s in sympy.sympify(self.symbols.expr(e)).free_symbols}
        return any(str(s).startswith("u") and s not in self.bound_unbacked for s in symbols)

    def _lower_inputs(self, placeholders: dict[str, torch.fx.Node]) -> tuple[list, list[BindingSource]]:
        inputs: list[TensorInput | ScalarInput] = []
        sources: list[BindingSource] = []
        stride_sources: list[BindingSource] = []
        for placeholder_name in self.captured.inputs:
            node = placeholders[placeholder_name]
            value = node.meta.get("val")
            name = self.claim(placeholder_name)
            if isinstance(value, torch.Tensor):
                type_ = self.tensor_type(value)
                inputs.append(TensorInput(name, type_))
                self.tensor_inputs.add(name)
                for dim, size in enumerate(type_.sizes):
                    sources.append(BindingSource(name, "size", dim, size))
                for dim, stride in enumerate(type_.strides or ()):
                    stride_sources.append(BindingSource(name, "stride", dim, stride))
                checked_strides = tuple(None if size == 1 else stride for size, stride in zip(type_.sizes, type_.strides or ()))
                device = None if _is_philox_state(node) else type_.device
                self.lines.append(AssertInput(name, type_.dtype, device, type_.sizes, checked_strides))
                self.values[node] = Buffer(name, type_, name, sympy.Integer(0), True)
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                inputs.append(ScalarInput(name, _scalar_kind(value)))
                expr = self.symbols.expr(value)
                if isinstance(expr, sympy.Expr):
                    sources.append(BindingSource(name, "value", None, expr))
                else:
                    self.lines.append(AssertScalar(name, expr))
                # A plain number was specialized by the tracer: the program uses that value.
                self.values[node] = expr
            else:
                raise LoweringError(f"input {placeholder_name}: {type(value).__name__} values are not supported")
        return inputs, sources + stride_sources

    def _lower_constants(self, placeholders: dict[str, torch.fx.Node], graph: torch.fx.Graph) -> list[Constant]:
        constants: list[Constant] = []
        by_name = {n.name: n for n in graph.nodes}
        for node_name, (origin, tensor) in self.captured.constants.items():
            node = by_name[node_name]
            name = self.claim(node_name)
            fake = node.meta.get("val")
            type_ = self.tensor_type(fake if isinstance(fake, torch.Tensor) else tensor)
            constants.append(Constant(name, type_, origin, tensor, self.captured.permuted.get(node_name)))
            self.values[node] = Buffer(name, type_, name, sympy.Integer(0), True)
        return constants

    # -- arguments --------------------------------------------------------------------------
    def to_arg(self, value: object) -> Arg:
        if isinstance(value, torch.fx.Node):
            lowered = self.values[value]
            if isinstance(lowered, Buffer):
                return TensorRef(lowered.name)
            if isinstance(lowered, tuple):
                return tuple(self.to_arg_value(v) for v in lowered)
            if isinstance(lowered, TupleResult):
                raise LoweringError(f"node {value.name}: a whole tuple result cannot be passed as an argument")
            return lowered  # type: ignore[return-value]
        if isinstance(value, (list, tuple)):
            return tuple(self.to_arg(v) for v in value)
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.symbols.expr(value)  # type: ignore[return-value]
        if isinstance(value, torch.Tensor):
            raise LoweringError("a tensor constant is embedded in a node's arguments; lift it first")
        return value  # type: ignore[return-value]

    def to_arg_value(self, value: object) -> Arg:
        return TensorRef(value.name) if isinstance(value, Buffer) else value  # type: ignore[return-value]

    # -- calls ------------------------------------------------------------------------------
    def _lower_call(self, node: torch.fx.Node) -> object:
        target = node.target
        fake = node.meta.get("val")
        if target is operator.getitem:
            return self._lower_getitem(node)
        if is_user_triton(target):
            return lower_user_triton(self, node)
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(fake, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                return self.symbols.expr(fake)
            raise LoweringError(f"node {node.name}: call of {target} is not an ATen operator")
        if target._schema.name in _SIZE_QUERIES:
            return self.symbols.expr(fake)
        if target._schema.name == "aten::_local_scalar_dense":
            return self._lower_item(node, fake)
        collective = collective_of(target)
        if collective is not None:
            return self._lower_collective(node, collective, fake)
        waited = self._waited(node) if is_wait(target) else None
        if waited is not None:
            return waited
        folded = folded_value(node)
        if folded is not None:
            return self._fold(node, folded)
        if fake is not None and not isinstance(fake, (torch.Tensor, list, tuple)):
            raise LoweringError(
                f"node {node.name}: {target} returns a {type(fake).__name__} computed from tensor data, "
                "which is not supported"
            )
        view = self._try_view(node, target, fake)
        if view is not None:
            return view
        if _mutated_argument_indices(target):
            return self._lower_inplace(node, target)
        out_variant = find_out_variant(target, _result_device(fake)) if self._all_allocatable(fake) else None
        if out_variant is not None:
            return self._lower_out_call(node, out_variant, fake)
        return self._lower_functional(node, target, fake)

    # -- collectives ------------------------------------------------------------------------
    def _lower_collective(self, node: torch.fx.Node, collective: str, fake: object) -> Buffer:
        source = self.to_arg(node.args[0])
        if not isinstance(source, TensorRef) or not isinstance(fake, torch.Tensor):
            raise LoweringError(f"node {node.name}: {collective} of a value that is not a tensor")
        name = self.fresh()
        type_ = self.tensor_type(fake)
        # torch's kernels return a dense result; a fake that says otherwise is read with run-time strides
        dense = fake.is_contiguous()
        line_type = type_ if dense else TensorType(type_.dtype, type_.device, type_.sizes)
        self.lines.append(self.collectives.start(node, collective, name, source.name, line_type))
        return Buffer(name, type_, name, sympy.Integer(0), dense)

    def _waited(self, node: torch.fx.Node) -> Buffer | None:
        """`wait_tensor` of a collective result: its wait line (unless a read already placed it)."""
        value = self.values.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, Buffer) or value.name not in self.collectives.results:
            return None  # another op's wait (all_to_all_single, ...): a library call
        self.lines.extend(self.collectives.waits_before([value.name]))
        return value

    def _wait_for_reads(self, node: torch.fx.Node) -> None:
        """Wait for in-flight collective results `node` reads before its own wait_tensor."""
        if self.collectives.started and not is_wait(node.target):
            read = [v for n in node.all_input_nodes for v in _buffers(self.values.get(n))]
            self.lines.extend(self.collectives.waits_before([b.name for b in read]))

    def _lower_getitem(self, node: torch.fx.Node) -> object:
        source, index = node.args
        value = self.values[source]  # type: ignore[index]
        if isinstance(value, (tuple, dict)):  # a dict: a user Triton kernel's results by parameter
            return value[index]  # type: ignore[index]
        if isinstance(value, TupleResult):
            fake = node.meta.get("val")
            if not isinstance(fake, torch.Tensor):
                raise LoweringError(f"node {node.name}: element {index} of {value.name} is not a tensor")
            name = self.fresh()
            type_ = self.tensor_type(fake)
            self.lines.append(MultiOutput(name, value.name, (int(index),), TensorType(type_.dtype, type_.device, type_.sizes)))  # type: ignore[arg-type]
            return Buffer(name, type_, name, sympy.Integer(0), self._expected_layout(name, fake, type_))
        raise LoweringError(f"node {node.name}: getitem on a value that is not a tuple")

    def _try_view(self, node: torch.fx.Node, op: torch._ops.OpOverload, fake: object) -> Buffer | tuple | None:
        is_view = op.is_view or op._schema.name in _UNANNOTATED_VIEWS
        if not is_view or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        base = self.values.get(node.args[0])
        base_fake = node.args[0].meta.get("val")
        if not isinstance(base, Buffer) or not base.fixed_layout or not isinstance(base_fake, torch.Tensor):
            return None
        fakes = fake if isinstance(fake, (list, tuple)) else [fake]
        if not all(isinstance(f, torch.Tensor) and f.dtype == base.type.dtype for f in fakes):
            return None
        if any(self._unbound_unbacked(f) for f in fakes):
            return None  # e.g. x[:n] with n from .item(): the op's own call tells the view's size
        # A conj / neg view (aten::_conj, aten::_neg_view) is the same memory read through a
        # flag that a reinterpretation of the storage would drop: keep the op's own call.
        if any(f.is_conj() != base_fake.is_conj() or f.is_neg() != base_fake.is_neg() for f in fakes):
            return None
        if op._schema.name in _UNANNOTATED_VIEWS and not base_fake.is_contiguous():
            return None
        # as_strided with an explicit storage offset is absolute in its storage; an input's own
        # offset is known only at call time (and is not checked), so let the op place the view.
        explicit_offset = len(node.args) > 3 and node.args[3] is not None or node.kwargs.get("storage_offset") is not None
        if op._schema.name == "aten::as_strided" and explicit_offset and base.root in self.tensor_inputs:
            return None
        views = []
        for view_fake in fakes:
            type_ = self.tensor_type(view_fake)
            # Subtract before naming symbols: an input's symbolic storage offset cancels out here
            # and must not become a program symbol (nothing could bind it).
            relative = self.symbols.expr(view_fake.storage_offset() - base_fake.storage_offset())
            offset = sympy.simplify(base.root_offset + relative)
            name = self.fresh()
            self.lines.append(Reinterpret(name, base.root, type_.dtype, type_.device, type_.sizes, type_.strides or (), offset))
            views.append(Buffer(name, type_, base.root, offset, True))
        return tuple(views) if isinstance(fake, (list, tuple)) else views[0]

    def _all_allocatable(self, fake: object) -> bool:
        fakes = fake if isinstance(fake, (list, tuple)) else [fake]
        for f in fakes:
            if not isinstance(f, torch.Tensor):
                return False
            type_ = self.tensor_type(f)
            if any(str(s).startswith("u") for e in (*type_.sizes, *(type_.strides or ())) for s in sympy.sympify(e).free_symbols):
                return False
        return True

    def _call_args(self, node: torch.fx.Node) -> tuple[tuple[Arg, ...], tuple[tuple[str, Arg], ...]]:
        args = tuple(self.to_arg(a) for a in node.args)
        kwargs = tuple((k, self.to_arg(v)) for k, v in node.kwargs.items())
        return args, kwargs

    def _lower_out_call(self, node: torch.fx.Node, variant, fake: object) -> object:
        fakes = list(fake) if isinstance(fake, (list, tuple)) else [fake]
        buffers = []
        for f in fakes:
            name = self.fresh()
            type_ = self.tensor_type(f)
            self.lines.append(Allocate(name, type_))
            buffers.append(Buffer(name, type_, name, sympy.Integer(0), True))
        args, kwargs = self._call_args(node)
        outs = tuple((key, TensorRef(b.name)) for key, b in zip(variant.out_names, buffers))
        self.lines.append(
            ExternKernel(None, _qualified(variant.op), args, kwargs + outs, None, tuple(b.name for b in buffers))
        )
        return tuple(buffers) if isinstance(fake, (list, tuple)) else buffers[0]

    def _lower_functional(self, node: torch.fx.Node, op: torch._ops.OpOverload, fake: object) -> object:
        args, kwargs = self._call_args(node)
        if fake is None or (isinstance(fake, (list, tuple)) and not fake):
            self.lines.append(ExternKernel(None, _qualified(op), args, kwargs))
            return None
        name = self.fresh()
        alias_of = self._aliased_root(node, op)
        if isinstance(fake, torch.Tensor):
            type_ = self.tensor_type(fake)
            result = TensorType(type_.dtype, type_.device, type_.sizes)
            self.lines.append(ExternKernel(name, _qualified(op), args, kwargs, result, (), alias_of))
            fixed = alias_of is None and self._expected_layout(name, fake, type_)
            return Buffer(name, type_, alias_of or name, sympy.Integer(0), fixed)
        if isinstance(fake, (list, tuple)):
            types = tuple(
                TensorType(f.dtype, f.device, self.symbols.shape(f.shape)) if isinstance(f, torch.Tensor) else None
                for f in fake
            )
            self.lines.append(ExternKernel(name, _qualified(op), args, kwargs, types, (), alias_of))
            return TupleResult(name, types)
        raise LoweringError(f"node {node.name}: {op} returns {type(fake).__name__}, which is not supported")

    def _expected_layout(self, name: str, fake: object, type_: TensorType) -> bool:
        """Take the strides the meta function gives library result `name` as its layout
        (checked at run time, see extern_layout.py); whether the program may."""
        hints = {info.symbol: info.hint for info in self.symbols.infos()}
        return expected_layout(self.lines, name, fake, type_, hints)

    def _aliased_root(self, node: torch.fx.Node, op: torch._ops.OpOverload) -> str | None:
        returns = op._schema.returns
        if not (returns and returns[0].alias_info is not None) or not node.args:
            return None
        base = self.values.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        return base.root if isinstance(base, Buffer) else None

    def _lower_inplace(self, node: torch.fx.Node, op: torch._ops.OpOverload) -> object:
        args, kwargs = self._call_args(node)
        positional = list(node.args)
        written: list[str] = []
        results: list[object] = []
        for index in _mutated_argument_indices(op):
            argument = op._schema.arguments[index]
            value = positional[index] if index < len(positional) else node.kwargs.get(argument.name)
            lowered = self.values.get(value) if isinstance(value, torch.fx.Node) else None
            if not isinstance(lowered, Buffer):
                raise LoweringError(f"node {node.name}: {op} mutates an argument that is not a tensor buffer")
            written.append(lowered.name)
            results.append(lowered)
        self.lines.append(ExternKernel(None, _qualified(op), args, kwargs, None, tuple(written)))
        if len(op._schema.returns) == 0:
            return None
        return results[0] if len(op._schema.returns) == 1 else tuple(results)

    # -- output -----------------------------------------------------------------------------
    def _lower_output(self, node: torch.fx.Node) -> None:
        values = node.args[0]
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        outputs: list[Arg] = []
        # A user output that is the very node holding a mutation's new value is the mutated
        # input itself in eager (`x.add_(1); return x`): return the input after the write-back,
        # as torch.export's own unlifting does.
        written_back: dict[torch.fx.Node, str] = {}
        for index, value in enumerate(values):
            target = self.captured.mutations.get(index)
            if target is not None:
                self._write_back(target, value)
                if isinstance(value, torch.fx.Node):
                    written_back.setdefault(value, target)
                continue
            if isinstance(value, torch.fx.Node) and value in written_back:
                outputs.append(TensorRef(self._placeholder_buffer(written_back[value]).name))
                continue
            outputs.append(self.to_arg(value))
        self.lines.append(Output(tuple(outputs)))

    def _placeholder_buffer(self, placeholder: str) -> Buffer:
        destination = next(v for n, v in self.values.items() if n.name == placeholder)
        assert isinstance(destination, Buffer)
        return destination

    def _write_back(self, placeholder: str, value: object) -> None:
        """Copy a functionalized mutation's new value back into the input/constant it updates."""
        destination = self._placeholder_buffer(placeholder)
        source = self.to_arg(value)
        if source == TensorRef(destination.name):
            return
        self.lines.append(ExternKernel(None, "aten::copy_.default", (TensorRef(destination.name), source), (), None, (destination.name,)))


# Arguments of the attention backward ops that carry the dropout RNG state.
_PHILOX_ARGUMENTS = frozenset({"philox_seed", "philox_offset", "rng_state"})


def _is_philox_state(node: torch.fx.Node) -> bool:
    """Whether every use of `node` is as attention's philox seed/offset: tensors that eager
    keeps on the host (on the device only under CUDA-graph capture) while the fake tensor that
    describes them says the op's device, so their device cannot be checked."""
    if not node.users:
        return False
    for user in node.users:
        op = user.target
        if not isinstance(op, torch._ops.OpOverload):
            return False
        names = [a.name for a in op._schema.arguments]
        used_as = [names[i] for i, a in enumerate(user.args) if a is node and i < len(names)]
        used_as += [k for k, v in user.kwargs.items() if v is node]
        if not used_as or any(n not in _PHILOX_ARGUMENTS for n in used_as):
            return False
    return True


def _buffers(value: object) -> list[Buffer]:
    if isinstance(value, Buffer):
        return [value]
    return [v for v in value if isinstance(v, Buffer)] if isinstance(value, tuple) else []


def _qualified(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _result_device(fake: object) -> str:
    first = fake[0] if isinstance(fake, (list, tuple)) else fake
    return first.device.type  # _all_allocatable made sure these are tensors


def _scalar_kind(value: object) -> type:
    if isinstance(value, (torch.SymBool, bool)):
        return bool
    return int if isinstance(value, (torch.SymInt, int)) else float


def _has_unbacked(value: object) -> bool:
    """Whether a SymInt depends on a value only known at run time (torch names those u0, u1, ...)."""
    return isinstance(value, torch.SymInt) and any(str(s).startswith("u") for s in value.node.expr.free_symbols)


def _mutated_argument_indices(op: torch._ops.OpOverload) -> list[int]:
    return [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
