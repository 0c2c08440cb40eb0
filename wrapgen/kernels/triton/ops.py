"""Triton expressions for loop-IR ops, and the helper functions generated kernels may need.

On the GPU, math that Triton's core lacks comes from libdevice; Triton's CPU interpreter
cannot call libdevice, so there the same ops are written with core math (see
INTERPRETER_MATH), and the few with no such form stay library calls (INTERPRETER_UNSUPPORTED).

bfloat16 / float16 values are float32 blocks (loads upcast; casts to a half dtype and stores
round). Triton's interpreter (numpy has no bfloat16) rounds float32 to bfloat16 toward zero and
flushes bfloat16 subnormals when it widens them, so there both conversions are written out on
the bits (`_wg_to_bf16`, `_wg_from_bf16`, `_wg_round_bf16`), as the GPU does them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from wrapgen.loop_ir import HALF_DTYPES, compute_dtype


@dataclass
class SourceWriter:
    """Lines of a kernel's body at an indentation depth."""

    depth: int = 1
    lines: list[str] = field(default_factory=list)

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)


TL = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16",
}


def compute_tl(dtype: torch.dtype) -> str:
    """The Triton type a block of `dtype` values is computed in (float32 for half dtypes)."""
    return TL[compute_dtype(dtype)]


HELPERS = {
    # NaN-propagating; two selects, not `(a < b) | (a != a)`: Triton's interpreter cannot `|` a
    # 0-d operand's comparison (a constant, as in logsigmoid's min(0, x)) with a block's
    "_wg_maximum": "def _wg_maximum(a, b):\n    return tl.where(a != a, a, tl.where(a > b, a, b))\n",
    "_wg_minimum": "def _wg_minimum(a, b):\n    return tl.where(a != a, a, tl.where(a < b, a, b))\n",
    "_wg_prod": "def _wg_prod(a, b):\n    return a * b\n",
    # float32 <-> bfloat16 for the interpreter: round to nearest even, NaN kept, subnormals exact
    "_wg_round_bf16_bits": "def _wg_round_bf16_bits(x):\n"
                           "    bits = x.to(tl.uint32, bitcast=True)\n"
                           "    return tl.where(x != x, 0x7FC00000, (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000)\n",
    "_wg_to_bf16": "def _wg_to_bf16(x):\n"
                   "    return (_wg_round_bf16_bits(x) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)\n",
    "_wg_round_bf16": "def _wg_round_bf16(x):\n"
                      "    return _wg_round_bf16_bits(x).to(tl.float32, bitcast=True)\n",
    "_wg_from_bf16": "def _wg_from_bf16(x):\n"
                     "    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)\n",
    # (value, index) pairs: the larger (smaller) value wins, NaN beats numbers, ties go to the first index
    "_wg_argmax": "def _wg_argmax(a, ai, b, bi):\n"
                  "    take = (b > a) | ((b != b) & (a == a)) | (((b == a) | ((b != b) & (a != a))) & (bi < ai))\n"
                  "    return tl.where(take, b, a), tl.where(take, bi, ai)\n",
    "_wg_argmin": "def _wg_argmin(a, ai, b, bi):\n"
                  "    take = (b < a) | ((b != b) & (a == a)) | (((b == a) | ((b != b) & (a != a))) & (bi < ai))\n"
                  "    return tl.where(take, b, a), tl.where(take, bi, ai)\n",
}
ARG_REDUCTIONS = ("argmax", "argmin")

# Triton's CPU interpreter cannot call libdevice: there these ops are written with tl's core
# math instead (accurate to float32 test tolerances; the GPU path keeps libdevice).
INTERPRETER_MATH = {
    "tanh": "1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)",
    "expm1": "tl.exp(x) - 1.0",
    "log10": "tl.log(x) * 0.4342944819032518",
    "log1p": "tl.log(1.0 + x)",
    "tan": "tl.sin(x) / tl.cos(x)",
    "sinh": "0.5 * (tl.exp(x) - tl.exp(-x))",
    "cosh": "0.5 * (tl.exp(x) + tl.exp(-x))",
    "asinh": "tl.where(x < 0, -tl.log(-x + tl.sqrt(x * x + 1.0)), tl.log(x + tl.sqrt(x * x + 1.0)))",
    "acosh": "tl.log(x + tl.sqrt(x * x - 1.0))",
    "atanh": "0.5 * tl.log((1.0 + x) / (1.0 - x))",
    "sqrt": "tl.sqrt(x)",
    "rsqrt": "1.0 / tl.sqrt(x)",
    "trunc": "tl.where(x < 0, tl.ceil(x), tl.floor(x))",
    "nearbyint": "tl.where((tl.floor(x + 0.5) - x == 0.5) & (tl.floor(x + 0.5) % 2 != 0), tl.floor(x + 0.5) - 1.0, tl.floor(x + 0.5))",
}
# ATen ops whose Triton form needs libdevice with no core-math equivalent: not lowered for the interpreter.
INTERPRETER_UNSUPPORTED = frozenset({"aten::asin", "aten::acos", "aten::atan", "aten::atan2", "aten::pow", "aten::fmod"})

_LIBDEVICE = {
    "expm1", "log10", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sqrt", "rsqrt", "trunc",
}
_TL_MATH = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2", "sin": "tl.sin", "cos": "tl.cos",
            "erf": "tl.erf", "abs": "tl.abs", "floor": "tl.floor", "ceil": "tl.ceil"}


class OpRenderer:
    """Mixin: `render(op, ...)` and `math(fn, x)`, recording the helpers and imports they need."""

    interpreted: bool
    helpers: set[str]
    libdevice: bool

    def render(self, op: str, args: list[str], arg_dtypes: list[torch.dtype], dtype: torch.dtype) -> str:
        t = compute_tl(dtype)
        a = args[0] if args else ""
        b = args[1] if len(args) > 1 else ""
        floating = dtype.is_floating_point
        simple = {
            "add": f"{a} + {b}", "sub": f"{a} - {b}", "mul": f"{a} * {b}", "div": f"{a} / {b}",
            "eq": f"{a} == {b}", "ne": f"{a} != {b}", "lt": f"{a} < {b}", "le": f"{a} <= {b}",
            "gt": f"{a} > {b}", "ge": f"{a} >= {b}", "and": f"{a} & {b}", "or": f"{a} | {b}",
            "xor": f"{a} ^ {b}", "not": f"{a} == 0", "bitwise_and": f"{a} & {b}", "bitwise_or": f"{a} | {b}",
            "bitwise_xor": f"{a} ^ {b}", "neg": f"-{a}", "where": f"tl.where({a}, {b}, {args[-1]})",
            "clamp_min": f"tl.where({a} < {b}, {b}, {a})", "clamp_max": f"tl.where({b} < {a}, {b}, {a})",
            "relu": f"tl.where({a} < 0, tl.full([], 0, {t}), {a})", "isnan": f"{a} != {a}",
            "reciprocal": f"1.0 / {a}", "sigmoid": f"1.0 / (1.0 + tl.exp(-{a}))",
        }
        if op in simple:
            return simple[op]
        if op == "cast" and dtype in HALF_DTYPES:  # a float32 held to a half dtype's precision
            x = a if arg_dtypes[0] == torch.float32 else f"{a}.to(tl.float32)"
            if dtype == torch.bfloat16 and self.interpreted:
                self.helpers |= {"_wg_round_bf16", "_wg_round_bf16_bits"}
                return f"_wg_round_bf16({x})"
            return f"{x}.to({TL[dtype]}).to(tl.float32)"
        if op == "cast":
            return f"({a} != 0)" if dtype == torch.bool else f"{a}.to({t})"
        if op in ("maximum", "minimum"):
            if not floating:
                return f"tl.{op}({a}, {b})"
            self.helpers.add(f"_wg_{op}")
            return f"_wg_{op}({a}, {b})"
        if op == "bitwise_not":
            return f"{a} == 0" if dtype == torch.bool else f"~{a}"
        if op == "abs":
            return f"tl.abs({a})"
        if op in ("floor", "ceil", "trunc", "round"):
            if not floating:
                return a
            if op == "round":
                return self.math("nearbyint", a)
            if op == "trunc":
                return self.math("trunc", a)
            return f"tl.{op}({a})"
        if op == "sign":
            core = f"({a} > 0).to({t}) - ({a} < 0).to({t})"
            return f"tl.where({a} != {a}, {a}, {core})" if floating else core
        if op == "gelu":
            return f"0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476))"
        if op == "gelu_tanh":
            inner = self.math("tanh", f"0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})")
            return f"0.5 * {a} * (1.0 + {inner})"
        if op in ("pow", "atan2", "fmod"):
            self.libdevice = True
            return f"libdevice.{op}({a}, {b})"
        if op == "remainder":
            return f"{a} - tl.floor({a} / {b}) * {b}"
        if op in _TL_MATH:
            return f"{_TL_MATH[op]}({a})"
        if op in _LIBDEVICE:
            return self.math(op, a)
        raise NotImplementedError(f"no Triton rendering for op {op!r}")

    def to_storage(self, x: str, dtype: torch.dtype) -> str:
        """A block of `dtype`'s compute type as `dtype` (half dtypes round to nearest even)."""
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers |= {"_wg_to_bf16", "_wg_round_bf16_bits"}
            return f"_wg_to_bf16({x})"
        return f"{x}.to({TL[dtype]})"

    def widen(self, load: str, dtype: torch.dtype) -> str:
        """A block loaded from a `dtype` buffer in its compute type (bool as int1, half as float32)."""
        if dtype == torch.bool:
            return f"{load}.to(tl.int1)"
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers.add("_wg_from_bf16")
            return f"_wg_from_bf16({load})"
        if dtype in HALF_DTYPES:
            return f"{load}.to(tl.float32)"
        return load

    def math(self, fn: str, x: str) -> str:
        """A libdevice function on the GPU; a core-math helper in Triton's CPU interpreter."""
        if self.interpreted:
            if fn not in INTERPRETER_MATH:
                raise NotImplementedError(f"{fn} has no Triton form for the CPU interpreter")
            self.helpers.add(f"_wg_{fn}")
            return f"_wg_{fn}({x})"
        self.libdevice = True
        return f"libdevice.{fn}({x})"

    def helper_sources(self) -> list[str]:
        """The `@triton.jit` helper functions this kernel uses, in a stable order."""
        out = []
        for helper in sorted(self.helpers):
            text = HELPERS.get(helper) or f"def {helper}(x):\n    return {INTERPRETER_MATH[helper.removeprefix('_wg_')]}\n"
            out += ["", "@triton.jit", text.rstrip("\n")]
        return out


def literal(value: object, dtype: torch.dtype) -> str:
    """A Python literal of `value` as Triton source."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))
