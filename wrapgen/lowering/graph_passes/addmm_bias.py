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


def _bias_can_move(node: torch.fx.Node) -> bool:
    """Whether `node` is a CUDA addmm of a bias row (beta = alpha = 1) whose every reader is
    pointwise work that a generated kernel will do."""
    value, bias = node.meta.get("val"), node.args[0]
    bias_value = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.device.type != "cuda" or value.dtype not in _DTYPES:
        return False
    if not isinstance(bias_value, torch.Tensor) or bias_value.dtype != value.dtype:
        return False
    if _scale(node, 3, "beta") != 1 or _scale(node, 4, "alpha") != 1:
        return False
    if bias_value.dim() not in (1, 2) or (bias_value.dim() == 2 and bias_value.shape[0] != 1):
        return False  # a full matrix C: addmm reads it in the product's own pass
    return _read_pointwise_only(node)


def _read_pointwise_only(node: torch.fx.Node) -> bool:
    """Every reader of `node`, looking through views, is a pointwise op with a loop lowering."""
    for user in node.users:
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return False
        if user.target.is_view or user.target is aten._unsafe_view.default:
            if not _read_pointwise_only(user):
                return False
            continue
        lowering = LOWERINGS.get(op_key(user))
        if lowering is None or lowering.__module__ != pointwise.__name__ or not supported(user, "cuda"):
            return False
    return True


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, _: object, fake_mode) -> bool:
    """`mm` + `add` in place of `node`; False (the graph as it was) when fake tensors do not give
    the sum exactly the addmm's result layout."""
    bias, a, b = node.args[:3]
    added: list[torch.fx.Node] = []
    try:
        with graph.inserting_before(node):
            added.append(product := graph.call_function(aten.mm.default, (a, b)))
            product.meta["val"] = fake_value(product, fake_mode)
            added.append(total := graph.call_function(aten.add.Tensor, (product, bias)))
            total.meta["val"] = fake_value(total, fake_mode)
        expected, got = node.meta["val"], total.meta["val"]
        same = (got.shape, got.stride(), got.dtype) == (expected.shape, expected.stride(), expected.dtype)
    except Exception:  # noqa: BLE001 - fake tensors refuse the pair: keep the addmm
        same = False
    if not same:
        for new in reversed(added):
            graph.erase_node(new)
        return False
    node.replace_all_uses_with(total)
    graph.erase_node(node)
    return True
