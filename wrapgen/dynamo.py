"""`torch.compile(model, backend="wrapgen", options={...})`: the TorchDynamo backend.

Registered through the `torch_dynamo_backends` entry point, so no `import wrapgen` is
needed (a checkout used from PYTHONPATH has none: call `ensure_registered()`). aot_autograd
hands us functional ATen graphs (forward, and backward when training); each is lowered,
optimized and emitted for the configured target. The backward is compiled with the forward
(`compile_backward_early`), so its compile-time measurements never meet a step's activations.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx

from wrapgen import config
from wrapgen.size_hints import ExampleSizeProgram, aten_graph_at_hints, symbolic_products
from wrapgen.wrapper_ir.program import Program, TensorInput


def compile_aten_graph(gm: torch.fx.GraphModule, name: str, target: str | None = None) -> Callable[[list], Any]:
    """Compile one aot_autograd graph to a boxed callable (takes the list of inputs)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from wrapgen.api import _emit, _start_emit, optimize, resolve_target
    from wrapgen.lowering.capture import capture_aten_graph
    from wrapgen.lowering.lower import lower_captured

    passed = _opaque_pass_through(gm)
    if passed is not None:  # objects a program cannot hold, only handed on: handed on around it
        inner = compile_aten_graph(passed.graph_module, name, target)
        return passed.wrap(inner)
    # aot_autograd calls compilers with its fake mode active; the graph's constants (lifted
    # tensor constants, e.g. the 0.0 of `x[:, 1] = 0.0`) are real tensors and stay real.
    with unset_fake_temporarily():
        lowered = lower_captured(capture_aten_graph(gm), name)
        target = resolve_target(target)
        program = optimize(_with_static_inputs(gm, lowered, name), target)
        at_hints = config.max_autotune and bool(symbolic_products(program))
        pending = _FORWARDS_TO_FINISH.get() if name == "forward" and not at_hints else None
        if pending is not None:  # its kernels compile while aot_autograd has the backward lowered
            deferred = _FinishedLater(_start_emit(program, target))
            pending.append(deferred)
            return deferred
        call = _emit(program, target).call
        if at_hints:
            call = _with_program_at_hints(call, program, gm, name, target)
    call._boxed_call = True  # type: ignore[attr-defined]
    return call


class _OpaquePassThrough:
    """A graph whose opaque inputs (a DTensor's device mesh or process group: script objects, not
    tensors or numbers) are only returned, as aot_autograd hands a tensor subclass's context from
    the forward to the backward: `graph_module` is the graph without them (None where they were
    returned), and `wrap` puts them back around the compiled call."""

    def __init__(self, graph_module: torch.fx.GraphModule, positions: list[int], returned: dict[int, int]) -> None:
        self.graph_module, self.positions, self.returned = graph_module, positions, returned

    def wrap(self, inner: Callable[[list], Any]) -> Callable[[list], Any]:
        positions, returned = set(self.positions), self.returned

        def call(args: list) -> Any:
            objects = {i: args[i] for i in positions}
            rest = [a for i, a in enumerate(args) if i not in positions]
            args.clear()
            out = list(inner(rest))
            for output, position in returned.items():
                out[output] = objects[position]
            return out

        call._boxed_call = True  # type: ignore[attr-defined]
        return call


def _opaque_pass_through(gm: torch.fx.GraphModule) -> _OpaquePassThrough | None:
    """The graph without its opaque inputs when each is unused or only returned (else None: the lowering
    refuses them, naming the input)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    opaque = [i for i, n in enumerate(placeholders)
              if not isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool,
                                                     int, float, bool))
              and all(u.op == "output" for u in n.users)]
    if not opaque:
        return None
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    values = graph.graph_copy(gm.graph, mapping)
    if not isinstance(values, (list, tuple)):
        return None  # aot_autograd's graphs return a tuple
    dropped = {mapping[placeholders[i]]: i for i in opaque}
    returned = {k: dropped[v] for k, v in enumerate(values) if isinstance(v, torch.fx.Node) and v in dropped}
    graph.output(type(values)(None if isinstance(v, torch.fx.Node) and v in dropped else v for v in values))
    for node in dropped:
        graph.erase_node(node)
    return _OpaquePassThrough(torch.fx.GraphModule(gm, graph), opaque, returned)


# The forwards compiled in the backend call in progress that are made runnable at its end (see
# `wrapgen_backend`); None outside one, or where the backward is compiled lazily.
_FORWARDS_TO_FINISH: contextvars.ContextVar[list[_FinishedLater] | None] = contextvars.ContextVar(
    "wrapgen_forwards_to_finish", default=None)


class _FinishedLater:
    """A boxed call whose program was emitted but not yet made runnable (kernels waited for,
    library built and loaded): `finish()` does that, at the end of the backend call, or at the
    first call if that comes earlier."""

    _boxed_call = True

    def __init__(self, runnable: Callable[[], Any]) -> None:
        self._runnable: Callable[[], Any] | None = runnable
        self._call: Callable[[list], Any] | None = None

    def finish(self) -> None:
        if self._runnable is not None:
            self._call, self._runnable = self._runnable().call, None

    def __call__(self, args: list) -> Any:
        if self._call is None:
            self.finish()
        return self._call(args)  # type: ignore[misc]


def _with_program_at_hints(dynamic_call: Callable[[list], Any], dynamic_program: Any, gm: torch.fx.GraphModule,
                           name: str, target: str) -> Callable[[list], Any]:
    """max_autotune with symbolic sizes: `gm` also compiled static at its size hints, its products
    measured there; a call at exactly those sizes runs it, every other call `dynamic_call`
    (wrapgen/size_hints.py). If the static compile fails, a warning says why and
    `dynamic_call` serves every call."""
    from wrapgen.api import _emit, optimize
    from wrapgen.lowering.capture import capture_aten_graph
    from wrapgen.lowering.lower import lower_captured

    try:
        traced = aten_graph_at_hints(gm)
        if traced is None:
            return dynamic_call  # a data-dependent size: there is no size to measure at
        static_gm, example = traced
        lowered = lower_captured(capture_aten_graph(static_gm), f"{name}_at_hints")
        static_program = optimize(_with_static_inputs(gm, lowered, name), target)
        at_hints = ExampleSizeProgram(_emit(static_program, target).call, example)
    except Exception as err:  # noqa: BLE001 - the dynamic program is correct at every size
        warnings.warn(f"max_autotune: no {name} program at the size hints ({type(err).__name__}: {err}); every "
                      "call runs the dynamic program and its library matrix products", stacklevel=2)
        return dynamic_call

    def call(args: list) -> Any:
        return (at_hints.function if at_hints.matches(args) else dynamic_call)(args)

    call.at_hints, call.program_at_hints = at_hints, static_program  # type: ignore[attr-defined]
    call.program = dynamic_program  # type: ignore[attr-defined]
    return call


def _with_static_inputs(gm: torch.fx.GraphModule, program: Program, name: str) -> Program:
    """`program` with the forward graph's inputs that are parameters and buffers (aot_autograd's
    static_input_indices) marked static: CUDA graphs use them in place, keyed by address, instead
    of copying them each call, and the python target keeps their views between calls. The
    backward's inputs are activations: none is static there."""
    return program.with_static_inputs(_static_input_names(gm, program) if name != "backward" else ())


def _static_input_names(gm: torch.fx.GraphModule, program: Program) -> list[str]:
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    indices = getattr(metadata, "static_input_indices", None) or []
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    names = program.input_names()
    if len(placeholders) != len(names):
        return []
    return [names[i] for i in indices if 0 <= i < len(names) and isinstance(program.inputs[i], TensorInput)]


def wrapgen_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict[str, Any] | None = None) -> Callable:
    """The dynamo backend. `options` are wrapgen config options (target, debug_dir, ...)."""
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd

    from wrapgen.kernels.triton.runtime import start_workers_early
    from wrapgen.lowering.decompositions import aot_autograd_table
    from wrapgen.lowering.graph_passes import TRACED_PASSES, run_passes

    config.validate(dict(options or {}))
    # Options are taken now, when dynamo compiles: the backward graph, compiled at the first
    # backward call (maybe outside a `config.patch` block), gets the same ones as the forward.
    settings = {**config.snapshot(), **(options or {})}
    with config.patch(settings):
        start_workers_early(example_inputs)  # they start while aot_autograd traces
        gm = run_passes(TRACED_PASSES, gm, "dynamo")  # before aot_autograd: the backward it derives sees them

    def compiler(name: str) -> Callable:
        def compile_graph(graph: torch.fx.GraphModule, inputs: list) -> Callable:
            with config.patch(settings):
                if name == "backward":
                    mark_input_layouts(graph, inputs)
                    return compile_aten_graph(graph, name)
                saved, reported = _saved_outputs() if name == "forward" else None, []
                with _training_forward(saved, reported):
                    call = compile_aten_graph(graph, name)
                _report_output_strides(reported)
                return call

        return compile_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=aot_autograd_table(),
        keep_inference_input_mutations=True,
        # Save for the backward only what is costly to recompute (matmul outputs, reductions);
        # cheap pointwise values are recomputed there, fused into its kernels: less memory
        # held between forward and backward, and fewer bytes written and read (as Inductor does).
        partition_fn=_partition,
    )
    # The backward compiled with the forward (where torch has the switch; else at the first
    # backward call, torch's default): the forward's kernels and library then finish while the
    # backward is lowered, and the forward is made runnable at the end, inside these options.
    early = settings["compile_backward_early"] and hasattr(functorch_config, "force_non_lazy_backward_lowering")
    forwards: list[_FinishedLater] = []
    token = _FORWARDS_TO_FINISH.set(forwards if early else None)
    try:
        lowering = functorch_config.patch(force_non_lazy_backward_lowering=True) if early else contextlib.nullcontext()
        with config.patch(settings), lowering:
            compiled = backend(gm, example_inputs)
            for forward in forwards:
                forward.finish()
    finally:
        _FORWARDS_TO_FINISH.reset(token)
    return compiled


# -- saved activations at other strides (graph_passes/conv_layout.py) ------------------------------


def _partition(joint: torch.fx.GraphModule, joint_inputs: Any, **options: Any) -> Any:
    """The joint graph, its copy-only clones removed (so the partitioner cannot save a value and
    its copy), split by the min-cut partitioner."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from wrapgen.lowering.graph_passes.copy_only_clones import remove_copy_only_clones

    if remove_copy_only_clones(joint.graph):
        joint.recompile()
    return min_cut_rematerialization_partition(joint, joint_inputs, **options)


def _saved_outputs() -> slice | None:
    """The slice of the forward's outputs that aot_autograd saves for the backward, or None."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    try:
        return metadata.tensors_saved_for_backwards_slice if metadata is not None else None
    except (AttributeError, AssertionError):
        return None


@contextlib.contextmanager
def _training_forward(saved: slice | None, reported: list) -> Iterator[None]:
    from wrapgen.lowering.graph_passes.conv_layout import REPORTED_STRIDES, SAVED_OUTPUTS

    tokens = SAVED_OUTPUTS.set(saved), REPORTED_STRIDES.set(reported)
    try:
        yield
    finally:
        SAVED_OUTPUTS.reset(tokens[0])
        REPORTED_STRIDES.reset(tokens[1])


def _report_output_strides(strides: list) -> None:
    """Tell aot_autograd the strides the forward returns its outputs at, where the layout pass
    changed some saved activations' (it then gives the backward's compiler its inputs so)."""
    context = torch._guards.TracingContext.try_get()
    if strides and context is not None and context.output_strides is not None:
        context.output_strides.extend(strides)


def mark_input_layouts(gm: torch.fx.GraphModule, inputs: list) -> None:
    """Give the backward's placeholders the strides of the inputs aot_autograd compiles it for
    (the forward's saved activations, as it returned them), keeping the traced value under
    TRACED_LAYOUT for `propagate_input_layouts` to re-trace from. Only static strides."""
    from wrapgen.lowering.graph_passes.conv_layout import TRACED_LAYOUT

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        return
    for node, value in zip(placeholders, inputs):
        traced = node.meta.get("val")
        if not (isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor)):
            continue
        strides, traced_strides = value.stride(), traced.stride()
        if not all(isinstance(s, int) for s in (*strides, *traced_strides, *value.shape, *traced.shape)):
            continue
        if tuple(value.shape) == tuple(traced.shape) and tuple(strides) != tuple(traced_strides):
            node.meta[TRACED_LAYOUT] = traced
            node.meta["val"] = value


def ensure_registered() -> None:
    """Make `backend="wrapgen"` resolvable where the package's entry point is missing (a source
    checkout on PYTHONPATH, as the tests and benchmarks run on a GPU host); a no-op otherwise."""
    from torch._dynamo.backends.registry import lookup_backend, register_backend
    from torch._dynamo.exc import InvalidBackend

    try:
        lookup_backend("wrapgen")
    except InvalidBackend:
        register_backend(name="wrapgen")(wrapgen_backend)
