"""Multi-kernel reductions: the persistent variants of a Triton reduction whose row length is
a size symbol. `codegen.py` makes such a reduction looped (a loop over RBLOCK chunks), which
is right for long rows; short rows are faster persistent (the row in registers, read once).
This module generates, beside the looped kernel, one persistent kernel per power-of-two row
bucket (RBLOCK = the bucket, so it serves every row length in it); the lowering puts them in
a MultiKernelCall that times the candidates of a bucket once and keeps the fastest
(Inductor's MultiKernelCall, PR 156158, does the same per size hint).
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.triton.codegen import TritonKernelCodegen
from wrapgen.kernels.triton.launch_config import LaunchConfig, next_pow2

# Row buckets that get a persistent variant: shorter rows keep the looped kernel alone (it is
# one masked chunk), longer ones would hold too much in registers.
PERSISTENT_BUCKETS = tuple(2**k for k in range(4, 15))  # 16 .. 16384


def persistent_config(xnumel: sympy.Expr, rblock: int, hints: dict) -> LaunchConfig:
    """The launch shape a persistent reduction of RBLOCK `rblock` gets (as for static rows)."""
    x = int(sympy.sympify(xnumel).xreplace(hints)) if hints is not None else 1
    xblock = max(1, min(next_pow2(max(x, 1)), 4096 // rblock, 64))
    return LaunchConfig(xblock, rblock, max(1, min(16, xblock * rblock // 256)), True)


def reduction_variants(group, name: str, needed: set[str], dtypes: dict[str, torch.dtype], hints: dict,
                       aligned: set[str], device_type: str) -> tuple[sympy.Expr | None, list[tuple[int, GeneratedKernel]]]:
    """(row length, [(bucket, persistent kernel)]) for a reduction over a symbolic row length;
    (None, []) for anything else."""
    probe = TritonKernelCodegen(group, name, needed, dtypes, hints, aligned, device_type)
    if not probe.reduction or probe.rnumel is None or probe.rnumel.is_Integer:
        return None, []
    variants = []
    for rblock in PERSISTENT_BUCKETS:
        codegen = TritonKernelCodegen(group, f"{name}_p{rblock}", needed, dtypes, hints, aligned, device_type)
        codegen.config = persistent_config(codegen.xnumel, rblock, hints)
        variants.append((rblock, codegen.generate()))
    return probe.rnumel, variants
