"""Integer (size) expressions as FX nodes: each distinct sympy expression becomes nodes once
per graph, and every later use of it — an allocation's size, a kernel's argument, a launch
grid — refers to the same node.

Nodes use Python operators (`operator.add`, `operator.floordiv`, ...), `torch.sym_min` /
`torch.sym_max` and `math` rounding, so any FX consumer can read or re-trace them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import sympy
import torch
import torch.fx
from torch.utils._sympy import functions as F

Value = int | float | bool | torch.fx.Node


class ExpressionError(TypeError):
    """A sympy expression has no FX form here (the emitter names the line)."""


# Functions that yield floats; an expression containing one is not an integer expression.
_FLOAT_FUNCTIONS = (F.ToFloat, F.FloatTrueDiv, F.IntTrueDiv, F.FloatPow, F.TruncToFloat)


def is_integer_expression(expr: sympy.Basic) -> bool:
    """True unless `expr` involves floats (ToFloat, true division, float literals)."""
    if expr.has(sympy.Float):
        return False
    return not any(expr.has(fn) for fn in _FLOAT_FUNCTIONS)


class ExpressionNodes:
    """Builds FX nodes for sympy expressions over bound symbols, hash-consed per graph.

    `make_node(target, args, expr)` creates one call_function node (the emitter's hook, so it
    can name nodes and record which line needed them); `bind(symbol, value)` makes a symbol
    known.
    """

    def __init__(self, make_node: Callable[[Callable, tuple, sympy.Basic], torch.fx.Node]) -> None:
        self.make_node = make_node
        self.values: dict[sympy.Basic, Value] = {}

    def bind(self, symbol: sympy.Symbol, value: Value) -> None:
        self.values[symbol] = value

    def is_bound(self, symbol: sympy.Symbol) -> bool:
        return symbol in self.values

    def value(self, expr: object) -> Value:
        """An int/float/bool for a constant, else the node computing `expr`."""
        if isinstance(expr, bool):
            return expr
        if isinstance(expr, (int, float)):
            return expr
        if not isinstance(expr, sympy.Basic):
            raise ExpressionError(f"not an expression: {expr!r}")
        if isinstance(expr, sympy.logic.boolalg.BooleanAtom):
            return bool(expr)
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, (sympy.Float, sympy.Rational)):
            return float(expr)
        if expr in self.values:
            return self.values[expr]
        if isinstance(expr, sympy.Symbol):
            raise ExpressionError(f"symbol {expr} is used before it is bound")
        node = self._build(expr)
        self.values[expr] = node
        return node

    # -- one expression ------------------------------------------------------------------------
    def _call(self, target: Callable, args: tuple, expr: sympy.Basic) -> Value:
        return self.make_node(target, args, expr)

    def _build(self, expr: sympy.Basic) -> Value:
        if isinstance(expr, sympy.Add):
            return self._add(expr)
        if isinstance(expr, sympy.Mul):
            return self._mul(expr)
        if isinstance(expr, (sympy.Pow, F.PowByNatural, F.FloatPow)):
            return self._pow(expr)
        if isinstance(expr, (F.Min, F.Max, sympy.Min, sympy.Max)):
            target = torch.sym_min if isinstance(expr, (F.Min, sympy.Min)) else torch.sym_max
            args = [self.value(a) for a in expr.args]
            result = args[0]
            for arg in args[1:]:
                result = self._call(target, (result, arg), expr)
            return result
        handler = _BINARY.get(type(expr)) or _UNARY.get(type(expr))
        if handler is not None:
            return self._call(handler, tuple(self.value(a) for a in expr.args), expr)
        if isinstance(expr, F.CeilDiv):
            # ceil(a / b) == -(a // -b) for integers.
            a, b = (self.value(x) for x in expr.args)
            negated = -b if isinstance(b, int) else self._call(operator.neg, (b,), expr)
            return self._call(operator.neg, (self._call(operator.floordiv, (a, negated), expr),), expr)
        if isinstance(expr, F.ModularIndexing):
            base, divisor, modulus = (self.value(x) for x in expr.args)
            quotient = base if divisor == 1 else self._call(operator.floordiv, (base, divisor), expr)
            return self._call(operator.mod, (quotient, modulus), expr)
        if isinstance(expr, (sympy.And, sympy.Or)):
            target = operator.and_ if isinstance(expr, sympy.And) else operator.or_
            args = [self.value(a) for a in expr.args]
            result = args[0]
            for arg in args[1:]:
                result = self._call(target, (result, arg), expr)
            return result
        if isinstance(expr, F.Identity):
            return self.value(expr.args[0])
        raise ExpressionError(f"no FX form for {type(expr).__name__} in {expr}")

    def _add(self, expr: sympy.Add) -> Value:
        positive = [t for t in expr.as_ordered_terms() if not t.could_extract_minus_sign()]
        negative = [-t for t in expr.as_ordered_terms() if t.could_extract_minus_sign()]
        if not positive:
            return self._call(operator.neg, (self.value(-expr),), expr)
        result = self.value(positive[0])
        for term in positive[1:]:
            result = self._call(operator.add, (result, self.value(term)), expr)
        for term in negative:
            result = self._call(operator.sub, (result, self.value(term)), expr)
        return result

    def _mul(self, expr: sympy.Mul) -> Value:
        coefficient, rest = expr.as_coeff_Mul()
        if coefficient == -1:
            return self._call(operator.neg, (self.value(rest),), expr)
        numerator, denominator = sympy.fraction(expr)
        if denominator != 1:
            divide = operator.floordiv if is_integer_expression(expr) else operator.truediv
            return self._call(divide, (self.value(numerator), self.value(denominator)), expr)
        if coefficient != 1 and rest != 1:
            return self._call(operator.mul, (self.value(rest), self.value(coefficient)), expr)
        factors = list(expr.as_ordered_factors())
        result = self.value(factors[0])
        for factor in factors[1:]:
            result = self._call(operator.mul, (result, self.value(factor)), expr)
        return result

    def _pow(self, expr: sympy.Basic) -> Value:
        base, exponent = expr.args
        if isinstance(expr, sympy.Pow) and exponent == -1:
            return self._call(operator.truediv, (1, self.value(base)), expr)
        return self._call(operator.pow, (self.value(base), self.value(exponent)), expr)


_BINARY: dict[type, Callable] = {
    F.FloorDiv: operator.floordiv,
    F.CleanDiv: operator.floordiv,
    F.PythonMod: operator.mod,
    F.Mod: operator.mod,
    sympy.Mod: operator.mod,
    F.IntTrueDiv: operator.truediv,
    F.FloatTrueDiv: operator.truediv,
    F.LShift: operator.lshift,
    F.RShift: operator.rshift,
    # Conditions (runtime assertions on data-dependent sizes).
    sympy.Eq: operator.eq,
    sympy.Ne: operator.ne,
    sympy.Lt: operator.lt,
    sympy.Le: operator.le,
    sympy.Gt: operator.gt,
    sympy.Ge: operator.ge,
}

_UNARY: dict[type, Callable] = {
    F.ToFloat: float,
    F.TruncToInt: math.trunc,
    F.FloorToInt: math.floor,
    F.CeilToInt: math.ceil,
    sympy.floor: math.floor,
    sympy.ceiling: math.ceil,
    F.RoundToInt: round,
    sympy.Abs: abs,
    sympy.Not: operator.not_,
}


__all__ = ["ExpressionError", "ExpressionNodes", "Value", "is_integer_expression"]
