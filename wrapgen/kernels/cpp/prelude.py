"""The C++ prelude every kernel translation unit starts with: includes, index helpers, SIMD
declarations of libm functions so loops calling them vectorize (glibc's libmvec), and the
half-precision conversions.

bfloat16 and float16 are stored as uint16_t and computed in float: loads widen, stores and
casts round to nearest even, NaN stays NaN (c10's conversions, bit for bit). They are written
with integer and float arithmetic on the bits rather than with `_Float16` / `__bf16`, which
g++ 12 cannot vectorize on x86 without AVX512-FP16: these loops vectorize like float ones.
"""

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


HALF_CONVERSIONS = """
static inline float wg_bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t wg_float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// bfloat16: the top half of a float's bits, rounded to nearest even (c10::BFloat16)
static inline float wg_bf16_to_float(uint16_t b) { return wg_bits_float(uint32_t(b) << 16); }
static inline uint32_t wg_bf16_rounded_bits(float f) {
  const uint32_t u = wg_float_bits(f);
  return u + UINT32_C(0x7FFF) + ((u >> 16) & 1u);
}
static inline uint16_t wg_float_to_bf16(float f) { return f != f ? uint16_t(0x7FC0) : uint16_t(wg_bf16_rounded_bits(f) >> 16); }
static inline float wg_round_bf16(float f) { return f != f ? f : wg_bits_float(wg_bf16_rounded_bits(f) & UINT32_C(0xFFFF0000)); }
// float16 (IEEE binary16), as c10::Half converts without F16C: branch-free, so it vectorizes
static inline float wg_half_to_float(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t two_w = w + w;
  const float normalized = wg_bits_float((two_w >> 4) + (UINT32_C(0xE0) << 23)) * 0x1.0p-112f;
  const float denormalized = wg_bits_float((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (UINT32_C(1) << 27) ? wg_float_bits(denormalized) : wg_float_bits(normalized);
  return wg_bits_float((w & UINT32_C(0x80000000)) | magnitude);
}
static inline uint16_t wg_float_to_half(float f) {
  const uint32_t w = wg_float_bits(f);
  const uint32_t shl1_w = w + w;
  uint32_t bias = shl1_w & UINT32_C(0xFF000000);
  bias = bias < UINT32_C(0x71000000) ? UINT32_C(0x71000000) : bias;
  const float base = wg_bits_float((bias >> 1) + UINT32_C(0x07800000)) + (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t bits = wg_float_bits(base);
  const uint32_t nonsign = ((bits >> 13) & UINT32_C(0x00007C00)) + (bits & UINT32_C(0x00000FFF));
  return uint16_t(((w & UINT32_C(0x80000000)) >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
}
static inline float wg_round_half(float f) { return wg_half_to_float(wg_float_to_half(f)); }
"""

# lane_tiles.py's fold of a [16][16] float tile: a tree of 15 vector adds over halves of row
# pairs, in gcc's vector extensions (an intrinsics header would cost 0.2 s of g++ per kernel);
# other compilers (CXX=clang++ has no __builtin_shuffle) fold one row at a time
LANE_FOLD = """
#if defined(__GNUC__) && !defined(__clang__)
typedef float wg_f16v __attribute__((vector_size(64)));
typedef int wg_i16v __attribute__((vector_size(64)));
static inline wg_f16v wg_pair_sum(wg_f16v x, wg_f16v y, wg_i16v lo, wg_i16v hi) {
  return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}
static inline void wg_fold16x16(const float (*lanes)[16], float* out) {  // out[i] = sum of lanes[i]
  wg_f16v a[16], b[8], c[4], d[2];
  for (int i = 0; i < 16; ++i) std::memcpy(&a[i], lanes[i], 64);
  const wg_i16v lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const wg_i16v hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  for (int i = 0; i < 8; ++i) b[i] = wg_pair_sum(a[2 * i], a[2 * i + 1], lo1, hi1);
  const wg_i16v lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const wg_i16v hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  for (int i = 0; i < 4; ++i) c[i] = wg_pair_sum(b[2 * i], b[2 * i + 1], lo2, hi2);
  const wg_i16v lo3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const wg_i16v hi3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  for (int i = 0; i < 2; ++i) d[i] = wg_pair_sum(c[2 * i], c[2 * i + 1], lo3, hi3);
  const wg_i16v lo4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const wg_i16v hi4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const wg_f16v e = wg_pair_sum(d[0], d[1], lo4, hi4);
  std::memcpy(out, &e, 64);
}
#else
static inline void wg_fold16x16(const float (*lanes)[16], float* out) {
  for (int i = 0; i < 16; ++i) {
    float total = 0;
    for (int l = 0; l < 16; ++l) total += lanes[i][l];
    out[i] = total;
  }
}
#endif
"""

# exp of float: glibc's vector expf (libmvec) computes an argument beyond about +-87.3 (a result
# below FLT_MIN or near overflow) one lane at a time with the scalar expf: a masked softmax's
# -FLT_MAX lanes cost about 60 ns per vector, and MPT's attention softmax (2 x 4 x 32 x 32, causal)
# took 43 us where 14 without the mask. Such an argument is moved into the fast range by 64 ln 2
# and the result scaled back by 2^-+64, a power of two made from its exponent bits (exact but for a
# subnormal result's rounding); beyond +-110 the result is 0 or inf either way. Every argument
# within +-87 is computed as before, bit for bit, and NaN stays NaN. There is no select with a
# constant arm around the call: g++ turned those into two or three expf calls per vector.
EXP = """
static inline float wg_expf(float x) {
  const int32_t side = static_cast<int32_t>(x < -87.0f) - static_cast<int32_t>(x > 87.0f);
  const float low = x > -110.0f ? x : -110.0f;
  const float clamped = low < 110.0f ? low : 110.0f;
  const float r = expf(clamped + static_cast<float>(side) * 44.36141955583650f);
  const float scale = wg_bits_float(static_cast<uint32_t>(127 - 64 * side) << 23);
  return x != x ? x : r * scale;
}
"""

PRELUDE = f"""// wrapgen C++ kernel prelude
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
static inline int64_t wg_imin(int64_t a, int64_t b) {{ return a < b ? a : b; }}
static inline int64_t wg_imax(int64_t a, int64_t b) {{ return a > b ? a : b; }}
template <typename T> static inline T wg_maximum(T a, T b) {{ return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }}
template <typename T> static inline T wg_minimum(T a, T b) {{ return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }}
{HALF_CONVERSIONS}{LANE_FOLD}{EXP}"""
