"""Small static matrix products (mm, addmm) as generated reductions, so their epilogue fuses."""

from __future__ import annotations

import sympy
import torch
import torch.fx

from wrapgen import config
from wrapgen.loop_ir import Apply, LoopValue, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, cast, fake, op_key, operand, out_fake, register

# A matrix product this small (at most config.matmul_kernel_limit multiply-adds, the reduced
# length at most SMALL_MATMUL_K) costs less as a generated reduction than as a library launch,
# and the pointwise work around it fuses into the same kernel: a chain of tiny layers becomes
# one kernel per layer.
SMALL_MATMUL_K = 256


def _static_shape(t: object) -> tuple[int, ...] | None:
    if not isinstance(t, torch.Tensor) or any(not isinstance(s, int) for s in t.shape):
        return None
    return tuple(t.shape)


def _small_matmul_check(node: torch.fx.Node) -> bool:
    addmm = op_key(node) == "aten::addmm.default"
    if addmm and (arg(node, 3, "beta", 1) != 1 or arg(node, 4, "alpha", 1) != 1):
        return False
    a, b = (fake(n) for n in (node.args[1:3] if addmm else node.args[:2]))
    shapes = [_static_shape(a), _static_shape(b), _static_shape(out_fake(node))]
    if any(s is None or len(s) != 2 for s in shapes) or out_fake(node).dtype not in (torch.float32, torch.float64):
        return False
    if a.dtype != b.dtype:
        return False
    (m, k), (_, n) = shapes[0], shapes[1]
    return 1 <= k <= SMALL_MATMUL_K and m * n * k <= config.matmul_kernel_limit


@register("aten::mm.default", "aten::addmm.default", check=_small_matmul_check)
def _small_matmul(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[i, j] = sum_k a[i, k] * b[k, j] (+ bias[i, j] for addmm), as a reduction over k."""
    out = out_fake(node)
    dtype = out.dtype
    addmm = op_key(node) == "aten::addmm.default"
    a_node, b_node = node.args[1:3] if addmm else node.args[:2]
    rows = ctx.shape(out.shape)
    k = sympy.Integer(fake(a_node).shape[1])
    i, j, r = row_vars(3)
    # each element of a is read n times and of b m times: compute them once, not per read
    a, b = ctx.computed_once(a_node), ctx.computed_once(b_node)
    product = Apply("mul", (cast(a.at((i, r)), dtype), cast(b.at((r, j)), dtype)), dtype)
    total = ctx.reduce(LoopValue((*rows, k), product, dtype), (2,), False, "sum", dtype, "mm")
    if not addmm:
        return total
    bias = operand(ctx, node.args[0], rows, dtype)
    return LoopValue(rows, Apply("add", (bias, total.body), dtype), dtype)
