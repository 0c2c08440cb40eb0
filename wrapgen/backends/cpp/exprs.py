"""C++ spellings of Wrapper IR values: size expressions, dtype/device/layout codes, literals.

Size expressions print as int64_t arithmetic; floor division and modulo go through the
runtime header's `wg_floordiv` / `wg_mod` (Python semantics for negative operands).
"""

from __future__ import annotations

import json
import math

import sympy
import torch
from torch.utils._sympy import functions as SymF
from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing, PythonMod
from torch.utils._sympy.functions import Mod as TorchMod

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.bool: "bool",
    torch.complex32: "complex32",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
_LAYOUTS = {torch.strided: "strided", torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "contiguous_format",
    torch.preserve_format: "preserve_format",
    torch.channels_last: "channels_last",
    torch.channels_last_3d: "channels_last_3d",
}


class UnprintableExpr(ValueError):
    """A size expression uses a function the C++ printer does not know."""


def dtype_code(dtype: torch.dtype | int) -> str:
    """A C++ expression giving the shim's code for `dtype` (an int is a schema default, already
    the c10 code, which the shim's codes equal)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return str(dtype)
    try:
        return f"aoti_torch_dtype_{_DTYPES[dtype]}()"
    except KeyError:
        raise UnprintableExpr(f"dtype {dtype} has no code in the C shim") from None


def device_type_code(device: torch.device) -> str:
    if device.type not in ("cpu", "cuda", "meta", "xpu", "mps"):
        raise UnprintableExpr(f"device type {device.type!r} has no code in the C shim")
    return f"aoti_torch_device_type_{device.type}()"


def device_index(device: torch.device) -> int:
    """-1 for "any"/"current" (CPU has no index)."""
    if device.type == "cpu":
        return -1
    return 0 if device.index is None else device.index


def layout_code(layout: torch.layout | int) -> str:
    if isinstance(layout, int) and not isinstance(layout, bool):
        return str(layout)  # a schema default: the c10 code
    try:
        return f"aoti_torch_layout_{_LAYOUTS[layout]}()"
    except KeyError:
        raise UnprintableExpr(f"layout {layout} has no code in the C shim") from None


def memory_format_code(fmt: torch.memory_format | int) -> str:
    if isinstance(fmt, int) and not isinstance(fmt, bool):
        return str(fmt)  # a schema default: the c10 code
    try:
        return f"aoti_torch_memory_format_{_MEMORY_FORMATS[fmt]}()"
    except KeyError:
        raise UnprintableExpr(f"memory format {fmt} has no code in the C shim") from None


def cpp_string(text: str) -> str:
    """A C++ string literal for any text (JSON escaping is valid C++ for these escapes)."""
    return json.dumps(text).replace("?", "\\?")  # \? keeps trigraph-like sequences inert


def cpp_float(value: float) -> str:
    if math.isnan(value):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(value):
        return ("" if value > 0 else "-") + "std::numeric_limits<double>::infinity()"
    return repr(float(value))


def cpp_int(value: int) -> str:
    if -(2**31) < value < 2**31:
        return str(value)
    if value == -(2**63):
        return "INT64_MIN"
    return f"INT64_C({value})"


def cpp_expr(expr: object) -> str:
    """int64_t C++ for an integer size expression over symbol variables."""
    e = sympy.sympify(expr)

    def go(e: sympy.Basic) -> str:
        if isinstance(e, sympy.Integer) or (isinstance(e, sympy.Number) and e.is_integer):
            return cpp_int(int(e))
        if e is sympy.true or e is sympy.false:
            return "1" if e is sympy.true else "0"
        if isinstance(e, sympy.Symbol):
            return str(e)
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(go(t) for t in sorted(e.args, key=sympy.default_sort_key)) + ")"
        if isinstance(e, sympy.Mul):
            num, den = sympy.fraction(e)
            if den != 1:
                return f"wg_floordiv({go(num)}, {go(den)})"  # only exact in valid programs; sizes are ints
            return "(" + " * ".join(go(t) for t in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([go(e.base)] * int(e.exp)) + ")"
        if isinstance(e, FloorDiv):
            return f"wg_floordiv({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, CeilDiv):
            return f"wg_ceildiv({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, ModularIndexing):
            base, divisor, modulus = e.args
            inner = go(base) if divisor == 1 else f"wg_floordiv({go(base)}, {go(divisor)})"
            return f"wg_mod({inner}, {go(modulus)})"
        if isinstance(e, (sympy.Mod, PythonMod, TorchMod)):
            return f"wg_mod({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            fn = "wg_floordiv" if isinstance(e, sympy.floor) else "wg_ceildiv"
            return go(num) if den == 1 else f"{fn}({go(num)}, {go(den)})"
        if isinstance(e, sympy.core.relational.Relational):
            op = {"==": "==", "!=": "!=", ">=": ">=", ">": ">", "<=": "<=", "<": "<"}[e.rel_op]
            return f"({go(e.lhs)} {op} {go(e.rhs)})"
        if isinstance(e, (sympy.And, sympy.Or)):
            joiner = " && " if isinstance(e, sympy.And) else " || "
            return "(" + joiner.join(go(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(!{go(e.args[0])})"
        name = type(e).__name__
        if name in ("Max", "Min"):
            fn = "std::max" if name == "Max" else "std::min"
            text = go(e.args[0])
            for a in e.args[1:]:
                text = f"{fn}<int64_t>({text}, {go(a)})"
            return text
        raise UnprintableExpr(f"cannot print size expression {e} ({name}) as C++")

    return go(e)


_FLOAT_LEAVES = (SymF.ToFloat, SymF.FloatTrueDiv, SymF.IntTrueDiv, SymF.FloatPow, SymF.TruncToFloat)


def cpp_double_expr(expr: object) -> str:
    """double C++ for a size expression that may involve floats (`ToFloat(s0) / 2.0`: the
    scale factors of a dynamic interpolate, a tolerance scaled by a size)."""
    e = sympy.sympify(expr)

    def go(e: sympy.Basic) -> str:
        if e.is_integer and not e.atoms(*_FLOAT_LEAVES):
            return f"static_cast<double>({cpp_expr(e)})"
        if isinstance(e, sympy.Number):
            return cpp_float(float(e))
        if isinstance(e, sympy.Symbol) and e.is_real:
            return str(e)  # a float the program read from tensor data (`const double f0`)
        if isinstance(e, (SymF.ToFloat, SymF.TruncToFloat)):
            inner = go(e.args[0])
            return inner if isinstance(e, SymF.ToFloat) else f"std::trunc({inner})"
        if isinstance(e, (SymF.FloatTrueDiv, SymF.IntTrueDiv)):
            return f"({go(e.args[0])} / {go(e.args[1])})"
        if isinstance(e, (SymF.FloatPow, sympy.Pow)):
            return f"std::pow({go(e.args[0])}, {go(e.args[1])})"
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(go(t) for t in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(go(t) for t in e.args) + ")"
        raise UnprintableExpr(f"cannot print expression {e} ({type(e).__name__}) as C++ double")

    return go(e)


def cpp_int_list(values: tuple) -> str:
    """`{a, b, c}` of int64_t expressions."""
    return "{" + ", ".join(cpp_expr(v) for v in values) + "}"
