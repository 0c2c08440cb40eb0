"""`index_put(self, [index], values, accumulate=True)` on a 2-d `self` as a generated C++ kernel:
the embedding backward (core ATen decomposes `embedding_dense_backward` into it).

As a library call it is a fill of zeros, a copy of them (the functional op clones `self`), and
the library's accumulate; here the starting values are a fused kernel of their own (zeros cost
one write) and a generated kernel adds each values row into the row its index names (see
kernels/cpp/index_put.py: serial over the index, parallel over columns, so duplicates
accumulate deterministically). The result is the buffer the rows were added into.

It is a push, not a loop body (each output element gathers from a data-dependent set of
inputs), so it is two lines of its own rather than a fused value. Only the C++ kernel language
has it (`CPP_ONLY`): on Triton it stays a library call, as it does with symbolic sizes, other
dtypes, several index tensors or `accumulate=False`.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Load, LoopValue, is_loop_var, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, fake, out_fake, register
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition
from wrapgen.wrapper_ir.values import TensorRef

CPP_ONLY = frozenset({"aten::index_put.default"})
_VALUE_DTYPES = (torch.float32, torch.float64)


def _static(shape: object) -> bool:
    return all(isinstance(s, int) for s in shape)


def _index_put_check(node: torch.fx.Node) -> bool:
    base, values, indices = fake(node.args[0]), fake(node.args[2]), node.args[1]
    if arg(node, 3, "accumulate", False) is not True or not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return False
    index = fake(indices[0]) if isinstance(indices[0], torch.fx.Node) else None
    if not all(isinstance(t, torch.Tensor) for t in (base, values, index)):
        return False
    if base.dim() != 2 or base.dtype not in _VALUE_DTYPES or values.dtype != base.dtype or base.device.type != "cpu":
        return False
    if index.dtype not in (torch.int64, torch.int32) or index.numel() == 0:
        return False
    if not all(_static(t.shape) for t in (base, values, index)):
        return False
    return tuple(values.shape) == (*index.shape, base.shape[1]) and out_fake(node).dtype == base.dtype


@register("aten::index_put.default", check=_index_put_check)
def _index_put(ctx: LoopContext, node: torch.fx.Node) -> object:
    """The starting values computed into the result's buffer, then the accumulate kernel's call,
    which writes that buffer in place. Returns the buffer (not a loop value: its elements are
    final only after the call)."""
    from wrapgen.kernels.cpp.index_put import IndexPutAccumulate, generate_index_put

    out = out_fake(node)
    buffer = ctx.realize(ctx.value(node.args[0]), out, "index_put")
    target = ctx.load(buffer)
    index_node, values_node = node.args[1][0], node.args[2]
    index, values = _plain(ctx, index_node), _plain(ctx, values_node)
    row, column = sympy.Symbol("row", integer=True), sympy.Symbol("j", integer=True)
    rank = len(index.sizes)
    last = row_vars(rank + 1)[rank]
    spec = IndexPutAccumulate(
        out=target.body.buffer, index=index.body.buffer, values=values.body.buffer,
        index_sizes=tuple(int(s) for s in index.sizes), rows=int(target.sizes[0]), columns=int(target.sizes[1]),
        index_at=index.body.index,
        values_at=sympy.sympify(values.body.index).xreplace({last: column}),
        out_at=sympy.sympify(target.body.index).xreplace(dict(zip(row_vars(2), (row, column)))),
        dtype=out.dtype, index_dtype=fake(index_node).dtype,
    )
    name = ctx.fresh("cpp_index_put_")
    kernel = generate_index_put(spec, name)
    ctx.lines.append(KernelDefinition(name, "cpp", kernel.source, kernel.metadata))
    ctx.lines.append(KernelCall(name, tuple(TensorRef(t) for t in kernel.tensors), (), kernel.written))
    return buffer


def _plain(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """`node`'s value as a load of a buffer whose index uses loop variables only (a buffer whose
    layout a library call chose has run-time strides: it is copied into one of ours first)."""
    value = ctx.in_memory(node)
    body = value.body
    assert isinstance(body, Load)
    if all(is_loop_var(s) for s in sympy.sympify(body.index).free_symbols):
        return value
    return ctx.load(ctx.realize(value, fake(node), "index_put"))
