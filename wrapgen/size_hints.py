"""max_autotune with dynamic sizes: the example's sizes run measured kernels, other sizes the library.

A GEMM template is chosen by measuring candidates on the product's real sizes, so a product
whose sizes are symbols has nothing to measure and stays a library call in the dynamic
program. When `max_autotune` is on and a dynamic program kept such products, `wrapgen.compile`
also compiles the model static at the example's sizes (the size hints): there every product
is measured and, where a template wins, runs it with its epilogue fused. A call whose tensors
have exactly the example's shapes, strides, dtypes and devices (and whose other inputs equal
the example's) runs that program; every other call runs the dynamic program, whose products
are library calls: nothing runs a template at sizes it was not measured at.

Under `torch.compile(..., dynamic=True)` the same holds per aot_autograd graph: the graph is
traced again at its placeholders' size hints (`aten_graph_at_hints`) and compiled static beside
the dynamic one (wrapgen/dynamo.py).
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


def aten_graph_at_hints(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[object]] | None:
    """`gm` (an aot_autograd graph with symbolic sizes) traced again with every size symbol at its
    hint, and the example it was traced at (fake tensors and ints, for `ExampleSizeProgram`);
    None if a size has no hint (data-dependent) or a placeholder holds a value of another kind."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()  # no shape environment: every size it sees is a plain int
    example: list[object] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            sizes, strides = _hints(value.shape), _hints(value.stride())
            if sizes is None or strides is None:
                return None
            with mode:
                example.append(torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device))
        elif isinstance(value, torch.SymInt):
            hinted = _hints([value])
            if hinted is None:
                return None
            example.append(hinted[0])
        elif isinstance(value, int) or value is None:
            example.append(value)
        else:
            return None
    static = make_fx(gm, tracing_mode="fake")(*example)
    for node, value in zip((n for n in static.graph.nodes if n.op == "placeholder"), example):
        if not isinstance(value, torch.Tensor):
            node.meta["val"] = value  # make_fx records values for tensors only; a size input is an int here
    return static, example


def _hints(values: Sequence[object]) -> list[int] | None:
    """The sizes' values at their hints; None if one has none (an unbacked symbol)."""
    hinted = []
    for value in values:
        if isinstance(value, torch.SymInt):
            hint = value.node.hint
            if hint is None:
                return None
            value = hint
        hinted.append(int(value))  # type: ignore[call-overload]
    return hinted


def flat_example(example_inputs: Sequence[object]) -> list[object]:
    """The example inputs flattened the way a call's arguments are (positional, no keywords)."""
    return pytree.tree_leaves((tuple(example_inputs), {}))
