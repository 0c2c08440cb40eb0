"""Multi-kernel reductions in the lowering: a Triton reduction over a symbolic row length becomes
a MultiKernelCall among its looped kernel and one persistent kernel per row bucket
(`kernels/triton/multi_kernel.py`), keyed on the row length's power-of-two bucket, when
`config.multi_kernel` is on. Every target then times the candidates of a bucket once."""

from __future__ import annotations

import sympy

from wrapgen import config
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition, WrapperLine
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall
from wrapgen.wrapper_ir.values import TensorRef


def with_reduction_variants(lowering, group, call: KernelCall, definitions: list[WrapperLine], needed: set[str],
                            dtypes: dict, hints: dict, aligned: set[str]) -> WrapperLine:
    """`call`, or a MultiKernelCall among it and its persistent variants (whose definitions are
    appended to `definitions`)."""
    if not config.multi_kernel or lowering.language != "triton":
        return call
    from wrapgen.kernels.triton.multi_kernel import reduction_variants

    rnumel, variants = reduction_variants(group, call.kernel, needed, dtypes, hints, aligned, lowering.device.type)
    if rnumel is None or not variants:
        return call
    defined = {line.name for line in definitions if isinstance(line, KernelDefinition)}
    candidates = [KernelCall(call.kernel, call.args, call.grid, call.writes)]
    serves: list[int | None] = [None]
    for rblock, kernel in variants:
        for expr in kernel.host_exprs:
            if expr not in lowering.call_symbols:
                lowering.call_symbols[expr] = sympy.Symbol(lowering.fresh("ks"), integer=True)
        args = tuple(TensorRef(t) for t in kernel.tensors) + tuple(lowering.call_symbols.get(e, e) for e in kernel.scalars)
        if kernel.name not in defined:
            metadata = (("device", str(lowering.device)), *((k, v) for k, v in kernel.metadata if k != "device"))
            definitions.append(KernelDefinition(kernel.name, "triton", kernel.source, metadata))
            defined.add(kernel.name)
        candidates.append(KernelCall(kernel.name, args, kernel.grid, tuple(kernel.written)))
        serves.append(rblock)
    key = (lowering.call_symbols.get(rnumel, rnumel),)
    return MultiKernelCall(f"mk_{call.kernel}", tuple(candidates), key, "multi_kernel", True, tuple(serves))
