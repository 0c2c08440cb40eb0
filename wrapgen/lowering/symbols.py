"""Size symbols: rename torch's shape-environment symbols and plan how to bind them from inputs."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from wrapgen.errors import LoweringError
from wrapgen.wrapper_ir.lines import OBSERVED, BindSymbol
from wrapgen.wrapper_ir.program import SymbolInfo


def make_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


class SymbolTable:
    """Maps shape-env symbols (s77, u3, ...) to the program's own (s0, s1, ...) in order of first use."""

    def __init__(self) -> None:
        self._renames: dict[sympy.Symbol, sympy.Symbol] = {}
        self._info: dict[sympy.Symbol, SymbolInfo] = {}

    def expr(self, value: object) -> sympy.Expr | int | float | bool:
        """A program expression for an int, SymInt, SymFloat or SymBool; plain values pass through."""
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            node = value.node
            expr = node.expr
            for symbol in sorted(expr.free_symbols, key=str):
                self._register(symbol, node.shape_env)
            renamed = expr.xreplace(self._renames)
            if isinstance(renamed, sympy.Integer):
                return int(renamed)
            return renamed
        return value

    def shape(self, values: object) -> tuple[sympy.Expr, ...]:
        return tuple(sympy.sympify(self.expr(v)) for v in values)

    def _register(self, symbol: sympy.Symbol, shape_env: object) -> None:
        if symbol in self._renames:
            return
        value_range = getattr(shape_env, "var_to_range", {}).get(symbol)
        low: int | None = 0
        high: int | None = None
        if value_range is not None:
            low = int(value_range.lower) if value_range.lower.is_Integer else None
            high = int(value_range.upper) if value_range.upper.is_Integer else None
        name = str(symbol)
        if name.startswith("zuf"):
            # a float read from tensor data (`x.max().item()`): no range, no size assumptions
            ours = sympy.Symbol(self._next_name("f"), real=True)
            low = high = None
        elif name.startswith("u"):
            # an int the program learns at run time (data-dependent size, `.item()`): only the
            # range torch proved for it, which may include negatives
            ours = sympy.Symbol(self._next_name("u"), integer=True, nonnegative=low is not None and low >= 0)
        else:
            ours = make_symbol(self._next_name("s"))
            low = max(low or 0, 0)
        self._renames[symbol] = ours
        hints = getattr(shape_env, "backed_var_to_val", None)  # torch >= 2.13 name
        if hints is None:
            hints = getattr(shape_env, "var_to_val", {})
        hint = hints.get(symbol)
        self._info[ours] = SymbolInfo(ours, int(hint) if hint is not None else 0, low, high)

    def _next_name(self, prefix: str) -> str:
        return f"{prefix}{sum(1 for s in self._renames.values() if str(s).startswith(prefix))}"

    def infos(self) -> tuple[SymbolInfo, ...]:
        return tuple(self._info.values())

    def info(self, symbol: sympy.Symbol) -> SymbolInfo:
        return self._info[symbol]


@dataclass(frozen=True)
class BindingSource:
    """Somewhere a symbol's value can be read at call time, and what it equals there."""

    source: str
    kind: str  # "size" | "stride" | "value"
    dim: int | None
    expr: sympy.Expr


def plan_bindings(sources: list[BindingSource], table: SymbolTable) -> list[BindSymbol]:
    """Choose, for every symbol, one source that determines it, given those bound before.

    Bare symbols bind directly; a source equal to `a*x + b` (integer a, b known) binds x by
    solving. Repeats until every symbol is bound, so input order does not matter.
    """
    wanted = [info.symbol for info in table.infos() if str(info.symbol).startswith("s")]
    bound: set[sympy.Symbol] = set()
    lines: list[BindSymbol] = []
    progress = True
    while progress and len(bound) < len(wanted):
        progress = False
        for prefer_bare in (True, False):
            for src in sources:
                unknown = [s for s in src.expr.free_symbols if s not in bound]
                if len(unknown) != 1:
                    continue
                symbol = unknown[0]
                if prefer_bare and src.expr != symbol:
                    continue
                solution = _solve_linear(src.expr, symbol)
                if solution is None:
                    continue
                info = table.info(symbol)
                lines.append(BindSymbol(symbol, src.source, src.kind, src.dim, solution, info.min, info.max))  # type: ignore[arg-type]
                bound.add(symbol)
                progress = True
            if progress:
                break
    missing = [str(s) for s in wanted if s not in bound]
    if missing:
        raise LoweringError(
            f"cannot determine size symbol(s) {', '.join(missing)} from the inputs' sizes, strides or values"
        )
    return lines


def _solve_linear(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr | None:
    """observed = a*symbol + b  ->  symbol = (observed - b) // a, for a nonzero integer a."""
    if expr == symbol:
        return OBSERVED
    try:
        poly = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:
        return None
    if poly.degree() != 1:
        return None
    a, b = poly.all_coeffs()
    if not (a.is_Integer and a != 0) or symbol in b.free_symbols:
        return None
    rest = OBSERVED - b
    return rest if a == 1 else FloorDiv(rest, a)
