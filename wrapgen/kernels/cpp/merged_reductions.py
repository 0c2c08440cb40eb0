"""Adjacent reduced dimensions that every index walks as one, merged into one loop.

A reduction over several dimensions (a spatial mean over (H, W) of an NCHW activation, a layer
norm over its last two dimensions) is a loop nest whose SIMD loop is only the innermost
dimension long (7 or 28 elements for a CNN's feature map): most of its time goes to loop
overhead and to the vector accumulator's fold at the end of each short inner loop. Where every
index in the kernel reads the two dimensions as one run of memory (the outer one's coefficient
is the inner one's extent times the inner one's coefficient, everywhere), they are one loop of
their product's length: r_i, r_{i+1} -> r_i * E + r_{i+1}. The row-major position within the
reduced dimensions (what argmax returns) is the same in both forms.
"""

from __future__ import annotations

import dataclasses

import sympy

from wrapgen.loop_ir import (
    ComputeNode,
    FusionGroup,
    IndexValue,
    Load,
    Member,
    red_vars,
    substitute,
    walk,
)


def merge_reduced(group: FusionGroup) -> FusionGroup:
    """`group` with every mergeable pair of adjacent static reduced dimensions merged (the same
    group where none is)."""
    while len(group.reduced) > 1:
        indices = _indices(group)
        if indices is None:
            break
        pair = next((i for i in range(len(group.reduced) - 1) if _mergeable(group, indices, i)), None)
        if pair is None:
            break
        group = _merge(group, pair)
    return group


def _indices(group: FusionGroup) -> list[sympy.Expr] | None:
    """Every index expression of the group, or None where one is data-dependent."""
    found: list[sympy.Expr] = []
    for m in group.members:
        if m.node.store_indirect:
            return None
        found.append(sympy.sympify(m.node.store_index))
        for body in walk(m.node.body):
            if isinstance(body, Load):
                if body.indirect:
                    return None
                found.append(sympy.sympify(body.index))
            elif isinstance(body, IndexValue):
                found.append(sympy.sympify(body.expr))
    return found


def _mergeable(group: FusionGroup, indices: list[sympy.Expr], i: int) -> bool:
    """Whether reduced dimensions i and i + 1 are static and every one of the group's `indices`
    is linear in them with the outer coefficient the inner one's times the inner extent."""
    outer_extent, inner_extent = (sympy.sympify(e) for e in group.reduced[i:i + 2])
    if not (outer_extent.is_Integer and inner_extent.is_Integer):
        return False
    outer, inner = red_vars(len(group.reduced))[i:i + 2]
    for index in indices:
        a, b = index.diff(outer), index.diff(inner)
        if a.free_symbols & {outer, inner} or b.free_symbols & {outer, inner} or a.has(sympy.Derivative, sympy.Subs) \
                or b.has(sympy.Derivative, sympy.Subs):
            return False  # not linear in them (a floor division or modulo of one)
        if (index - a * outer - b * inner).free_symbols & {outer, inner}:
            return False
        if sympy.expand(a - inner_extent * b) != 0:
            return False
    return True


def _merge(group: FusionGroup, i: int) -> FusionGroup:
    rs = red_vars(len(group.reduced))
    # r_i's part of each index is r_i * E * (r_{i+1}'s coefficient): r_{i+1} becomes the merged
    # position and r_i drops out; later variables move down one
    mapping = {rs[i]: sympy.Integer(0), rs[i + 1]: rs[i]}
    mapping.update({rs[j]: rs[j - 1] for j in range(i + 2, len(rs))})
    reduced = (*group.reduced[:i], sympy.Integer(group.reduced[i] * group.reduced[i + 1]), *group.reduced[i + 2:])

    def node(n: ComputeNode) -> ComputeNode:
        store = sympy.expand(sympy.sympify(n.store_index).xreplace(mapping))
        return dataclasses.replace(n, body=substitute(n.body, mapping), store_index=store,
                                   reduced=reduced if n.reduced else n.reduced)

    members = [Member(node(m.node), m.level) for m in group.members]
    return dataclasses.replace(group, reduced=reduced, members=members)
