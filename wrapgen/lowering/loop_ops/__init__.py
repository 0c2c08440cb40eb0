"""ATen ops → loop bodies: pointwise ops, broadcasts, views (as index remapping), constants,
gathers, small matmuls and reductions (plus the softmax / log_softmax / layer_norm / var /
vector-norm decompositions), one module per family.

Each lowering takes a `LoopContext` (which turns fx arguments into `LoopValue`s and
materializes reductions) and the fx node, and returns a `LoopValue` (or a tuple of them).
`supported(node)` says up front whether an op has a lowering for these arguments; an op
without one stays a library call. Importing this package registers every family.
"""

from wrapgen.lowering.loop_ops import (  # noqa: F401 (they register)
    gathers,
    index_put,
    indexing,
    matmul,
    norms,
    padding,
    pointwise,
    pooling,
    reductions,
    scatters,
    ternary,
    views,
)
from wrapgen.lowering.loop_ops.common import LOWERINGS, VIEW_OPS, LoopContext, op_key, supported
from wrapgen.lowering.loop_ops.reductions import BASIC_NORM_ORDERS, norm_order

__all__ = ["BASIC_NORM_ORDERS", "LOWERINGS", "VIEW_OPS", "LoopContext", "norm_order", "op_key", "supported"]
