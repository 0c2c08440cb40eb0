"""sympy index expressions → Triton (Python syntax on block tensors).

Index expressions address memory, so they are non-negative and `//` / `%` (Triton's
truncating integer division and remainder) agree with floor division there. A
subexpression without loop variables that is not a bare symbol or an integer (a product
of sizes, a Max, ...) is computed on the host and passed in: `hoist` names it.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing, PythonMod
from torch.utils._sympy.functions import Mod as TorchMod


class UnprintableIndex(ValueError):
    """An index expression uses a function the Triton printer does not know."""


def is_loop_var(s: sympy.Symbol) -> bool:
    name = str(s)
    return name[:1] in ("x", "r") and name[1:].isdigit()


def triton_index(
    expr: object,
    name_of: Callable[[sympy.Symbol], str],
    hoist: Callable[[sympy.Expr], str],
    is_loop: Callable[[sympy.Symbol], bool] = is_loop_var,
) -> str:
    """Triton source for an integer expression; `is_loop` tells loop variables (block tensors)
    from size symbols (kernel parameters)."""
    e = sympy.sympify(expr)

    def go(e: sympy.Basic) -> str:
        if isinstance(e, sympy.Integer):
            return f"({int(e)})" if int(e) < 0 else str(int(e))
        if isinstance(e, sympy.Symbol):
            return name_of(e)
        if not any(is_loop(s) for s in e.free_symbols):
            return hoist(e)
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(go(t) for t in sorted(e.args, key=sympy.default_sort_key)) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(go(t) for t in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([go(e.base)] * int(e.exp)) + ")"
        if isinstance(e, FloorDiv):
            return f"({go(e.args[0])} // {go(e.args[1])})"
        if isinstance(e, CeilDiv):
            return f"(({go(e.args[0])} + {go(e.args[1])} - 1) // {go(e.args[1])})"
        if isinstance(e, ModularIndexing):
            base, divisor, modulus = e.args
            inner = go(base) if divisor == 1 else f"({go(base)} // {go(divisor)})"
            return f"({inner} % {go(modulus)})"
        if isinstance(e, (sympy.Mod, PythonMod, TorchMod)):
            return f"({go(e.args[0])} % {go(e.args[1])})"
        if isinstance(e, (sympy.Max, sympy.Min)) or type(e).__name__ in ("Max", "Min"):
            fn = "tl.maximum" if "Max" in type(e).__name__ else "tl.minimum"
            text = go(e.args[0])
            for a in e.args[1:]:
                text = f"{fn}({text}, {go(a)})"
            return text
        raise UnprintableIndex(f"cannot print index expression {e} ({type(e).__name__}) for Triton")

    return go(e)
