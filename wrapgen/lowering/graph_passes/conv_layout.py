"""Channels-last convolutions: rewrite the captured graph so 2-d convolutions read NHWC.

cuDNN runs a convolution of NCHW tensors by transposing its input to NHWC and its result back
(`nchwToNhwcKernel` / `nhwcToNchwKernel`, about a quarter of ResNet-50's GPU time in bf16).
Given channels-last input and weight it transposes nothing and returns a channels-last result,
and every op after it that eager computes with TensorIterator (batch norm, relu, add, pooling)
keeps that layout, so only the graph's image input and the convolutions' weights need a copy.

The rewrite works on the ATen graph, before lowering: a `clone(memory_format=channels_last)`
goes before each 2-d convolution's input and weight that are not channels-last already (one
per value, shared by the convolutions that read it), then fake-tensor propagation recomputes
the traced layout of every node downstream, exactly as eager would lay the results out. The
lowering then takes those strides as usual: generated kernels index by them, library results
are checked against them. Weights are parameters held by reference (updated in place between
calls), so they are copied on every call, by a generated kernel, as Inductor does without
freezing; 1x1 weights are channels-last as they are and are not copied.

Where the layout would change what a program observes it is put back: a graph output (eager
returns the original strides; a training graph's saved tensors must match what its backward was
traced with), and a view whose meaning depends on strides (`as_strided`, a `view` that the new
strides cannot express). Graphs whose outputs would need many such copies (a training forward
saves most activations) are left alone: the copies would cost more than the transposes.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, fake_value, graph_fake_mode, with_graph

# Devices on which the rewrite runs. CPU is left out: on the small ResNet config the per-call
# weight copies cost more than mkldnn's transposes save (benchmarks/conv_layout_ab.py, README).
DEVICES = frozenset({"cuda"})

# Views whose result does not depend on how the base is laid out (they fail rather than read
# other elements when the strides cannot express them); any other view of a tensor whose
# layout the rewrite changed reads the original layout.
_LAYOUT_FREE_VIEWS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::permute", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::slice", "aten::select", "aten::alias", "aten::transpose", "aten::t", "aten::split",
    "aten::split_with_sizes", "aten::unbind", "aten::narrow", "aten::detach", "aten::chunk",
})

_CHANNELS_LAST = torch.channels_last


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
    devices = DEVICES if devices is None else devices
    graph = captured.graph_module.graph
    convs = [n for n in graph.nodes if is_conv2d(n, devices)]
    if not convs or 2 * sum(_grouped(n) for n in convs) > len(convs):
        return captured
    mutated_outputs = frozenset(captured.mutations)
    try:
        rewritten, restores = _Rewriter(graph, set(convs), mutated_outputs).run()
    except Exception:  # _Abort, or an op fake tensors cannot re-trace: the graph as it is is correct
        return captured
    if not pays(len(convs), restores):
        return captured
    return with_graph(captured, rewritten)


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

    def __init__(self, graph: torch.fx.Graph, convs: set[torch.fx.Node], mutated_outputs: frozenset[int]) -> None:
        self.old = graph
        self.convs = convs
        self.mutated_outputs = mutated_outputs
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
                self.env[node] = self.new.node_copy(node, lambda n: self.env[n])
        self.new.lint()
        return self.new, self.restores

    # -- nodes -------------------------------------------------------------------------------
    def _call(self, node: torch.fx.Node) -> None:
        args = torch.fx.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.map_arg(node.kwargs, lambda n: self.env[n])
        if node in self.convs:
            args = (self._to_channels_last(args[0]), self._to_channels_last(args[1]), *args[2:])
        elif self._is_layout_dependent_view(node) and isinstance(args[0], torch.fx.Node) and args[0] in self.changed:
            args = (self._restore(args[0]), *args[1:])
        new = self._copy(node, args, kwargs)
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
            if isinstance(mapped, torch.fx.Node) and mapped in self.changed and index not in self.mutated_outputs:
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

    def _is_layout_dependent_view(self, node: torch.fx.Node) -> bool:
        return self._is_view(node) and node.target._schema.name not in _LAYOUT_FREE_VIEWS  # type: ignore[union-attr]
