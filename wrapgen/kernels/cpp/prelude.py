"""The C++ prelude every kernel translation unit starts with: includes, index helpers, and
SIMD declarations of libm functions so loops calling them vectorize (glibc's libmvec)."""

from __future__ import annotations

_SIMD_FUNCTIONS = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
)
_SIMD_BINARY = ("pow", "atan2")


def _declarations() -> str:
    lines = []
    for f in _SIMD_FUNCTIONS:
        lines += ["#pragma omp declare simd notinbranch", f"float {f}f(float);",
                  "#pragma omp declare simd notinbranch", f"double {f}(double);"]
    for f in _SIMD_BINARY:
        lines += ["#pragma omp declare simd notinbranch", f"float {f}f(float, float);",
                  "#pragma omp declare simd notinbranch", f"double {f}(double, double);"]
    return "\n".join(lines)


PRELUDE = f"""// wrapgen C++ kernel prelude
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#if defined(WG_MVEC) && defined(__x86_64__)
extern "C" {{
{_declarations()}
}}
#endif

static inline int64_t wg_floordiv(int64_t a, int64_t b) {{
  int64_t q = a / b;
  return ((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}
static inline int64_t wg_mod(int64_t a, int64_t b) {{
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
template <typename T> static inline T wg_maximum(T a, T b) {{ return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }}
template <typename T> static inline T wg_minimum(T a, T b) {{ return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }}
"""
