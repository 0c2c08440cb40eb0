"""Lowering: PyTorch programs → Wrapper IR programs."""

from wrapgen.lowering.capture import CapturedGraph, capture, is_aten_graph
from wrapgen.lowering.graph_lowering import GraphLowering
from wrapgen.lowering.lower import lower_captured

__all__ = ["CapturedGraph", "GraphLowering", "capture", "is_aten_graph", "lower_captured"]
