"""A Triton helper in a module of its own: a user kernel calls it as `helpers.halve(x)`."""

from __future__ import annotations

import triton


@triton.jit
def halve(x):
    return x * 0.5
