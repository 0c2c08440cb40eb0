"""The lowering entry point: the graph passes, then the lowering that `config.kernels` asks for.

It sits above both lowerings so that `graph_lowering` (library calls only) never has to know
about `kernel_lowering` (its subclass that generates fused kernels).
"""

from __future__ import annotations

from wrapgen import config
from wrapgen.lowering.capture import CapturedGraph
from wrapgen.lowering.graph_lowering import GraphLowering
from wrapgen.lowering.graph_passes import ATEN_PASSES, run_passes
from wrapgen.lowering.kernel_lowering import KernelGraphLowering
from wrapgen.wrapper_ir.program import Program


def lower_captured(captured: CapturedGraph, name: str = "forward") -> Program:
    """Lower with generated kernels when `config.kernels` is on, else to library calls only."""
    captured = run_passes(ATEN_PASSES, captured, name)
    if config.kernels:
        return KernelGraphLowering(captured, name).lower()
    return GraphLowering(captured, name).lower()
