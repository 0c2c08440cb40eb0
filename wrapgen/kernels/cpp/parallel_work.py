"""The work a C++ kernel's OpenMP decision weighs: its elements, each costly function weighted.

A kernel runs its rows in parallel once its work reaches codegen.PARALLEL_THRESHOLD. Counted in
elements alone, a GELU backward over 16384 floats (an `erff` and an `expf` per element: 23 us on
one core) ran serially while an add over 32768 ran in parallel. Measured on a 2-core EPYC, per
call: the GELU backward over 8192-16384 elements takes 30-35% less time in parallel, a softmax
over 64 rows of 128 29% less, while over 2048 elements the fork and join (about 2.5 us) outweighs
the gain, as it does for an add over 16384: cheap kernels keep their threshold.
"""

from __future__ import annotations

import sympy

from wrapgen.kernels.cpp.epilogue_tiles import COSTLY
from wrapgen.loop_ir import Apply, FusionGroup, walk

COSTLY_WEIGHT = 4  # work of one costly function (erf, exp, tanh, ...) per element, beyond the element's own


def costly_per_element(group: FusionGroup) -> int:
    """Costly functions the group's bodies apply per element."""
    return sum(isinstance(node, Apply) and node.op in COSTLY for m in group.members for node in walk(m.node.body))


def weighted_work(group: FusionGroup) -> tuple[sympy.Expr, int]:
    """Elements of the group's iteration space, and each one's weight: 1 + COSTLY_WEIGHT × its
    costly functions."""
    elements = sympy.Mul(*group.rows, *group.reduced) if (group.rows or group.reduced) else sympy.Integer(1)
    return elements, 1 + COSTLY_WEIGHT * costly_per_element(group)
