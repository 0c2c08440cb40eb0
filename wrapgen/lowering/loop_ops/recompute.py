"""When inlining a value into a consumer would repeat expensive work per element.

A pointwise value is normally inlined into its consumers (recomputed where it is read). If
a consumer broadcasts it to many more elements, every transcendental in it runs once per
consumer element instead of once per value element: a Llama-style model's rotary `cos` /
`sin` of [1, seq, head_dim] inlined into the [batch, heads, seq, head_dim] query and key
kernels ran batch * heads times as many cos/sin calls (and, with both of one argument,
gcc merged them into a scalar sincos call, so the whole kernel stopped vectorizing).
Such a value is computed once into a buffer and the consumer loads it.

So is a value that a window (pooling) reads at every position of its window, when it reads more
than one tensor: PoolFormer's token mixer pools a GroupNorm of the residual stream, which is
itself the sum of the last block's outputs, so each 3x3 window inlined six tensors' reads nine
times, and the kernel took 141-264 us per call on an H200 where Inductor's takes 9-47.

Except a one-element value in a Triton kernel: it is a scalar there, computed once per block
of a thousand elements. A compiled AdamW step's bias corrections (`pow(beta, step)`, `sqrt`,
per parameter) stay inline: written to buffers first they were one more kernel and two
allocations per parameter per step (296 for GPT-2), a third of the step's host time.
"""

from __future__ import annotations

import sympy

from wrapgen.loop_ir import Apply, LoopValue, loads, row_vars, walk

# ops that cost much more than a load (libm calls, or several of them)
EXPENSIVE_OPS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "pow", "atan2", "sigmoid", "gelu", "gelu_tanh",
})
# a broadcast at least this many times the value's size computes it once (below it, the
# extra kernel and buffer can cost more than the repeated work)
BROADCAST_FACTOR = 4


def numel(sizes: tuple) -> sympy.Expr:
    """The element count of a `sizes` tensor, as an expression of its size symbols."""
    return sympy.Mul(*(sympy.sympify(s) for s in sizes))


def compute_once_before_broadcast(value: LoopValue, sizes: tuple, language: str | None = None) -> bool:
    """Whether `value`, read at every element of a `sizes` result, should be in memory first.
    Not a half-precision value still held unrounded in float32: storing it would round it
    where the inlined value is not rounded (an explicit cast to the half dtype is, and may be)."""
    if value.body.dtype != value.dtype:
        return False
    if language == "triton" and numel(value.sizes) == 1:
        return False  # a scalar of the kernel
    ratio = numel(sizes) / numel(value.sizes)  # products of sizes: their symbols cancel as they are
    if not (ratio.is_Rational and ratio >= BROADCAST_FACTOR):  # not for sizes that do not cancel, or 0
        return False
    return any(isinstance(n, Apply) and n.op in EXPENSIVE_OPS for n in walk(value.body))


def full_size_reads(value: LoopValue) -> set[str]:
    """The buffers `value` reads along its innermost dimension (or by gather): those an inlined
    copy keeps alive. A per-row or scalar read (a cross entropy's targets and scale beside its
    logits-sized gradient) is small, and recomputing from it is cheap."""
    inner = row_vars(len(value.sizes))[-1:]
    return {ld.buffer for ld in loads(value.body)
            if not inner or ld.indirect or inner[0] in sympy.sympify(ld.index).free_symbols}


def compute_once_before_window(value: LoopValue) -> bool:
    """Whether `value`, read at every position of a pooling window, should be in memory first:
    when it reads more than one full-size tensor (`computed_once` stores only what computes)."""
    return len(full_size_reads(value)) > 1
