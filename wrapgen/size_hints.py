"""max_autotune with dynamic sizes: the example's sizes run measured kernels, other sizes the library.

A GEMM template is chosen by measuring candidates on the product's real sizes, so a product
whose sizes are symbols has nothing to measure and stays a library call in the dynamic
program. When `max_autotune` is on and a dynamic program kept such products, `wrapgen.compile`
also compiles the model static at the example's sizes (the size hints): there every product
is measured and, where a template wins, runs it with its epilogue fused. A call whose tensors
have exactly the example's shapes, strides, dtypes and devices (and whose other inputs equal
the example's) runs that program; every other call runs the dynamic program, whose products
are library calls: nothing runs a template at sizes it was not measured at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from wrapgen.lowering.gemm_templates import GEMM_OPS
from wrapgen.wrapper_ir.lines import ExternKernel
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorRef, TensorType


def symbolic_products(program: Program) -> list[ExternKernel]:
    """The program's library matrix products whose output has a size symbol (none measured)."""
    types = program.value_types()
    found = []
    for line in program.lines:
        if isinstance(line, ExternKernel) and line.op in GEMM_OPS:
            out = dict(line.kwargs).get("out")
            known = types.get(out.name) if isinstance(out, TensorRef) else None
            if isinstance(known, TensorType) and any(sympy.sympify(s).free_symbols for s in known.sizes):
                found.append(line)
    return found


class ExampleSizeProgram:
    """A program compiled static at the example's sizes, and the test of whether a call has them."""

    def __init__(self, function: Any, example: Sequence[object]) -> None:
        self.function = function  # a CompiledFunction, called like the model
        self._tensors = tuple(
            (i, tuple(v.shape), v.stride(), v.dtype, v.device) for i, v in enumerate(example) if isinstance(v, torch.Tensor)
        )
        self._others = tuple((i, v) for i, v in enumerate(example) if not isinstance(v, torch.Tensor))
        self._count = len(example)

    def matches(self, flat: Sequence[object]) -> bool:
        """Whether a call's flat inputs are the example's layout (and its non-tensor values)."""
        if len(flat) != self._count:
            return False
        for i, shape, stride, dtype, device in self._tensors:
            value = flat[i]
            if not isinstance(value, torch.Tensor) or value.shape != shape or value.stride() != stride:
                return False
            if value.dtype != dtype or value.device != device:
                return False
        return all(type(flat[i]) is type(v) and flat[i] == v for i, v in self._others)


def flat_example(example_inputs: Sequence[object]) -> list[object]:
    """The example inputs flattened the way a call's arguments are (positional, no keywords)."""
    return pytree.tree_leaves((tuple(example_inputs), {}))
