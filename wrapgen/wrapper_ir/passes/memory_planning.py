"""The memory-planning step: apply the configured mode and record the peak estimate."""

from __future__ import annotations

from dataclasses import replace

from wrapgen.wrapper_ir.passes.peak_memory import peak_memory
from wrapgen.wrapper_ir.passes.pooling import pool_buffers
from wrapgen.wrapper_ir.passes.reuse import reuse_buffers
from wrapgen.wrapper_ir.program import Program

MODES = {"none": lambda program: program, "reuse": reuse_buffers, "pooled": pool_buffers}


def plan_memory(program: Program, mode: str) -> Program:
    """Plan buffers with `mode` (none / reuse / pooled); the peak estimate joins the metadata."""
    try:
        planner = MODES[mode]
    except KeyError:
        raise ValueError(f"memory planning mode must be one of {', '.join(MODES)}, got {mode!r}") from None
    planned = planner(program)
    metadata = tuple((k, v) for k, v in planned.metadata if k not in ("memory planning", "peak memory (bytes)"))
    metadata += (("memory planning", mode), ("peak memory (bytes)", peak_memory(planned)))
    return replace(planned, metadata=metadata)
