"""What each reduction kind means in a generated Triton kernel: its accumulator type and
identity, how a block combines across the reduced axis, and how the result is finished.

A mixin of `TritonKernelCodegen`, which drives the persistent and looped passes and provides
`tmp`, `var_axes`, `helpers`, `_block` and `needs_rmask`.
"""

from __future__ import annotations

import math

import torch

from wrapgen.kernels.triton.ops import ARG_REDUCTIONS, SourceWriter, compute_tl, literal
from wrapgen.loop_ir import Member, compute_dtype


class ReductionRenderer:
    def _reduce_nothing(self, m: Member, var: str, w: SourceWriter) -> str:
        """A reduction over no dimensions (e.g. of a 0-dim tensor): each element is its own result."""
        kind = m.node.reduction
        if kind in ARG_REDUCTIONS:
            text = f"tl.zeros_like({var}).to(tl.int64)"
        elif kind in ("any", "all"):
            text = f"({var} != 0)"
        elif compute_dtype(m.node.body.dtype) != compute_dtype(m.node.dtype):
            text = f"{var}.to({compute_tl(m.node.dtype)})"
        else:
            return var
        name = self.tmp()
        w.line(f"{name} = {text}")
        self.var_axes[name] = self.var_axes.get(var, frozenset())
        return name

    def _reduce_input(self, m: Member, var: str, level_mask: bool) -> str:
        """The value to accumulate, in the accumulator type, with masked lanes at the identity."""
        acc_t = self._acc_dtype(m)
        v = self._block(var, m.node.body.dtype, "inner")
        if m.node.reduction in ("any", "all"):
            v = f"({v} != 0).to(tl.int8)"
        elif compute_dtype(m.node.body.dtype) != acc_t:
            v = f"{v}.to({compute_tl(acc_t)})"
        if level_mask and self.needs_rmask:
            v = f"tl.where(rmask, {v}, {self._identity(m)})"
        return v

    def _acc_dtype(self, m: Member) -> torch.dtype:
        """Float sums accumulate in their own type (float32 for half data, whose reductions
        have float32 results); integer sums in int64; max/min in the values' compute type."""
        kind, dtype = m.node.reduction, m.node.dtype
        if kind in ARG_REDUCTIONS:
            return compute_dtype(m.node.body.dtype)  # the best value so far; its index is tracked beside it
        if kind in ("any", "all"):
            return torch.int8
        if kind in ("sum", "prod"):
            return compute_dtype(dtype) if dtype.is_floating_point else torch.int64
        return compute_dtype(m.node.body.dtype)

    def _identity(self, m: Member) -> str:
        return f"tl.full([], {self._identity_literal(m)}, {compute_tl(self._acc_dtype(m))})"

    def _identity_literal(self, m: Member) -> str:
        acc = self._acc_dtype(m)
        kind = m.node.reduction
        if kind == "sum" or kind == "any":
            value: object = 0
        elif kind == "prod" or kind == "all":
            value = 1
        elif acc.is_floating_point:
            value = -math.inf if kind in ("max", "argmax") else math.inf
        elif acc == torch.bool:
            value = kind == "min"
        else:
            info = torch.iinfo(acc)
            value = info.min if kind in ("max", "argmax") else info.max
        return literal(value, acc)

    def _combine_across(self, m: Member, v: str) -> str:
        """Reduce a [XBLOCK, RBLOCK] block over the reduced axis to [XBLOCK, 1]."""
        kind, acc = m.node.reduction, self._acc_dtype(m)
        if kind == "sum":
            text = f"tl.sum({v}, 1)"
        elif kind == "prod":
            self.helpers.add("_wg_prod")
            text = f"tl.reduce({v}, 1, _wg_prod)"
        elif kind in ("max", "min") and acc.is_floating_point:
            fn = "_wg_maximum" if kind == "max" else "_wg_minimum"
            self.helpers.add(fn)
            text = f"tl.reduce({v}, 1, {fn})"
        elif kind in ("max", "any"):
            text = f"tl.max({v}, 1)"
        else:
            text = f"tl.min({v}, 1)"
        return f"{text}[:, None]"

    def _elementwise_extreme(self, m: Member, acc: str, update: str) -> str:
        largest = m.node.reduction in ("max", "any")
        if self._acc_dtype(m).is_floating_point:
            fn = "_wg_maximum" if largest else "_wg_minimum"
            self.helpers.add(fn)
            return f"{fn}({acc}, {update})"
        return f"tl.{'maximum' if largest else 'minimum'}({acc}, {update})"

    def _finalize(self, m: Member, reduced: str) -> str:
        if m.node.reduction in ("any", "all"):
            return f"({reduced} != 0)"
        if self._acc_dtype(m) != compute_dtype(m.node.dtype):
            return f"{reduced}.to({compute_tl(m.node.dtype)})"
        return reduced

    def _arg_reduce(self, m: Member, values: str, indices: str) -> str:
        """The winning index of a [XBLOCK, RBLOCK] block of (value, index) pairs, as [XBLOCK, 1]."""
        self.helpers.add(f"_wg_{m.node.reduction}")
        return f"tl.reduce(({values}, {indices}), 1, _wg_{m.node.reduction})[1][:, None]"

    def _online_update(self, maximum: str, total: str, update: str, w: SourceWriter) -> None:
        """One step of the online `sum(exp(v - max(v)))` (see `wrapgen.kernels.online_softmax`):
        per lane, the largest value so far and the sum of exp relative to it. A lane that has
        seen only -inf (or masked) values keeps a zero sum, where exp(-inf - -inf) is NaN."""
        self.helpers.add("_wg_maximum")
        value, grown, scale, term = self.tmp(), self.tmp(), self.tmp(), self.tmp()
        w.line(f"{value} = {update}")
        w.line(f"{grown} = _wg_maximum({maximum}, {value})")
        w.line(f"{scale} = tl.where({grown} == {maximum}, 1.0, tl.exp({maximum} - {grown}))")
        w.line(f"{term} = tl.where({grown} == float('-inf'), 0.0, tl.exp({value} - {grown}))")
        w.line(f"{total} = {total} * {scale} + {term}")
        w.line(f"{maximum} = {grown}")

    def _online_finish(self, maximum: str, total: str, max_out: str, sum_out: str, w: SourceWriter) -> None:
        """The row's maximum and sum from the lanes' [XBLOCK, RBLOCK] (max, sum) pairs, as [XBLOCK, 1].
        A row of -inf values gets a NaN sum, as the two-pass form gives (exp(-inf - -inf))."""
        self.helpers.add("_wg_maximum")
        w.line(f"{max_out} = tl.reduce({maximum}, 1, _wg_maximum)[:, None]")
        scaled = f"{total} * tl.where({maximum} == {max_out}, 1.0, tl.exp({maximum} - {max_out}))"
        w.line(f"{sum_out} = tl.sum({scaled}, 1)[:, None]")
        w.line(f"{sum_out} = tl.where(({max_out} == float('-inf')) & (rnumel > 0), float('nan'), {sum_out})")
