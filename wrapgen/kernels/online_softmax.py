"""One pass instead of two for `sum(exp(v - max(v)))`, the denominator of softmax and log-sum-exp.

A looped reduction reads its rows once per pass. Softmax and cross-entropy compute the row's
maximum in one pass and the sum of `exp(v - max)` in the next, so a row too long to keep in
registers (a language model's vocabulary) is read from memory twice. The online form keeps, per
lane, the largest value seen and the sum relative to it, rescaling the sum when the largest value
grows; the row's maximum and sum are combined from the lanes at the end. This module finds the
pairs of passes where that applies; the kernel language emits the combined loop.
"""

from __future__ import annotations

import torch

from wrapgen.kernels.segments import Item
from wrapgen.loop_ir import Apply, Body, Load, Member, compute_dtype, free_cast, loads, node_loads


def merge_online_softmax(items: list[Item], stored: set[str]) -> tuple[list[Item], dict[str, str], set[str]]:
    """`items` with each (max pass, sum-of-exp pass) pair merged into one pass; the merged sums,
    {sum member: max member}; and the inner members that only fed them (`v - max`, its exp),
    which the merged pass does not compute. A pair merges only when the second pass uses the
    first's reductions in nothing but `sum(exp(v - max))`, where `v` is what the maximum was
    taken of, and every value in between is read by that sum alone and not stored. Row values
    between the passes (a copy of the maximum) follow the merged pass."""
    inner = {m.node.name: m.node.body for _, ms in items for m in ms if m.level == "inner"}
    out: list[Item] = []
    partners: dict[str, str] = {}
    deferred: set[str] = set()
    i = 0
    while i < len(items):
        kind, members = items[i]
        j = i + 1
        while j < len(items) and items[j][0] == "row":
            j += 1
        if kind == "segment" and j < len(items):
            rows = {m.node.name: m.node.body for _, ms in items[i + 1:j] for m in ms}
            found, feeding = _pairs(members, items[j][1], inner, rows, stored)
            if found:
                partners.update(found)
                deferred |= feeding
                out.append(("segment", members + items[j][1]))
                out.extend(items[i + 1:j])
                i = j + 1
                continue
        out.append((kind, members))
        i += 1
    return out, partners, deferred


def _pairs(first: list[Member], second: list[Member], inner: dict[str, Body], rows: dict[str, Body],
           stored: set[str]) -> tuple[dict[str, str], set[str]]:
    reductions = {m.node.name: m for m in first if m.level == "reduction"}
    tainted = [m for m in second if _reads(m.node.body, set(reductions) | set(rows), second)]
    sums = [m for m in tainted if m.level == "reduction"]
    feeding = [m for m in tainted if m.level == "inner"]
    if not sums or any(m.node.name in stored for m in feeding):
        return {}, set()
    found: dict[str, str] = {}
    for s in sums:
        maximum = _matched_max(s, reductions, inner | rows)
        if maximum is None or maximum in found.values():
            return {}, set()
        found[s.node.name] = maximum
    names = {m.node.name for m in feeding}
    for m in second:  # what feeds a merged sum feeds nothing else in its pass
        if m.node.name not in found and any(ld.buffer in names for ld in node_loads(m.node)):
            return {}, set()
    return found, names


def _matched_max(s: Member, reductions: dict[str, Member], values: dict[str, Body]) -> str | None:
    """The maximum `s` is `sum(exp(v - max))` of, `values` resolving the inner and row values
    it reads; None when it is not of that form."""
    if s.node.reduction != "sum" or _acc(s) != torch.float32:
        return None
    body = _strip(_resolve(s.node.body, values))
    if not (isinstance(body, Apply) and body.op == "exp"):
        return None
    arg = _strip(body.args[0])
    if not (isinstance(arg, Apply) and arg.op == "sub"):
        return None
    value, subtrahend = (_strip(a) for a in arg.args)
    if not isinstance(subtrahend, Load) or subtrahend.buffer not in reductions:
        return None
    m = reductions[subtrahend.buffer]
    if m.node.reduction != "max" or _acc(m) != torch.float32:
        return None
    if _strip(_resolve(m.node.body, values)) != value:
        return None
    return m.node.name


def _acc(m: Member) -> torch.dtype:
    """The accumulator type the kernel languages use: a sum's result type, a maximum's value type."""
    return compute_dtype(m.node.dtype if m.node.reduction == "sum" else m.node.body.dtype)


def _strip(body: Body) -> Body:
    while free_cast(body):
        body = body.args[0]
    return body


def _resolve(body: Body, values: dict[str, Body]) -> Body:
    """`body` with every load of a member in `values` replaced by that member's body."""
    if isinstance(body, Load) and not body.indirect and body.buffer in values:
        return _resolve(values[body.buffer], values)
    if isinstance(body, Apply):
        return Apply(body.op, tuple(_resolve(a, values) for a in body.args), body.dtype)
    return body


def _reads(body: Body, names: set[str], members: list[Member]) -> bool:
    """Whether `body` reads one of `names`, directly or through inner members of `members`."""
    by_name = {m.node.name: m for m in members if m.level == "inner"}
    pending, seen = [body], set()
    while pending:
        for ld in loads(pending.pop()):
            if ld.buffer in names:
                return True
            if ld.buffer in by_name and ld.buffer not in seen:
                seen.add(ld.buffer)
                pending.append(by_name[ld.buffer].node.body)
    return False
