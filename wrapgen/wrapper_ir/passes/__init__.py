"""Program-to-program transformations. Each returns a new Program and keeps it verifiable."""

from wrapgen.wrapper_ir.passes.finite_checks import add_finite_checks
from wrapgen.wrapper_ir.passes.graph_partition import partition_graphs
from wrapgen.wrapper_ir.passes.memory_planning import plan_memory
from wrapgen.wrapper_ir.passes.overlap import schedule_collectives
from wrapgen.wrapper_ir.passes.peak_memory import peak_memory
from wrapgen.wrapper_ir.passes.pooling import pool_buffers
from wrapgen.wrapper_ir.passes.reuse import reuse_buffers

__all__ = ["add_finite_checks", "partition_graphs", "peak_memory", "plan_memory", "pool_buffers", "reuse_buffers", "schedule_collectives"]
