"""On CUDA, a convolution whose result only generated kernels read runs without its bias; the
kernel that reads the result adds it.

ATen runs a cuDNN convolution with a bias as the convolution, then `add_` of the bias as a
separate elementwise kernel: one more launch and one more read and write of the whole result.
On an H200 in bfloat16 those adds took 452 us of PoolFormer-S12's 3.1 ms of kernels (28 of them,
one per convolution) and 224 us of ConvNeXt-T's 2.4 ms. The kernel that reads the result anyway
(GELU, the scaled residual, a LayerNorm or GroupNorm) adds a channel's bias for one more load
of a vector that stays in cache. As Inductor does on GPUs, the bias is taken off the call; the
rewrite is made only where that kernel exists: every reader of the result (through views) is a
pointwise op, a reduction or a normalization with a loop lowering, none is a graph output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, rewrite_calls
from wrapgen.lowering.graph_passes.addmm_bias import cuda_result_and_bias, read_only_by_loops, replace_if_same_layout
from wrapgen.lowering.loop_ops import norms, pointwise, reductions

aten = torch.ops.aten
_READERS = (pointwise.__name__, reductions.__name__, norms.__name__)


def conv_bias_into_readers(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each such `convolution(x, w, bias, ...)` made `convolution(x, w, None, ...)
    + bias` (on a copy of the graph), or `captured` itself when there is none."""
    return rewrite_calls(captured, aten.convolution.default, _bias_can_move, _rewrite)


def _bias_can_move(node: torch.fx.Node) -> bool:
    """Whether `node` is a CUDA convolution with a bias of its result's dtype, every reader of
    which is work a generated kernel will do."""
    found = cuda_result_and_bias(node, 2)
    if found is None:
        return False
    value, bias_value = found
    if bias_value.dim() != 1 or value.dim() < 3 or bias_value.shape[0] != value.shape[1]:
        return False
    return read_only_by_loops(node, _READERS)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, _: object, fake_mode) -> bool:
    """The convolution without its bias, then `add` of the bias viewed per channel, in place of
    `node`, where fake tensors give the sum the convolution's layout."""
    bias = node.args[2]
    per_channel = [bias.meta["val"].shape[0]] + [1] * (node.meta["val"].dim() - 2)

    def build(add: Callable[..., torch.fx.Node]) -> torch.fx.Node:
        bare = add(aten.convolution.default, (*node.args[:2], None, *node.args[3:]))
        return add(aten.add.Tensor, (bare, add(aten.view.default, (bias, per_channel))))

    return replace_if_same_layout(graph, node, build, fake_mode)
