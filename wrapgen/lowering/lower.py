"""The lowering entry point: picks the lowering that `config.kernels` asks for.

It sits above both lowerings so that `graph_lowering` (library calls only) never has to know
about `kernel_lowering` (its subclass that generates fused kernels).
"""

from __future__ import annotations

from wrapgen import config
from wrapgen.lowering.accumulate_into_add import accumulate_into_add
from wrapgen.lowering.addmm_bias import bias_into_readers
from wrapgen.lowering.attention_masks import float_attention_masks
from wrapgen.lowering.broadcast_bmm import fold_broadcast_bmm
from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.constant_masks import drop_constant_masks
from wrapgen.lowering.conv_layout import channels_last_convolutions
from wrapgen.lowering.graph_lowering import GraphLowering
from wrapgen.lowering.inplace_ops import split_inplace_ops
from wrapgen.lowering.kernel_lowering import KernelGraphLowering, kernel_device, kernel_language
from wrapgen.lowering.reinplace import scatter_in_place
from wrapgen.wrapper_ir.program import Program


def lower_captured(captured: CapturedGraph, name: str = "forward") -> Program:
    """Lower with generated kernels when `config.kernels` is on, else to library calls only."""
    captured = channels_last_convolutions(captured)  # config.layout_optimization: NHWC convolutions
    captured = fold_broadcast_bmm(captured)  # bmm against one broadcast matrix: one mm
    captured = accumulate_into_add(captured)  # a + (rows accumulated into zeros): rows accumulated into a
    if config.constant_masks:  # masks that mask nothing, or exactly the causal mask
        captured = drop_constant_masks(captured)
    if config.kernels:
        # Only with kernels: the mask conversion and the bias add pay off when they fuse into a
        # generated kernel.
        if config.bias_in_kernels:
            captured = bias_into_readers(captured)  # CUDA addmm read only by pointwise ops: mm + add
        device = kernel_device(captured.graph_module.graph)
        if kernel_language(device) is not None:
            captured = scatter_in_place(captured)  # a KV-cache update writes the cache's new rows only
            captured = split_inplace_ops(captured, device.type)  # _foreach_ and in-place ops: loops + copy_
        return KernelGraphLowering(float_attention_masks(captured), name).lower()
    return GraphLowering(captured, name).lower()
