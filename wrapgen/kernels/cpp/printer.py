"""sympy index expressions → C++ (int64_t arithmetic; floor division and modulo that are
correct for negative operands, through the prelude's wg_floordiv / wg_mod)."""

from __future__ import annotations

from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing, PythonMod
from torch.utils._sympy.functions import Mod as TorchMod


class UnprintableIndex(ValueError):
    """An index expression uses a function the C++ printer does not know."""


def cpp_index(
    expr: object,
    name_of: Callable[[sympy.Symbol], str] = str,
    hoist: Callable[[sympy.Expr], str] | None = None,
) -> str:
    """C++ source for an integer expression; `name_of` names each symbol. A subexpression the
    printer does not know (Max, ...) that uses no loop variable goes to `hoist`, which returns
    the name of a parameter the host computes."""
    e = sympy.sympify(expr)

    def go(e: sympy.Basic) -> str:
        if isinstance(e, sympy.Integer):
            v = int(e)
            return f"INT64_C({v})" if abs(v) >= 2**31 else (f"({v})" if v < 0 else str(v))
        if isinstance(e, sympy.Symbol):
            return name_of(e)
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            return "(" + " + ".join(go(t) for t in terms) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(go(t) for t in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([go(e.base)] * int(e.exp)) + ")"
        if isinstance(e, FloorDiv):
            return f"wg_floordiv({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, ModularIndexing):
            base, divisor, modulus = e.args
            inner = go(base) if divisor == 1 else f"wg_floordiv({go(base)}, {go(divisor)})"
            return f"wg_mod({inner}, {go(modulus)})"
        if isinstance(e, (sympy.Mod, PythonMod, TorchMod)):
            return f"wg_mod({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, (sympy.Max, sympy.Min)) or type(e).__name__ in ("Max", "Min"):
            # the prelude's by-value helpers: gcc vectorizes a load at a clamped index (cat's
            # branches) as a gather, but not when the clamp is std::min (by reference)
            fn = "wg_imax" if "Max" in type(e).__name__ else "wg_imin"
            text = go(e.args[0])
            for a in e.args[1:]:
                text = f"{fn}({text}, {go(a)})"
            return text
        if hoist is not None and not any(_loop_var(s) for s in e.free_symbols):
            return hoist(e)
        raise UnprintableIndex(f"cannot print index expression {e} ({type(e).__name__}) as C++")

    return go(e)


def _loop_var(s: sympy.Symbol) -> bool:
    name = str(s)
    return name[:1] in ("x", "r") and name[1:].isdigit()
