"""Rewrites of the captured graph before lowering, as ordered lists of passes.

`ATEN_PASSES` rewrite the ATen graph that `lower_captured` lowers, in this order; `TRACED_PASSES`
rewrite the torch-level graph dynamo hands the backend, before aot_autograd traces it (so the
backward it derives sees the rewrite too). Each pass is one module here; `pipeline.run_passes`
runs a list (and, with `config.debug_dir`, dumps the graph after each pass that changed it).
`copy_only_clones` rewrites the joint forward-backward graph, before the dynamo backend's
partitioner splits it (`dynamo._partition`).

The decomposition tables torch applies while capturing stay with capture
(`lowering/decompositions.py`), and the per-node decisions taken while lowering (constant
folding, out= variants, library result layouts) with the lowering.
"""

from __future__ import annotations

import torch.fx

from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.graph_passes.accumulate_into_add import accumulate_into_add
from wrapgen.lowering.graph_passes.addmm_bias import bias_into_readers
from wrapgen.lowering.graph_passes.attention_broadcast import expand_broadcast_attention, expand_traced_attention
from wrapgen.lowering.graph_passes.attention_masks import contiguous_traced_masks, float_attention_masks
from wrapgen.lowering.graph_passes.broadcast_bmm import fold_broadcast_bmm
from wrapgen.lowering.graph_passes.common_subexpressions import eliminate_common_subexpressions
from wrapgen.lowering.graph_passes.constant_masks import drop_constant_masks
from wrapgen.lowering.graph_passes.conv_bias import conv_bias_into_readers
from wrapgen.lowering.graph_passes.conv_layout import channels_last_convolutions, propagate_input_layouts
from wrapgen.lowering.graph_passes.cpu_scalars import cpu_scalars_as_numbers
from wrapgen.lowering.graph_passes.dead_code import remove_dead_code
from wrapgen.lowering.graph_passes.inplace_ops import split_inplace_ops
from wrapgen.lowering.graph_passes.input_free import fold_input_free_values
from wrapgen.lowering.graph_passes.pipeline import GraphPass, run_passes
from wrapgen.lowering.graph_passes.product_weights import kmajor_product_weights
from wrapgen.lowering.graph_passes.reinplace import scatter_in_place
from wrapgen.lowering.graph_passes.state_write_order import order_state_writes
from wrapgen.lowering.graph_passes.traced_masks import drop_traced_masks
from wrapgen.lowering.graph_passes.transposed_operands import copy_matmul_operands_in_order
from wrapgen.lowering.kernel_lowering import kernel_device, kernel_language


def _kernel_device_type(captured: CapturedGraph) -> str | None:
    """The type of the device the graph's generated kernels run on; None when no kernel
    language serves it (its ops stay library calls)."""
    device = kernel_device(captured.graph_module.graph)
    return device.type if kernel_language(device) is not None else None


def _scatter_in_place(captured: CapturedGraph) -> CapturedGraph:
    return scatter_in_place(captured) if _kernel_device_type(captured) is not None else captured


def _cpu_scalars_as_numbers(captured: CapturedGraph) -> CapturedGraph:
    device_type = _kernel_device_type(captured)
    return cpu_scalars_as_numbers(captured, device_type) if device_type is not None else captured


def _split_inplace_ops(captured: CapturedGraph) -> CapturedGraph:
    device_type = _kernel_device_type(captured)
    return split_inplace_ops(captured, device_type) if device_type is not None else captured


def _drop_traced_masks(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    drop_traced_masks(gm)  # in place
    return gm


def _expand_traced_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    expand_traced_attention(gm)  # in place
    return gm


def _contiguous_traced_masks(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    contiguous_traced_masks(gm)  # in place
    return gm


ATEN_PASSES: tuple[GraphPass, ...] = (
    # a backward whose saved activations the forward returned channels-last: re-traced at those
    # strides (always: the forward has already chosen them)
    GraphPass("input_layouts", (), propagate_input_layouts),
    # repeated pure calls (a decoder's per-layer mask conversion) computed once
    GraphPass("common_subexpressions", (), eliminate_common_subexpressions),
    # 0-dim CPU tensors of known value (DeBERTa's scales) read by kernels as numbers: a CUDA
    # kernel cannot read a CPU tensor
    GraphPass("cpu_scalars", ("kernels",), _cpu_scalars_as_numbers),
    # 2-d convolutions on CUDA (and in CPU training steps) read and write NHWC
    GraphPass("conv_layout", ("layout_optimization",), channels_last_convolutions),
    # bmm against one broadcast matrix: one mm
    GraphPass("broadcast_bmm", (), fold_broadcast_bmm),
    # a + (rows accumulated into zeros): rows accumulated into a
    GraphPass("accumulate_into_add", (), accumulate_into_add),
    # masks that mask nothing are dropped, exactly the causal mask becomes is_causal
    GraphPass("constant_masks", ("constant_masks",), drop_constant_masks),
    # a key/value broadcast against the query (multi-query attention) expanded, so SDPA's fused
    # backends take the call instead of its math backend
    GraphPass("attention_broadcast", (), expand_broadcast_attention),
    # a transposed copy made only for a matrix product: made in its source's order instead
    GraphPass("transposed_operands", (), copy_matmul_operands_in_order),
    # The rest only with generated kernels: they pay when their work fuses into one.
    # owned CPU weights read only by products of a few rows: K-major, summed down columns
    GraphPass("product_weights", ("kernels",), kmajor_product_weights),
    # CUDA addmm read only by pointwise ops: mm, its bias added by the kernel reading it
    GraphPass("addmm_bias", ("kernels", "bias_in_kernels"), bias_into_readers),
    # CUDA convolution read only by generated kernels: no bias, added by the kernels reading it
    GraphPass("conv_bias", ("kernels", "bias_in_kernels"), conv_bias_into_readers),
    # on a device with a kernel language: a KV-cache update writes the cache's new rows only
    GraphPass("reinplace", ("kernels",), _scatter_in_place),
    # on a device with a kernel language: _foreach_ and in-place ops as loops + copy_
    GraphPass("inplace_ops", ("kernels",), _split_inplace_ops),
    # write-backs of state other updates read by broadcast (step counters) after those updates
    GraphPass("state_write_order", ("kernels",), order_state_writes),
    # boolean SDPA masks as float masks, made once by a generated kernel
    GraphPass("attention_masks", ("kernels",), float_attention_masks),
    # values computed from no input and no weight (a position index built in forward) computed
    # once; last, so the passes above still see how a mask or an index was built
    GraphPass("input_free", (), fold_input_free_values),
    # values nothing reads (what the folds above left behind): no kernel, no launch
    GraphPass("dead_code", (), remove_dead_code),
)

TRACED_PASSES: tuple[GraphPass, ...] = (
    # constant attention masks in dynamo's graph: dropped or is_causal, in forward and backward
    GraphPass("traced_masks", ("constant_masks",), _drop_traced_masks),
    # broadcast keys/values expanded before torch picks the attention backend while tracing
    GraphPass("traced_attention_broadcast", (), _expand_traced_attention),
    # masks with strided keys made contiguous before torch picks the attention backend
    GraphPass("traced_attention_masks", (), _contiguous_traced_masks),
)

__all__ = ["ATEN_PASSES", "TRACED_PASSES", "GraphPass", "run_passes"]
