"""Turn what a user hands us (module, function, ATen graph) into one ATen fx graph plus roles.

`torch.export` plus the core-ATen decompositions does the tracing for modules and functions;
an ATen `fx.GraphModule` (as aot_autograd produces) is taken as it is.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.export import Dim
from torch.export._remove_effect_tokens_pass import _remove_effect_tokens
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module
from torch.utils import _pytree as pytree

from wrapgen.errors import LoweringError
from wrapgen.lowering.decompositions import export_table
from wrapgen.lowering.user_triton import triton_op_decomposition


@dataclass
class CapturedGraph:
    """An ATen graph and what each placeholder and output means.

    `inputs` are the placeholders fed by `call(args)`, in order; `constants` maps the other
    placeholders (and get_attr targets) to (origin, tensor); `mutations` maps an output
    position to the placeholder whose storage it must be written back into; `frozen` names the
    constants whose value cannot change between calls (tensors the traced code made from Python
    data, which torch.export lifts), unlike parameters and buffers, held by reference; `owned`
    names the constants the compiled program keeps its own copy of (an AOT package's weights
    file), whose layout is the program's to choose; `permuted` maps a constant made from another
    by a permutation (graph_passes/product_weights.py) to that permutation: its tensor is the
    origin's value permuted and made contiguous.
    """

    graph_module: torch.fx.GraphModule
    inputs: list[str]
    constants: dict[str, tuple[str, torch.Tensor]] = field(default_factory=dict)
    mutations: dict[int, str] = field(default_factory=dict)
    in_spec: pytree.TreeSpec | None = None
    out_spec: pytree.TreeSpec | None = None
    output_kind: str = "tuple"  # for graphs without out_spec: "tuple" | "list" | "single"
    traced: bool = False  # torch.export traced it from the model: it can be traced again at other sizes
    frozen: frozenset[str] = frozenset()
    owned: frozenset[str] = frozenset()
    permuted: dict[str, tuple[int, ...]] = field(default_factory=dict)


class _FunctionModule(torch.nn.Module):
    """Lets torch.export trace a plain function."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def graph_module(root: torch.nn.Module, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """`torch.fx.GraphModule(root, graph)`, made lazily: the lowering reads the graph, so its
    Python code (a whole-model codegen plus `compile`) is only generated if the module is run."""
    with _use_lazy_graph_module(True):
        return _make_graph_module(root, graph)


def with_graph(captured: CapturedGraph, graph: torch.fx.Graph) -> CapturedGraph:
    """`captured` running `graph` (a rewritten copy of its graph), with its placeholder names as
    the copy has them: fx renames a copied placeholder whose name shadows a builtin
    (nn.Sequential's `input` becomes `input_1`)."""
    module = graph_module(captured.graph_module, graph)
    old = captured.graph_module.graph.find_nodes(op="placeholder")
    names = {b.name: a.name for b, a in zip(old, graph.find_nodes(op="placeholder")) if b.name != a.name}
    return dataclasses.replace(
        captured,
        graph_module=module,
        inputs=[names.get(n, n) for n in captured.inputs],
        constants={names.get(k, k): v for k, v in captured.constants.items()},
        mutations={i: names.get(n, n) for i, n in captured.mutations.items()},
        frozen=frozenset(names.get(n, n) for n in captured.frozen),
        owned=frozenset(names.get(n, n) for n in captured.owned),
        permuted={names.get(k, k): v for k, v in captured.permuted.items()},
    )


def graph_fake_mode(graph: torch.fx.Graph):
    """The fake mode a captured graph's values live in (found from its inputs' values), for a
    rewriting pass to compute its new nodes' values in; None when the graph has none."""
    from torch._guards import detect_fake_mode

    values = [n.meta.get("val") for n in graph.nodes if n.op in ("placeholder", "get_attr")]
    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def fake_value(node: torch.fx.Node, fake_mode) -> object:
    """What `node` computes, from its inputs' fake values, under `fake_mode`: the `val` a node a
    rewriting pass adds must carry (sizes, strides and dtype, as the op itself gives them)."""
    args = torch.fx.map_arg(node.args, lambda n: n.meta["val"])
    kwargs = torch.fx.map_arg(node.kwargs, lambda n: n.meta["val"])
    with fake_mode:
        return node.target(*args, **kwargs)  # type: ignore[operator]


def rewrite_calls(captured: CapturedGraph, target: object, applies: Callable[[torch.fx.Node], object],
                  rewrite: Callable[[torch.fx.Graph, torch.fx.Node, object, object], bool]) -> CapturedGraph:
    """The shared frame of a graph-rewriting pass: each call of `target` for which `applies(node)`
    is truthy goes to `rewrite(graph, node, what applies returned, fake mode)` on a copy of the
    graph (True when it changed the copy). `captured` itself when nothing applies or changes,
    so a graph without such calls is not copied."""
    return rewrite_nodes(captured, applies, rewrite, target)


def rewrite_nodes(captured: CapturedGraph, applies: Callable[[torch.fx.Node], object],
                  rewrite: Callable[[torch.fx.Graph, torch.fx.Node, object, object], bool],
                  target: object = None) -> CapturedGraph:
    """`rewrite_calls` over every call (of `target` when given) for which `applies` is truthy."""
    def calls(graph: torch.fx.Graph) -> list[torch.fx.Node]:
        if target is not None:
            return list(graph.find_nodes(op="call_function", target=target))
        return [n for n in graph.nodes if n.op == "call_function"]

    if not any(applies(n) for n in calls(captured.graph_module.graph)):
        return captured
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(captured.graph_module.graph, {}))
    fake_mode = graph_fake_mode(graph)
    if fake_mode is None:
        return captured
    changed = False
    for node in calls(graph):
        found = applies(node)
        if found:
            changed |= rewrite(graph, node, found, fake_mode)
    if not changed:
        return captured
    graph.lint()
    return with_graph(captured, graph)


def is_aten_graph(gm: torch.fx.GraphModule) -> bool:
    """True when every call in the graph is already an ATen overload (or getitem / symbolic int math)."""
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return False
        if node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload) or target is operator.getitem:
                continue
            if getattr(target, "__module__", "") in ("_operator", "operator", "math", "torch", "builtins"):
                if "val" in node.meta and not isinstance(node.meta["val"], torch.Tensor):
                    continue
            return False
    return all("val" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


def capture(model: object, example_inputs: Sequence[object], dynamic: bool) -> CapturedGraph:
    """Trace `model` on `example_inputs` into a CapturedGraph."""
    if isinstance(model, torch.fx.GraphModule) and is_aten_graph(model):
        return capture_aten_graph(model)
    module = model if isinstance(model, torch.nn.Module) else _FunctionModule(model)  # type: ignore[arg-type]
    args = tuple(example_inputs)
    dynamic_shapes = _all_dims_dynamic(args) if dynamic and args else None  # no inputs: nothing is dynamic
    if dynamic_shapes is not None and isinstance(module, _FunctionModule):
        dynamic_shapes = (dynamic_shapes,)  # forward(*args) takes them as one tuple
    # Lazy graph modules (as torch.compile uses them): the graphs torch.export builds and rebuilds
    # on the way are turned into Python code only if something runs or prints them, not at each
    # of its passes (about half of its recompiles; the graphs themselves are the same).
    with _use_lazy_graph_module(True):
        try:
            exported = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as err:  # torch's own tracing failure: report it as such
            raise LoweringError(f"torch.export could not capture the program: {type(err).__name__}: {err}") from err
        try:
            exported = exported.run_decompositions(export_table(), **triton_op_decomposition())
        except Exception as err:  # torch could not take its own graph down to core ATen
            raise LoweringError(
                f"torch.export could not capture the program: run_decompositions: {type(err).__name__}: {err}"
            ) from err
    if any(spec.kind == InputKind.TOKEN for spec in exported.graph_signature.input_specs):
        # Ops with side effects (e.g. linalg's error checks) are threaded through effect
        # tokens; the program runs them in graph order anyway, so call them directly.
        exported = _remove_effect_tokens(exported)
    return _from_exported(exported)


def _all_dims_dynamic(args: tuple) -> tuple:
    """Dim.AUTO for every dim of size >= 2. torch.export specializes an example's 0/1 sizes
    anyway (and warns); leaving them static says so quietly: a call with other sizes there is
    served by a program traced at those sizes (wrapgen/specialize.py)."""

    def spec(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return {d: Dim.AUTO for d in range(value.dim()) if value.shape[d] >= 2}
        return None

    return tuple(pytree.tree_map(spec, a) for a in args)


def _from_exported(exported: torch.export.ExportedProgram) -> CapturedGraph:
    signature = exported.graph_signature
    state = {**exported.state_dict, **exported.constants}
    inputs: list[str] = []
    constants: dict[str, tuple[str, torch.Tensor]] = {}
    for spec in signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            constants[name] = (spec.target, state[spec.target].detach())
        else:
            raise LoweringError(f"input {name} of kind {spec.kind.name} is not supported")
    mutations: dict[int, str] = {}
    placeholder_of = {spec.target: spec.arg.name for spec in signature.input_specs if spec.target}
    user_inputs = {spec.arg.name for spec in signature.input_specs if spec.kind == InputKind.USER_INPUT}
    for index, spec in enumerate(signature.output_specs):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutations[index] = placeholder_of[spec.target]
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            if spec.target not in user_inputs:
                raise LoweringError(f"mutated input {spec.target} is not a user input")
            mutations[index] = spec.target
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise LoweringError(f"output {spec.arg} of kind {spec.kind.name} is not supported")
    return CapturedGraph(
        exported.graph_module,
        inputs,
        constants,
        mutations,
        exported.call_spec.in_spec,
        exported.call_spec.out_spec,
        traced=True,
        frozen=frozenset(spec.arg.name for spec in signature.input_specs if spec.kind == InputKind.CONSTANT_TENSOR),
    )


# fx names a tensor the traced code made from Python data (`torch.tensor(0)`), held by no module,
# `_tensor_constant<N>` (torch.fx's Tracer.create_arg); aot_autograd hands parameters and buffers in
# as inputs, so such an attribute's value is fixed when the graph is traced.
_TRACED_CONSTANT_PREFIX = "_tensor_constant"


def capture_aten_graph(gm: torch.fx.GraphModule) -> CapturedGraph:
    inputs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    constants: dict[str, tuple[str, torch.Tensor]] = {}
    frozen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            if not isinstance(value, torch.Tensor):
                raise LoweringError(f"get_attr {node.target} is a {type(value).__name__}, not a tensor")
            constants[node.name] = (node.target, value.detach())
            if str(node.target).startswith(_TRACED_CONSTANT_PREFIX) and not isinstance(value, torch.nn.Parameter):
                frozen.add(node.name)
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    kind = "tuple" if isinstance(output, tuple) else "list" if isinstance(output, list) else "single"
    return CapturedGraph(gm, inputs, constants, output_kind=kind, frozen=frozenset(frozen))
