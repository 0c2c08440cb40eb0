"""Channels-last convolutions: rewrite the captured graph so 2-d convolutions read NHWC.

cuDNN runs a convolution of NCHW tensors by transposing its input to NHWC and its result back
(`nchwToNhwcKernel` / `nhwcToNchwKernel`, about a quarter of ResNet-50's GPU time in bf16).
Given channels-last input and weight it transposes nothing and returns a channels-last result,
and every op after it that eager computes with TensorIterator (batch norm, relu, add, pooling)
keeps that layout, so only the graph's image input and the convolutions' weights need a copy.
That pays only between convolutions: one that no other convolution feeds or reads (a vision
transformer's patch embedding) is left NCHW (`chained_convolutions`).

The rewrite works on the ATen graph, before lowering: a `clone(memory_format=channels_last)`
goes before each 2-d convolution's input and weight that are not channels-last already (one
per value, shared by the convolutions that read it), then fake-tensor propagation recomputes
the traced layout of every node downstream, exactly as eager would lay the results out. The
lowering then takes those strides as usual: generated kernels index by them, library results
are checked against them. Weights are parameters held by reference (updated in place between
calls), so they are copied on every call, by a generated kernel, as Inductor does without
freezing; 1x1 weights are channels-last as they are and are not copied.

Where the layout would change what a program observes it is put back: a graph output (eager
returns the original strides), and a view whose meaning depends on strides (`as_strided`, a
`view` that the new strides cannot express). A training forward's saved activations are outputs
too, two or three per convolution: on CUDA the forward is left alone (copying them back would
cost more than the transposes). On the CPU (`KEEP_SAVED_DEVICES`), where mkldnn's NCHW
convolutions and eager's NCHW max pooling are slower than their channels-last kernels, they stay
channels-last, as Inductor keeps them: the forward's compiler reports their strides to
aot_autograd (`SAVED_OUTPUTS`, `REPORTED_STRIDES`, set by the dynamo backend), which hands the
backward's compiler its inputs at those strides; `propagate_input_layouts` re-traces the backward
from them (its convolution backwards then read NHWC too), or, where it cannot, copies them back.
"""

from __future__ import annotations

import operator
from contextvars import ContextVar

import torch
import torch.fx

from wrapgen import config
from wrapgen.lowering.capture import CapturedGraph, fake_value, graph_fake_mode, with_graph
from wrapgen.lowering.graph_passes.conv_choice import faster_channels_last
from wrapgen.lowering.kernel_lowering import kernel_language
from wrapgen.lowering.loop_ops import supported

# Devices on which the rewrite runs for every 2-d convolution.
DEVICES = frozenset({"cuda"})
# Devices on which an inference graph's convolutions go channels-last one by one, where that
# measured faster (conv_choice.py): on the CPU it depends on the shape, and the weight copies
# (per call, without freezing) can cost more than mkldnn's NHWC kernels save.
MEASURED_DEVICES = frozenset({"cpu"})
# Devices on which a training forward's convolutions run channels-last with its saved activations
# left so (see the module's docstring); a CPU training step's convolutions and max pooling then run
# channels-last in forward and backward.
KEEP_SAVED_DEVICES = frozenset({"cpu"})
# Set by the dynamo backend while it compiles a training forward: the slice of its outputs that are
# saved for the backward; and a list the pass fills with every output's strides when it kept some
# saved ones channels-last (for aot_autograd's TracingContext.output_strides).
SAVED_OUTPUTS: ContextVar[slice | None] = ContextVar("wrapgen_saved_outputs", default=None)
REPORTED_STRIDES: ContextVar[list | None] = ContextVar("wrapgen_reported_strides", default=None)
# meta key of a backward input whose strides aot_autograd changed to the forward's: its traced value
TRACED_LAYOUT = "wrapgen_traced_layout"

# Views whose result does not depend on how the base is laid out (they fail rather than read
# other elements when the strides cannot express them); any other view of a tensor whose
# layout the rewrite changed reads the original layout.
_LAYOUT_FREE_VIEWS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::permute", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::slice", "aten::select", "aten::alias", "aten::transpose", "aten::t", "aten::split",
    "aten::split_with_sizes", "aten::unbind", "aten::narrow", "aten::detach", "aten::chunk",
})

_CHANNELS_LAST = torch.channels_last

# Library ops whose kernels on these devices take only a contiguous first input. The composite op
# eager calls (`group_norm`) makes its input contiguous on CUDA first; export traced a contiguous
# input, so the graph holds no copy, and the meta function checks nothing. An input the rewrite made
# channels-last is copied back for them, as eager would copy it; not where a generated kernel
# computes the op (it reads any layout).
CONTIGUOUS_INPUT_OPS: dict[object, frozenset[str]] = {torch.ops.aten.native_group_norm.default: frozenset({"cuda"})}
# Normalizations whose traced result is contiguous whatever their input's layout (their meta
# functions say so). Where a generated kernel computes one from a channels-last input, its result
# stays channels-last: traced contiguous, a GroupNorm after a channels-last convolution turned the
# rest of the network back to NCHW, so PoolFormer's 3x3 pool over that GroupNorm read its input
# 64 elements apart per thread (264 us where Inductor's takes 9-47 on an H200), and every next
# convolution's input was transposed again.
LAYOUT_KEEPING_NORMS = frozenset({torch.ops.aten.native_group_norm.default})


def _channels_last_strides(shape: torch.Size) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


class _Abort(Exception):
    """The graph cannot be rewritten soundly: lower it as it is."""


def is_conv2d(node: torch.fx.Node, devices: frozenset[str] | None = None) -> bool:
    """A 2-d convolution (4-d input and weight) of floating tensors on one of `devices` (DEVICES)."""
    devices = DEVICES if devices is None else devices
    if node.op != "call_function" or node.target is not torch.ops.aten.convolution.default:
        return False
    if len(node.args) < 2 or not all(isinstance(a, torch.fx.Node) for a in node.args[:2]):
        return False
    values = [a.meta.get("val") for a in node.args[:2]]  # type: ignore[union-attr]
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point() for v in values):
        return False
    return all(v.device.type in devices and not _symbolic(v) for v in values)


def _symbolic(value: torch.Tensor) -> bool:
    """Sizes or strides with symbols: left as they are (layout copies of symbolic shapes are
    not worth the risk of guarding on them; Inductor skips them too)."""
    return any(isinstance(e, torch.SymInt) for e in (*value.shape, *value.stride()))


def _grouped(node: torch.fx.Node) -> bool:
    """A grouped convolution that is not depthwise: channels-last slows these down in cuDNN."""
    weight = node.args[1].meta["val"]  # type: ignore[union-attr]
    groups = node.args[8] if len(node.args) > 8 else node.kwargs.get("groups", 1)
    return isinstance(groups, int) and groups > 1 and weight.shape[1] > 1


def channels_last_convolutions(captured: CapturedGraph, devices: frozenset[str] | None = None) -> CapturedGraph:
    """`captured` with its 2-d convolutions in channels-last (a new graph), or `captured` itself
    when nothing qualifies or the rewrite would not pay (`config.layout_optimization` switches
    the pass on, in graph_passes' list)."""
    saved = SAVED_OUTPUTS.get()
    if devices is None:
        devices = DEVICES | (KEEP_SAVED_DEVICES if saved is not None else frozenset())
    graph = captured.graph_module.graph
    convs = [n for n in graph.nodes if is_conv2d(n, devices)]
    declined: list[torch.fx.Node] = []  # measured slower channels-last: kept NCHW, their input too
    if saved is None:
        convs = chained_convolutions(graph, convs)
        measured = [n for n in graph.nodes if is_conv2d(n, MEASURED_DEVICES - devices)]
        for node in measured:
            (convs if faster_channels_last(node) else declined).append(node)
    if not convs or 2 * sum(_grouped(n) for n in convs) > len(convs):
        return captured
    mutated_outputs = frozenset(captured.mutations)
    outputs = _output_values(graph)
    keep = frozenset()
    if saved is not None and any(is_conv2d(n, KEEP_SAVED_DEVICES) for n in convs):
        keep = frozenset(range(*saved.indices(len(outputs))))
    try:
        rewritten, restores = _Rewriter(graph, set(convs), mutated_outputs, keep, set(declined)).run()
    except Exception:  # _Abort, or an op fake tensors cannot re-trace: the graph as it is is correct
        return captured
    if not pays(len(convs), restores):
        return captured
    reported = REPORTED_STRIDES.get()
    if keep and reported is not None:
        reported[:] = [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in _output_values(rewritten)]
    return with_graph(captured, rewritten)


def chained_convolutions(graph: torch.fx.Graph, convs: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The convolutions of `convs` whose result reaches another convolution, or that read one's.

    Channels-last pays where the layout carries from one convolution to the next: the ops between
    keep it and cuDNN transposes nothing. A convolution no other one feeds or reads (a vision
    transformer's patch embedding: its result is flattened into tokens at once) gains nothing: the
    copies of its input and weight replace cuDNN's own transposes, and they stay alive beside its
    workspace (CLIP's ViT-B/32 at batch 32 peaked 13.7 MiB above eager's, at that convolution)."""
    chosen = set(convs)
    fed: set[torch.fx.Node] = set()  # nodes some convolution of `convs` reaches (it excluded)
    for node in graph.nodes:
        if any(i in chosen or i in fed for i in node.all_input_nodes):
            fed.add(node)
    feeding: set[torch.fx.Node] = set()  # nodes that reach some convolution of `convs`
    for node in reversed(graph.nodes):
        if any(u in chosen or u in feeding for u in node.users):
            feeding.add(node)
    return [n for n in convs if n in fed or n in feeding]


def _output_values(graph: torch.fx.Graph) -> list[object]:
    values = next(n for n in graph.nodes if n.op == "output").args[0]
    flat = list(values) if isinstance(values, (list, tuple)) else [values]
    return [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in flat]


def propagate_input_layouts(captured: CapturedGraph) -> CapturedGraph:
    """A backward whose inputs aot_autograd gave the strides the forward returned them at (marked
    TRACED_LAYOUT): every value downstream re-traced at them, outputs at their traced strides; or,
    where re-tracing fails, the marked inputs copied back to their traced layout first (always
    correct)."""
    graph = captured.graph_module.graph
    marked = [n for n in graph.nodes if n.op == "placeholder" and TRACED_LAYOUT in n.meta]
    if not marked:
        return captured
    try:
        rewritten, _ = _Rewriter(graph, set(), frozenset(captured.mutations), frozenset()).run()
    except Exception:  # noqa: BLE001 - the copies below are correct whatever the graph holds
        rewritten = _inputs_copied_back(graph)
    return with_graph(captured, rewritten)


def _inputs_copied_back(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    new._codegen = graph._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    fake_mode = graph_fake_mode(graph)
    for node in graph.nodes:
        copied = new.node_copy(node, lambda n: env[n])
        env[node] = copied
        traced = copied.meta.pop(TRACED_LAYOUT, None)
        if traced is None:
            continue
        layout = torch.channels_last if traced.is_contiguous(memory_format=_CHANNELS_LAST) else torch.contiguous_format
        clone = new.create_node("call_function", torch.ops.aten.clone.default, (copied,), {"memory_format": layout},
                                f"{node.name}_traced_layout")
        clone.meta["val"] = fake_value(clone, fake_mode)
        if tuple(clone.meta["val"].stride()) != tuple(traced.stride()):
            raise _Abort(f"{node.name}: its traced layout {traced.stride()} cannot be restored")
        env[node] = clone
    new.lint()
    return new


def pays(convs: int, restores: int) -> bool:
    """Whether the rewrite pays with `restores` copies back to the original layout: not in a
    training forward, which returns two or three activations per convolution for its backward
    (each would be copied back); an inference graph returns a few results."""
    return restores <= convs


def _layout(value: object) -> object:
    """What of a traced value the rewrite may change: tensor strides (per tensor of a tuple)."""
    if isinstance(value, torch.Tensor):
        return tuple(value.stride())
    if isinstance(value, (list, tuple)):
        return tuple(_layout(v) for v in value)
    return None


class _Rewriter:
    """Copies the graph node by node, inserting layout copies and re-tracing changed nodes."""

    def __init__(self, graph: torch.fx.Graph, convs: set[torch.fx.Node], mutated_outputs: frozenset[int],
                 keep_outputs: frozenset[int] = frozenset(), nchw_convs: set[torch.fx.Node] | None = None) -> None:
        self.old = graph
        self.convs = convs
        self.nchw_convs = nchw_convs or set()  # convolutions that read their input as traced
        self.mutated_outputs = mutated_outputs
        self.keep_outputs = keep_outputs  # outputs that may leave in the new layout (saved activations)
        self.new = torch.fx.Graph()
        self.new._codegen = graph._codegen
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.changed: set[torch.fx.Node] = set()  # new nodes whose layout differs from the original's
        self.original: dict[torch.fx.Node, object] = {}  # new node -> the traced value it replaces
        self.channels_last: dict[torch.fx.Node, torch.fx.Node] = {}
        self.restored: dict[torch.fx.Node, torch.fx.Node] = {}
        self.restores = 0
        self.fake_mode = graph_fake_mode(graph)
        if self.fake_mode is None:
            raise _Abort("no fake tensors to trace with")

    def run(self) -> tuple[torch.fx.Graph, int]:
        for node in self.old.nodes:
            if node.op == "output":
                self._output(node)
            elif node.op == "call_function":
                self._call(node)
            else:
                new = self.env[node] = self.new.node_copy(node, lambda n: self.env[n])
                traced = new.meta.pop(TRACED_LAYOUT, None)
                if traced is not None:  # an input at other strides than traced: what reads it is re-traced
                    self.changed.add(new)
                    self.original[new] = traced
        self.new.lint()
        return self.new, self.restores

    # -- nodes -------------------------------------------------------------------------------
    def _call(self, node: torch.fx.Node) -> None:
        args = torch.fx.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.map_arg(node.kwargs, lambda n: self.env[n])
        if node in self.convs:
            args = (self._to_channels_last(args[0]), self._to_channels_last(args[1]), *args[2:])
        elif isinstance(args[0], torch.fx.Node) and args[0] in self.changed and self._reads_traced_layout(node):
            args = (self._restore(args[0]), *args[1:])
        new = self._copy(node, args, kwargs)
        if self._normalized_channels_last(node, new):
            kept = self.env[node] = self._clone(new, _CHANNELS_LAST, f"{node.name}_channels_last")
            self.changed.add(kept)
            self.original[kept] = node.meta.get("val")
            return
        if not any(n in self.changed for n in new.all_input_nodes):
            return  # nothing it reads changed: its traced value stands
        try:
            value = self._trace(new)
        except Exception:
            if not self._is_view(node) or not isinstance(args[0], torch.fx.Node):
                raise _Abort(f"{node.name} cannot be traced in the new layout") from None
            # a view the new strides cannot express (flatten of an NHWC map): read the original layout
            self.new.erase_node(new)
            new = self._copy(node, (self._restore(args[0]), *args[1:]), kwargs)
            value = self._trace(new)
        new.meta["val"] = value
        new.meta.pop("tensor_meta", None)  # the old layout's; nothing reads it after this
        if _layout(value) != _layout(node.meta.get("val")):
            self.changed.add(new)

    def _copy(self, node: torch.fx.Node, args: tuple, kwargs: dict) -> torch.fx.Node:
        new = self.new.create_node("call_function", node.target, args, kwargs, node.name)
        new.meta = dict(node.meta)
        self.env[node] = new
        self.original[new] = node.meta.get("val")
        return new

    def _output(self, node: torch.fx.Node) -> None:
        values = node.args[0]
        flat = list(values) if isinstance(values, (list, tuple)) else [values]
        out = []
        for index, value in enumerate(flat):
            mapped = torch.fx.map_arg(value, lambda n: self.env[n])
            # a mutation's new value is copied into its input (any layout); others keep eager's strides
            if (isinstance(mapped, torch.fx.Node) and mapped in self.changed and index not in self.mutated_outputs
                    and index not in self.keep_outputs):
                mapped = self._restore(mapped)
            out.append(mapped)
        result = type(values)(out) if isinstance(values, (list, tuple)) else out[0]
        output = self.new.output(result)
        output.meta = dict(node.meta)

    # -- layout copies -----------------------------------------------------------------------
    def _to_channels_last(self, source: object) -> object:
        if not isinstance(source, torch.fx.Node):
            raise _Abort("a convolution operand is not a graph value")
        value = source.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise _Abort(f"{source.name} has no traced tensor")
        if source in self.channels_last:
            return self.channels_last[source]
        canonical = _channels_last_strides(value.shape)
        if tuple(value.stride()) == canonical:
            return source  # already NHWC
        if value.is_contiguous(memory_format=_CHANNELS_LAST):
            # NHWC but for the strides of size-1 dims (a 1x1 weight): a free view says so exactly
            # (libraries pick their layout from the strides, mkldnn would reorder the weight)
            copy = self._node(torch.ops.aten.as_strided.default, (source, list(value.shape), list(canonical)),
                              {}, f"{source.name}_channels_last")
        else:
            copy = self._clone(source, _CHANNELS_LAST, f"{source.name}_channels_last")
        self.changed.add(copy)
        self.channels_last[source] = copy
        return copy

    def _restore(self, source: torch.fx.Node) -> torch.fx.Node:
        """`source` copied back to the strides the original graph traced for it."""
        if source in self.restored:
            return self.restored[source]
        original = self.original.get(source)
        if not isinstance(original, torch.Tensor):
            raise _Abort(f"{source.name}: no original layout to restore")
        if original.is_contiguous():
            copy = self._clone(source, torch.contiguous_format, f"{source.name}_contiguous")
        elif original.is_contiguous(memory_format=_CHANNELS_LAST):
            copy = self._clone(source, _CHANNELS_LAST, f"{source.name}_channels_last")
        else:
            raise _Abort(f"{source.name}: original layout {original.stride()} is neither contiguous nor channels-last")
        value = copy.meta["val"]
        if tuple(value.stride()) != tuple(original.stride()):
            # equal but for the strides of size-1 dims: take the original's exactly (a free view)
            copy = self._node(torch.ops.aten.as_strided.default, (copy, list(original.shape), list(original.stride())),
                              {}, f"{source.name}_strided")
        self.restores += 1
        self.restored[source] = copy
        return copy

    def _clone(self, source: torch.fx.Node, memory_format: torch.memory_format, name: str) -> torch.fx.Node:
        return self._node(torch.ops.aten.clone.default, (source,), {"memory_format": memory_format}, name)

    def _node(self, target: object, args: tuple, kwargs: dict, name: str) -> torch.fx.Node:
        node = self.new.create_node("call_function", target, args, kwargs, name)
        node.meta["val"] = self._trace(node)
        return node

    def _trace(self, node: torch.fx.Node) -> object:
        return fake_value(node, self.fake_mode)

    # -- op kinds ------------------------------------------------------------------------------
    @staticmethod
    def _is_view(node: torch.fx.Node) -> bool:
        op = node.target
        return isinstance(op, torch._ops.OpOverload) and (op.is_view or op._schema.name == "aten::_unsafe_view")

    def _reads_traced_layout(self, node: torch.fx.Node) -> bool:
        """Whether `node` must read its first input at the layout traced for it: a convolution kept
        NCHW, a view whose meaning depends on strides, or a library op that takes only contiguous
        input on the device (CONTIGUOUS_INPUT_OPS)."""
        if node in self.nchw_convs or self._is_layout_dependent_view(node):
            return True
        devices = CONTIGUOUS_INPUT_OPS.get(node.target)
        value = node.args[0].meta.get("val") if devices and isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.device.type not in devices:  # type: ignore[operator]
            return False
        return not _in_kernel(node, value.device.type)

    def _normalized_channels_last(self, node: torch.fx.Node, new: torch.fx.Node) -> bool:
        """Whether `node` is the result of a normalization (LAYOUT_KEEPING_NORMS) that a generated
        kernel computes from an input the rewrite made channels-last: kept channels-last."""
        if node.target is not operator.getitem or node.args[1] != 0:
            return False
        norm = node.args[0]
        if not isinstance(norm, torch.fx.Node) or norm.target not in LAYOUT_KEEPING_NORMS:
            return False
        source = self.env[norm].args[0]
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        result = new.meta.get("val")
        return (source in self.changed and isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor)
                and value.dim() == 4 and value.is_contiguous(memory_format=_CHANNELS_LAST)
                and not value.is_contiguous() and _in_kernel(norm, value.device.type))

    def _is_layout_dependent_view(self, node: torch.fx.Node) -> bool:
        return self._is_view(node) and node.target._schema.name not in _LAYOUT_FREE_VIEWS  # type: ignore[union-attr]


def _in_kernel(node: torch.fx.Node, device_type: str) -> bool:
    """Whether a generated kernel, not the library, computes `node` on `device_type`."""
    return config.kernels and supported(node, device_type) and kernel_language(torch.device(device_type)) is not None
