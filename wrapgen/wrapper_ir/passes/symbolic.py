"""Comparisons of size expressions that must hold for every value of the size symbols."""

from __future__ import annotations

import sympy


def provably_nonnegative(expr: sympy.Expr) -> bool:
    """True when `expr` >= 0 for every value of its (positive integer) size symbols."""
    expr = sympy.expand(sympy.sympify(expr))
    if expr.is_number:
        return bool(expr >= 0)
    return bool(expr.is_nonnegative)


def provably_le(a: sympy.Expr, b: sympy.Expr) -> bool:
    """a <= b for every value of the symbols."""
    return provably_nonnegative(sympy.sympify(b) - sympy.sympify(a))
