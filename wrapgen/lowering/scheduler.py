"""Fuse compute nodes into kernels: explicit `can_fuse` and `score_fusion`, greedy in program order.

A group iterates `rows` (kept dimensions, variables x*) and, when it holds a reduction,
`reduced` (variables r*). Members are rewritten into the group's variables and tagged with
the level they run at: "row" (once per row), "inner" (once per element of a row, inside a
reduction loop) or "reduction". Reductions are never duplicated: each is one member of
exactly one group, and consumers read its value.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import sympy

from wrapgen.loop_ir import ComputeNode, FusionGroup, Load, Member, node_loads, red_vars, row_vars, substitute

Shape = tuple[sympy.Expr, ...]
# permutations of at most this many outer dimensions are tried (5! = 120 at rank 6)
_MAX_PERMUTED_RANK = 6


def _squeezed(shape: Shape) -> list[sympy.Expr]:
    return [s for s in shape if sympy.sympify(s) != 1]


def _squeeze_map(shape: Shape, target: Shape) -> dict | None:
    """Map a `shape` tensor's x-variables onto a `target` tensor's, ignoring size-1 dims."""
    if _squeezed(shape) != _squeezed(target):
        return None
    mine = [d for d, s in enumerate(shape) if sympy.sympify(s) != 1]
    theirs = [d for d, s in enumerate(target) if sympy.sympify(s) != 1]
    xs, ys = row_vars(len(shape)), row_vars(len(target))
    mapping = {xs[d]: sympy.Integer(0) for d in range(len(shape))}
    mapping.update({xs[a]: ys[b] for a, b in zip(mine, theirs)})
    return mapping


def _mapped(node: ComputeNode, mapping: dict) -> ComputeNode:
    return replace(
        node,
        body=substitute(node.body, mapping),
        store_index=sympy.expand(sympy.sympify(node.store_index).xreplace(mapping)),
        store_indirect=tuple(replace(i, value=substitute(i.value, mapping)) for i in node.store_indirect),
    )


def start_group(node: ComputeNode) -> FusionGroup:
    if node.reduction is None:
        return FusionGroup(node.rows, members=[Member(node, "row")])
    return FusionGroup(node.rows, node.reduced, node.source_sizes, node.source_index, [Member(node, "reduction")])


def can_fuse(group: FusionGroup, node: ComputeNode) -> tuple[FusionGroup, Member] | None:
    """The group extended by `node` (and `node` as a member), or None when they cannot share loops.

    Pointwise fuses with pointwise of the same shape (size-1 dims aside), into a reduction
    group at row level (the reduced shape) or inner level (the shape being reduced); a
    reduction joins a group over the same rows and reduced sizes, or takes in a pointwise
    group over the shape it reduces. Every read of a member's result must be of the very
    element the member computes at that point of the loop.
    """
    new_group = group
    if node.reduction is None:
        mapping = _squeeze_map(node.rows, group.rows)
        if mapping is not None:
            member = Member(_mapped(node, mapping), "row")
        elif group.reduced:
            member = _inner_member(group, node)
            if member is None:
                return None
        else:
            return None
    elif group.reduced:
        if list(node.rows) != list(group.rows) or list(node.reduced) != list(group.reduced):
            return None
        member = Member(node, "reduction")
    else:
        if list(group.rows) != list(node.source_sizes):
            return None
        mapping = dict(zip(row_vars(len(group.rows)), node.source_index))
        members = [Member(_mapped(m.node, mapping), "inner") for m in group.members]
        new_group = FusionGroup(node.rows, node.reduced, node.source_sizes, node.source_index, members)
        member = Member(node, "reduction")
    if not _reads_match(new_group, member):
        return None
    return FusionGroup(new_group.rows, new_group.reduced, new_group.source_sizes, new_group.source_index,
                       [*new_group.members, member]), member


def _inner_member(group: FusionGroup, node: ComputeNode) -> Member | None:
    """`node`, a pointwise node over the shape `group` reduces, as an inner member of it: in the
    reduced shape's order, or else with its outer dimensions permuted (sizes that repeat leave
    several orders; the one whose reads match is taken); None when neither reads what it should."""
    if list(node.rows) == list(group.source_sizes):
        member = Member(_mapped(node, dict(zip(row_vars(len(node.rows)), group.source_index))), "inner")
        if _reads_match(group, member):
            return member
    return _row_permuted_inner(group, node)


def _row_permuted_inner(group: FusionGroup, node: ComputeNode) -> Member | None:
    """`node` as an inner member of a reduction group whose reduced shape it iterates with its
    outer dimensions permuted (its innermost one kept innermost, so its stores stay contiguous),
    or None. A layer norm read only by a copy into a transposed layout (`nn.MultiheadAttention`
    moving batch-first tokens to sequence-first before its projection, as aot_autograd traces
    it) was a kernel for the statistics and another that normalized while copying; each row of
    the copy is a row of the norm, so the norm's kernel can store its rows where the copy puts them."""
    sizes, source = [sympy.sympify(s) for s in node.rows], [sympy.sympify(s) for s in group.source_sizes]
    if len(sizes) < 3 or len(sizes) != len(source) or sorted(sizes, key=str) != sorted(source, key=str):
        return None
    if sizes[-1] != source[-1] or len(sizes) > _MAX_PERMUTED_RANK:
        return None
    xs = row_vars(len(sizes))
    for order in itertools.permutations(range(len(sizes) - 1)):
        if list(order) == list(range(len(sizes) - 1)) or any(sizes[i] != source[d] for i, d in enumerate(order)):
            continue
        mapping = {xs[i]: group.source_index[d] for i, d in enumerate(order)}
        mapping[xs[-1]] = group.source_index[-1]
        member = Member(_mapped(node, mapping), "inner")
        if _reads_match(group, member) and _reads_a_member(group, member):
            return member
    return None


def _reads_a_member(group: FusionGroup, member: Member) -> bool:
    """Whether `member` reads a result of the group (so joining it saves that result's round trip)."""
    return any(group.member(load.buffer) is not None for load in node_loads(member.node))


def _reads_match(group: FusionGroup, member: Member) -> bool:
    unit = unit_vars(group)
    for load in node_loads(member.node):
        producer = group.member(load.buffer)
        if producer is None:
            continue
        if producer.level == "inner" and member.level == "row":
            return False
        if load.indirect:  # a gather (or a checked copy of an index) reads the buffer in memory
            return False
        if sympy.expand((load.index - producer.node.store_index).xreplace(unit)) != 0:
            return False
    return True


def unit_vars(group: FusionGroup) -> dict[sympy.Symbol, sympy.Integer]:
    """The group's loop variables over a size-1 dimension, as 0: they take no other value. A
    buffer's store index keeps a term for such a dimension (32768*x0 in [1, 32, 1024]) that a
    read of it may drop; the two still name one element (a Llama-style model's residual sum
    and the RMS norm reducing it were two kernels for want of this)."""
    unit = {x: sympy.Integer(0) for x, n in zip(row_vars(len(group.rows)), group.rows) if sympy.sympify(n) == 1}
    unit.update({r: sympy.Integer(0) for r, n in zip(red_vars(len(group.reduced)), group.reduced) if sympy.sympify(n) == 1})
    return unit


def score_fusion(group: FusionGroup, node: ComputeNode) -> int:
    """Memory traffic a fusion saves, in reads: loads of the group's results, plus inputs shared."""
    produced = group.names()
    group_inputs = {ld.buffer for m in group.members for ld in node_loads(m.node)}
    score = 1
    for load in node_loads(node):
        if load.buffer in produced:
            score += 4
        elif load.buffer in group_inputs:
            score += 1
    return score


def schedule(
    nodes: list[ComputeNode], position: dict[str, int], readers: dict[str, list[int]],
    unrelated_reductions: bool = True, blocked: Callable[[FusionGroup, Member], bool] | None = None,
    unrelated_streams: int | None = None,
) -> list[FusionGroup]:
    """Greedy fusion in program order.

    A group runs where its last member was; `node` (at `position[node]`) may join a group
    only if nothing outside the group that reads a member runs before `node`'s position
    (`readers`: line positions of other readers of each buffer, kernels' markers included).
    Without `unrelated_reductions`, a reduction joins a group holding a reduction only if it
    reads something the group reads or makes: on a GPU, reductions sharing nothing gain no
    parallelism from one kernel (each program runs them one after another over the same
    grid), and the group would keep the inputs of its first ones alive until its last; a
    GPT-2 backward fused its 25 layer norms' weight gradients into one kernel that took 400 µs.
    With `unrelated_streams`, a node that shares nothing with a group joins it only while the group
    reads and writes at most that many buffers: a CPU core's prefetchers follow a few dozen streams,
    and an SGD step over ten equal-shaped parameters fused into one loop of 30 streams ran at half
    the bandwidth of ten loops of three (the kernel-launch cost this fusion saves on a GPU is a
    function call on the CPU).
    `blocked(extended_group, member)` vetoes a fusion that would reorder accesses of state written in
    place (mutation.py's `StateOrder`).
    """
    groups: list[FusionGroup] = []
    for node in nodes:
        here = position[node.name]
        best: tuple[int, int, FusionGroup] | None = None
        for index, group in enumerate(groups):
            if any(p < here for m in group.members for p in readers.get(m.node.name, ()) if p != here and p not in _member_positions(group, position)):
                continue
            fused = can_fuse(group, node)
            if fused is None or blocked is not None and blocked(*fused):
                continue
            score = score_fusion(group, node)
            if score == 1 and not unrelated_reductions and node.reduction is not None and _holds_reduction(group):
                continue
            if score == 1 and unrelated_streams is not None and _streams(fused[0]) > unrelated_streams:
                continue
            if best is None or (score, index) > (best[0], best[1]):
                best = (score, index, fused[0])
        if best is None:
            groups.append(start_group(node))
        else:
            groups[best[1]] = best[2]
    return groups


def cluster_members(group: FusionGroup, root: Callable[[str], str] = lambda name: name) -> FusionGroup:
    """A pointwise group's members reordered so that each independent part runs to its end before
    the next starts, and the parts' sizes noted (`FusionGroup.parts`: a Triton kernel runs each part
    on its own blocks); the order among members that touch a common produced or written storage
    (`root` maps a view to its storage) is kept, so every data dependence and every read/write order
    of state holds.

    A horizontally fused optimizer step (one kernel updating twelve equal-shaped parameters) had its
    members in the graph's order: each parameter's new value, then every moment's write-back at the
    end. Each thread then held 24 values live across the whole kernel, which spilled; per-parameter
    order keeps a handful live and ran the step's kernels at full bandwidth."""
    if group.reduced or len(group.members) < 2:
        return group
    ordered = {root(m.node.buffer) for m in group.members} | {root(m.node.name) for m in group.members}
    parent = list(range(len(group.members)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, m in enumerate(group.members):
        touched = {root(m.node.name), root(m.node.buffer)} | {root(ld.buffer) for ld in node_loads(m.node)}
        for key in touched & ordered:
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    components: dict[int, list[Member]] = {}  # by root, in order of each component's first member
    for i, m in enumerate(group.members):
        components.setdefault(find(i), []).append(m)
    if len(components) == 1:
        return group
    runs = list(components.values())
    return replace(group, members=[m for ms in runs for m in ms], parts=tuple(len(ms) for ms in runs))


def _streams(group: FusionGroup) -> int:
    """Distinct buffers a group reads from memory or stores (its own results read back excluded)."""
    produced = group.names()
    read = {ld.buffer for m in group.members for ld in node_loads(m.node)} - produced
    return len(read | {m.node.buffer for m in group.members})


def _holds_reduction(group: FusionGroup) -> bool:
    return any(m.level == "reduction" for m in group.members)


def _member_positions(group: FusionGroup, position: dict[str, int]) -> set[int]:
    return {position[m.node.name] for m in group.members}


__all__ = ["FusionGroup", "Member", "can_fuse", "cluster_members", "score_fusion", "schedule", "start_group", "unit_vars", "Load"]
