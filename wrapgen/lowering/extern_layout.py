"""Library results at the layout torch's meta function gives them.

A library call's result would otherwise be read at run-time strides, and views of it stay
library calls (`aten::view`, `aten::permute` on an attention output). The traced fake tensor
says which strides the op returns; the program takes those as the result's layout, so views
become `Reinterpret` lines and kernels index the result with constant strides. An
`EnsureStrides` line after the call keeps that correct where the real kernel lays its result
out otherwise (it copies then): a backend-dependent op such as attention may.
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.values import TensorType


def dense_at_hints(type_: TensorType, hints: dict) -> bool:
    """Non-overlapping and dense (some permutation of a contiguous layout), judged at the
    symbols' hints: the layouts a fresh copy can take."""
    if type_.strides is None:
        return False
    dims = []
    for stride, size in zip(type_.strides, type_.sizes):
        if sympy.sympify(size) == 1:
            continue
        dims.append((int(sympy.sympify(stride).xreplace(hints)), int(sympy.sympify(size).xreplace(hints)), stride, size))
    expected = sympy.Integer(1)
    for _, _, stride, size in sorted(dims, key=lambda d: (d[0], d[1])):
        if sympy.expand(sympy.sympify(stride) - expected) != 0:
            return False
        expected = expected * size
    return True


def expected_layout(lines: list, name: str, fake: object, type_: TensorType, hints: dict) -> bool:
    """Append an `EnsureStrides` line for library result `name` (whose traced value is `fake`)
    and return True when the program can take `type_`'s strides as its layout: a plain dense
    tensor whose sizes and strides hold no data-dependent symbol."""
    if not isinstance(fake, torch.Tensor) or fake.layout != torch.strided or fake.is_conj() or fake.is_neg():
        return False
    exprs = (*type_.sizes, *(type_.strides or ()))
    if any(str(s).startswith("u") for e in exprs for s in sympy.sympify(e).free_symbols):
        return False
    if not dense_at_hints(type_, hints):
        return False
    lines.append(EnsureStrides(name, type_.dtype, type_.device, type_.sizes, type_.strides))  # type: ignore[arg-type]
    return True
