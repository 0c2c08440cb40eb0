"""A sum over a dimension of a one-hot value, folded to the one element it picks.

Cross entropy's backward scatters -1 into zeros at each row's target (`where(t == r, -1, 0)`,
loop_ops/scatters.py) and log_softmax's backward sums that gradient over the vocabulary. As a
reduction the sum read the whole row, a vocabulary's worth of compares and adds per row (GPT-J's
small training step: 62 rows of 1024, ~70-100 µs of the 2-core VM's step), to find the one term
that is not zero. Summed over r, `where(e == r, a, 0) * m` with e, a and m independent of r is
`a * m` when 0 <= e < R and 0 otherwise; the other R - 1 terms are `0 * m`, which is 0 unless m is
infinite or NaN, so `0 * m` is added to keep eager's NaN. The fold is a pointwise value, fused
into its reader like any other.
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.loop_ir import Apply, Body, Const, IndexValue, Load, LoopValue, compute_dtype, loop_var, row_vars, walk


def fold_one_hot_sum(value: LoopValue, dims: tuple[int, ...], keepdim: bool, kind: str,
                     dtype: torch.dtype) -> LoopValue | None:
    """`value` summed over `dims` into a `dtype` result, as a pointwise value, where the sum has
    one nonzero term per row whose position a value independent of the reduced index picks;
    else None."""
    if kind != "sum" or len(dims) != 1 or value.body.dtype != compute_dtype(dtype) or not dtype.is_floating_point:
        return None
    d, sizes = dims[0], value.sizes
    length = sizes[d]
    if not (length.is_Integer and length >= 2):  # one term: nothing to fold, and 0 * m would differ
        return None
    marker = loop_var("r", 0)
    kept = [k for k in range(len(sizes)) if k != d]
    out_vars = row_vars(len(sizes) if keepdim else len(kept))
    index = tuple(marker if k == d else out_vars[k if keepdim else kept.index(k)] for k in range(len(sizes)))
    folded = _fold(value.at(index), marker, length)
    if folded is None:
        return None
    out_sizes = tuple(sympy.Integer(1) if k == d else s for k, s in enumerate(sizes)) if keepdim else tuple(sizes[k] for k in kept)
    return LoopValue(out_sizes, folded, dtype)


def _fold(body: Body, r: sympy.Symbol, length: sympy.Expr) -> Body | None:
    """sum over r in [0, length) of `body`, without r, or None where body is no one-hot term."""
    factor: Body | None = None
    chosen = body
    if isinstance(body, Apply) and body.op == "mul" and len(body.args) == 2:
        picks = [i for i, a in enumerate(body.args) if _one_hot(a)]
        if not picks:
            return None
        chosen, factor = body.args[picks[0]], body.args[1 - picks[0]]
    if not _one_hot(chosen):
        return None
    assert isinstance(chosen, Apply)
    condition, taken, _ = chosen.args
    picked = _picked(condition, r)
    if picked is None or _reads(taken, r) or (factor is not None and _reads(factor, r)):
        return None
    int64 = torch.int64
    inside = Apply("and", (Apply("ge", (picked, IndexValue(sympy.Integer(0), int64)), torch.bool),
                           Apply("lt", (picked, IndexValue(length, int64)), torch.bool)), torch.bool)
    dtype = body.dtype
    term = taken if factor is None else Apply("mul", (taken, factor) if body.args[0] is chosen else (factor, taken), dtype)
    total: Body = Apply("where", (inside, term, Const(0.0, dtype)), dtype)
    if factor is not None:  # the other terms, 0 * m: NaN where m is infinite or NaN, as in eager
        total = Apply("add", (total, Apply("mul", (Const(0.0, dtype), factor), dtype)), dtype)
    return total


def _one_hot(body: Body) -> bool:
    """`where(condition, a, 0)` with a floating zero."""
    return (isinstance(body, Apply) and body.op == "where" and isinstance(body.args[2], Const)
            and body.args[2].value == 0 and body.dtype.is_floating_point)


def _picked(condition: Body, r: sympy.Symbol) -> Body | None:
    """e where `condition` is the integer compare `e == r` (either side) and e does not read r."""
    if not (isinstance(condition, Apply) and condition.op == "eq" and len(condition.args) == 2):
        return None
    for index, other in (condition.args, condition.args[::-1]):
        integral = not index.dtype.is_floating_point and index.dtype != torch.bool
        if (isinstance(index, IndexValue) and index.expr == r and integral and not other.dtype.is_floating_point
                and other.dtype != torch.bool and not _reads(other, r)):
            return other
    return None


def _reads(body: Body, r: sympy.Symbol) -> bool:
    """Whether any index of `body` (loads, index values, gathered positions) uses `r`."""
    for node in walk(body):
        if isinstance(node, Load) and r in sympy.sympify(node.index).free_symbols:
            return True
        if isinstance(node, IndexValue) and r in sympy.sympify(node.expr).free_symbols:
            return True
    return False
