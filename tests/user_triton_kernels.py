"""User-defined Triton kernels for tests/test_user_triton.py and tests/test_multi_kernel.py,
defined as real `@triton.jit` functions (not the interpreter's InterpretedFunction, even where
TRITON_INTERPRET=1) so that torch can capture them into graphs on any machine; wrapgen then
runs them in Triton's interpreter on CPU tensors, or compiled on the GPU."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def jit_compiled():
    """Define kernels as JITFunctions even when Triton interprets (what wrap_triton needs)."""
    from triton import knobs

    previous = knobs.runtime.interpret
    knobs.runtime.interpret = False
    try:
        yield
    finally:
        knobs.runtime.interpret = previous


with jit_compiled():
    import triton
    import triton.language as tl

    from tests import user_triton_helpers as helpers

    SHIFT = tl.constexpr(3)

    @triton.jit
    def _twice(x):
        return x * 2

    @triton.autotune(
        # the first and last configs share a grid (one grid computation serves both)
        configs=[triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2),
                 triton.Config({"BLOCK": 16}, num_warps=2)],
        key=["n"],
    )
    @triton.jit
    def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """out = 2*x + helpers.halve(y) + SHIFT — a docstring with \"\"\" quotes, a backslash \\ and ünïcödé."""
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, _twice(x) + helpers.halve(y) + SHIFT, mask=mask)

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1)],
                     key=["n"])
    @triton.jit
    def accumulate_kernel(acc_ptr, x_ptr, n, BLOCK: tl.constexpr):
        """acc += x in place: a mutated argument (timing it must not change the result)."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(acc_ptr + offs, tl.load(acc_ptr + offs, mask=mask) + tl.load(x_ptr + offs, mask=mask), mask=mask)

    @triton.jit
    def plain_mul_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr = 32):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


def _grid(meta_n):
    return lambda meta: (triton.cdiv(meta_n, meta["BLOCK"]),)


@torch.library.triton_op("wrapgen_test::scale_add", mutates_args={})
def scale_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(scale_add_kernel)[_grid(n)](x, y, out, n)
    return out


@torch.library.triton_op("wrapgen_test::accumulate", mutates_args={"acc"})
def accumulate(acc: torch.Tensor, x: torch.Tensor) -> None:
    n = x.numel()
    torch.library.wrap_triton(accumulate_kernel)[_grid(n)](acc, x, n)


@torch.library.triton_op("wrapgen_test::plain_mul", mutates_args={})
def plain_mul(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(plain_mul_kernel)[(triton.cdiv(n, 32),)](x, out, n, factor)
    return out


def scale_add_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * x + y * 0.5 + 3
