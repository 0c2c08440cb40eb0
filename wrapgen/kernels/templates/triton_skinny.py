"""The GPU template for skinny products: a few rows times a wide weight (batch-1 decoding).

At one to a few rows a product is a matrix-vector product, bound by reading the weight once.
cuBLAS serves it with tensor-core tiles over the output columns, so a 1024-column product runs
on 16 of an H100's 132 SMs and reads its weight at a fifth of the memory's bandwidth (a Llama
decode step's seven products per layer took 4-7 µs each on an H200 for 0.5-6 MB). Here one
program owns BLOCK_N output columns and all rows: it streams its BLOCK_N weight rows along K
in BLOCK_K chunks (contiguous, vectorized loads), multiplies them with the rows of A on the
CUDA cores into a float32 BLOCK_M x BLOCK_N x BLOCK_K accumulator, and sums over K once at
the end; narrow column blocks give every SM programs to run. The epilogue (bias, the fused
pointwise group) is the GEMM template's, over the BLOCK_M x BLOCK_N result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.templates.problem import GemmProblem
from wrapgen.kernels.templates.triton_gemm import (
    EpilogueCodegen,
    TritonGemmConfig,
    finish_source,
    largest_offset,
    operand_offset,
    render_epilogue,
)
from wrapgen.kernels.triton.codegen import INT32_LIMIT
from wrapgen.kernels.triton.ops import SourceWriter
from wrapgen.loop_ir import FusionGroup

SKINNY_MAX_ROWS = 16  # the most rows a skinny product has: beyond, tensor-core tiles pay
# the accumulator's elements per program: at most 64 float32 registers per thread at 4 warps
ACCUMULATOR_LIMIT = 8192
# (BLOCK_N, BLOCK_K, warps, stages) for one row: the four that won a Llama decode step's five
# products (1024 to 32000 columns over 1024 or 2816) on an H200 among nine measured, from narrow
# column blocks over long K chunks to wide ones over short; more rows shrink BLOCK_K to keep the
# accumulator in registers
_CONFIGS = [(2, 2048, 8, 1), (4, 1024, 4, 2), (16, 512, 8, 2), (32, 256, 8, 2)]


@dataclass(frozen=True)
class SkinnyConfig(TritonGemmConfig):
    @property
    def tag(self) -> str:
        return f"triton_skinny_{self.block_m}x{self.block_n}x{self.block_k}_s{self.num_stages}_w{self.num_warps}"


def skinny(problem: GemmProblem) -> bool:
    """Whether the product is a few rows times a weight: mm or addmm with at most SKINNY_MAX_ROWS rows."""
    return problem.op in ("mm", "addmm") and problem.m <= SKINNY_MAX_ROWS


def skinny_configs(problem: GemmProblem) -> list[SkinnyConfig]:
    """The column-block, K-chunk, warp and stage configurations to measure, shrunk to the problem."""
    if not skinny(problem):
        return []
    block_m = _pow2(problem.m)
    if torch.device(problem.device).type == "cpu":  # Triton's interpreter: one small candidate
        return [SkinnyConfig(block_m, min(4, _pow2(problem.n)), min(16, _pow2(problem.k)), 1, 1, 1)]
    out = []
    for block_n, block_k, warps, stages in _CONFIGS:
        block_n, block_k = min(block_n, _pow2(problem.n)), min(block_k, max(16, _pow2(problem.k)))
        while block_m * block_n * block_k > ACCUMULATOR_LIMIT and block_k > 16:
            block_k //= 2
        config = SkinnyConfig(block_m, block_n, block_k, stages, warps, 1)
        if config not in out:
            out.append(config)
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def skinny_gemm_source(problem: GemmProblem, config: SkinnyConfig, name: str) -> GeneratedKernel:
    p, c = problem, config
    interpreted = torch.device(p.device).type == "cpu"
    group = p.epilogue.group if p.epilogue else FusionGroup(p.rows)
    cg = EpilogueCodegen(group, name, set(p.epilogue.needed) if p.epilogue else set(),
                         p.epilogue.dtypes if p.epilogue else {}, {}, set(), "cpu" if interpreted else "cuda")
    w = SourceWriter()
    wide = largest_offset(p) > INT32_LIMIT
    cast = ".to(tl.int64)" if wide else ""
    w.line("bidx = 0")
    w.line(f"rm = tl.arange(0, BLOCK_M){cast}")
    w.line(f"rn = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)){cast}")
    w.line(f"ram = rm % {p.m}")  # rows past m wrap onto real ones: loads stay unmasked, stores are masked
    hint = "tl.max_contiguous(tl.multiple_of({0}, {1}), {1})"
    w.line(f"rbn = {hint.format(f'rn % {p.n}', 'BLOCK_N') if p.n % c.block_n == 0 else f'rn % {p.n}'}")
    w.line("rk = tl.arange(0, BLOCK_K)")
    w.line("acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)")
    w.line(f"for k0 in range(0, {p.k}, BLOCK_K):")
    w.depth += 1
    w.line("kk = k0 + rk")
    even_k = p.k % c.block_k == 0
    a_mask = "" if even_k else f", mask=kk[None, :] < {p.k}, other=0.0"
    b_mask = "" if even_k else f", mask=kk[None, :] < {p.k}, other=0.0"
    a_load = f"tl.load(a_ptr + ({operand_offset(p.a, 'bidx', 'ram[:, None]', 'kk[None, :]')}){a_mask})"
    b_load = f"tl.load(b_ptr + ({operand_offset(p.b, 'bidx', 'kk[None, :]', 'rbn[:, None]')}){b_mask})"
    w.line(f"a = {cg.widen(a_load, p.a.dtype)}")  # [BLOCK_M, BLOCK_K]
    w.line(f"b = {cg.widen(b_load, p.b.dtype)}")  # [BLOCK_N, BLOCK_K]: B's columns, each along K
    w.line("acc3 += a[:, None, :] * b[None, :, :]")
    w.depth -= 1
    w.line("acc = tl.sum(acc3, axis=2)")
    w.line(f"xmask = (rm[:, None] < {p.m}) & (rn[None, :] < {p.n})")
    render_epilogue(p, cg, w)
    return finish_source(p, c, cg, w, name, -(-p.n // c.block_n))
