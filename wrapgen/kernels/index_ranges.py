"""Integer bounds of a gathered position, where its loop body proves them.

A gather's position is checked against its dimension in every kernel (an index out of range
raises, as eager's does). Where the body that computes the position clamps it into range
itself, the check can never fail: DeBERTa-v2's relative positions are `clamp(bucket(i - j) +
span, 0, 2 * span - 1)` before each gather, and the checks kept both its gathers' kernels in
Triton's debug mode (a device assert per element) where Inductor's bounds analysis drops them.
Only integer arithmetic is trusted: a float clamp keeps a NaN, which no integer bound holds.
"""

from __future__ import annotations

import math

import sympy
import torch

from wrapgen.loop_ir import Apply, Body, Const, IndexValue

Bounds = tuple[float, float]  # inclusive; +-inf where unknown
UNKNOWN: Bounds = (-math.inf, math.inf)

_INTEGER = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})


def bounds(body: Body) -> Bounds:
    """Inclusive bounds every value of `body` lies within (UNKNOWN where it cannot tell)."""
    if body.dtype not in _INTEGER:
        return UNKNOWN
    if isinstance(body, Const):
        return (int(body.value), int(body.value))
    if isinstance(body, IndexValue):
        return UNKNOWN  # a loop variable's range is not known here
    if not isinstance(body, Apply):
        return UNKNOWN  # data
    args = [bounds(a) for a in body.args]
    if body.op in ("clamp_min", "maximum"):
        return (max(args[0][0], args[1][0]), max(args[0][1], args[1][1]))
    if body.op in ("clamp_max", "minimum"):
        return (min(args[0][0], args[1][0]), min(args[0][1], args[1][1]))
    if body.op == "where":
        return (min(args[1][0], args[2][0]), max(args[1][1], args[2][1]))
    if body.op == "add":
        return (args[0][0] + args[1][0], args[0][1] + args[1][1])
    if body.op == "cast" and body.args[0].dtype in _INTEGER and _holds(body.dtype, args[0]):
        return args[0]
    return UNKNOWN


def _holds(dtype: torch.dtype, value: Bounds) -> bool:
    info = torch.iinfo(dtype)
    return info.min <= value[0] and value[1] <= info.max


def always_inside(body: Body, size: object) -> bool:
    """Whether every value of `body` is a valid position along a dimension of `size` elements."""
    size = sympy.sympify(size)
    if not size.is_Integer:
        return False
    low, high = bounds(body)
    return low >= 0 and high < int(size)
