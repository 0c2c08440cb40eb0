"""On CUDA, a linear layer's `addmm` whose result only pointwise work reads becomes `mm`, its
bias added by the generated kernel that reads the product anyway.

`addmm` with a bias row runs cuBLASLt's bias epilogue, whose heuristics pick other tiles than
a plain product's: on an H200, over the projections of ViT-B/16, GPT-2, BERT and a Llama-sized
layer, it took 0.97-1.39x the time of `mm` in float32 and 1.01-1.24x in bfloat16 (64x64 tiles
for ViT-B/16's float32 MLP down-projection: 449 us against 323;
benchmarks/results/addmm-bias-cuda-2026-11-26-H200.md).
Adding a row of bias in a kernel that already reads every element costs one extra load of a
vector that stays in cache. The rewrite is made only where that kernel exists: every reader of
the product (through views) is a pointwise op with a loop lowering, none is a graph output, and
the bias is one row; anything else keeps `addmm`, where the epilogue saves a pass over memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, fake_value, rewrite_calls
from wrapgen.lowering.loop_ops import pointwise
from wrapgen.lowering.loop_ops.common import LOWERINGS, op_key, supported

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def bias_into_readers(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each such `addmm(bias, a, b)` made `mm(a, b) + bias` (on a copy of the
    graph), or `captured` itself when there is none."""
    return rewrite_calls(captured, aten.addmm.default, _bias_can_move, _rewrite)


def _scale(node: torch.fx.Node, index: int, name: str) -> object:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, 1)


def cuda_result_and_bias(node: torch.fx.Node, position: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The traced result of `node` and of its bias argument at `position`, where the result is a
    CUDA float tensor and the bias a tensor of its dtype; else None."""
    value, bias = node.meta.get("val"), node.args[position]
    bias_value = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.device.type != "cuda" or value.dtype not in _DTYPES:
        return None
    if not isinstance(bias_value, torch.Tensor) or bias_value.dtype != value.dtype:
        return None
    return value, bias_value


def _bias_can_move(node: torch.fx.Node) -> bool:
    """Whether `node` is a CUDA addmm of a bias row (beta = alpha = 1) whose every reader is
    pointwise work that a generated kernel will do."""
    found = cuda_result_and_bias(node, 0)
    if found is None:
        return False
    _, bias_value = found
    if _scale(node, 3, "beta") != 1 or _scale(node, 4, "alpha") != 1:
        return False
    if bias_value.dim() not in (1, 2) or (bias_value.dim() == 2 and bias_value.shape[0] != 1):
        return False  # a full matrix C: addmm reads it in the product's own pass
    return read_only_by_loops(node)


def read_only_by_loops(node: torch.fx.Node, modules: tuple[str, ...] = (pointwise.__name__,)) -> bool:
    """Every reader of `node`, looking through views, is an op with a loop lowering (from one of
    `modules`, pointwise ops by default) that CUDA kernels do."""
    for user in node.users:
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return False
        if user.target.is_view or user.target is aten._unsafe_view.default:
            if not read_only_by_loops(user, modules):
                return False
            continue
        lowering = LOWERINGS.get(op_key(user))
        if lowering is None or lowering.__module__ not in modules or not supported(user, "cuda"):
            return False
    return True


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, _: object, fake_mode) -> bool:
    """`mm` + `add` in place of `node`, where fake tensors give the sum its layout."""
    bias, a, b = node.args[:3]

    def build(add: Callable[..., torch.fx.Node]) -> torch.fx.Node:
        return add(aten.add.Tensor, (add(aten.mm.default, (a, b)), bias))

    return replace_if_same_layout(graph, node, build, fake_mode)


def replace_if_same_layout(graph: torch.fx.Graph, node: torch.fx.Node,
                           build: Callable[[Callable[..., torch.fx.Node]], torch.fx.Node], fake_mode) -> bool:
    """Replace `node` by the nodes `build` adds before it (through the function it is given,
    which traces each new node's fake value) and returns the last of; False, and the graph as it
    was, when fake tensors refuse them or give the replacement another shape, layout or dtype."""
    added: list[torch.fx.Node] = []

    def add(target: object, args: tuple) -> torch.fx.Node:
        added.append(new := graph.call_function(target, args))
        new.meta["val"] = fake_value(new, fake_mode)
        return new

    try:
        with graph.inserting_before(node):
            replacement = build(add)
        expected, got = node.meta["val"], replacement.meta["val"]
        same = (got.shape, got.stride(), got.dtype) == (expected.shape, expected.stride(), expected.dtype)
    except Exception:  # noqa: BLE001 - fake tensors refuse the new nodes: keep the old one
        same = False
    if not same:
        for new in reversed(added):
            graph.erase_node(new)
        return False
    node.replace_all_uses_with(replacement)
    graph.erase_node(node)
    return True
