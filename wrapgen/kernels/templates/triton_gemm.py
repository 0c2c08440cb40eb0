"""The GPU GEMM template: a tiled Triton matmul with the epilogue fused.

One program computes a BLOCK_M x BLOCK_N tile of one batch entry (grid: tiles, batch), the
tiles visited in groups of GROUP_M rows so neighbouring programs share A and B panels in
L2. The K loop accumulates `tl.dot` into float32 (bf16/fp16 operands go to the tensor cores
as they are; on Hopper Triton lowers these dots to wgmma, with software pipelining over
`num_stages`). Row and column indices wrap modulo the sizes instead of being masked, so the
operand loads stay unmasked and vectorized; only a K tail is masked. Then the epilogue: alpha,
the bias, rounding to the product's dtype, and the fused pointwise group rendered by the
Triton kernel generator over the tile's 2-D block (x0/x1 are the element's row and column),
stored under the tile's bounds mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.templates.problem import GemmProblem, Operand
from wrapgen.kernels.triton.codegen import INT32_LIMIT, TritonKernelCodegen
from wrapgen.kernels.triton.ops import SourceWriter
from wrapgen.loop_ir import FusionGroup


@dataclass(frozen=True)
class TritonGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    group_m: int = 8

    @property
    def tag(self) -> str:
        return f"triton_gemm_{self.block_m}x{self.block_n}x{self.block_k}_s{self.num_stages}_w{self.num_warps}"


# (M, N, K blocks, stages, warps): the usual large tiles for tensor cores, smaller ones for
# narrow products; float32 halves K (shared memory).
_HALF_CONFIGS = [(128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 32, 4, 4),
                 (64, 256, 32, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 3, 4)]
_FLOAT_CONFIGS = [(128, 128, 32, 3, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4)]
# The shortlist measured for a misaligned product without max_autotune, from GPT-2's LM-head
# products (benchmarks/results/gemm-shortlist-cuda-2026-11-26-H200.md): the winner of the forward
# at 2048 rows (128x256x64), the winner of dX (64x128x64, which shrunk to 32 rows is within 1% of
# the best there), and the best all-rounder (128x128x64: 20-26% behind each winner, the best of
# the three on dW). Compiling all
# eight took 4.7 s of a 12 s cold compile (their compiles run in parallel, so the slowest one
# sets the time: up to 3 s for a single config).
_HALF_SHORTLIST = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (64, 128, 64, 4, 4)]


def _interpreting(problem: GemmProblem) -> bool:
    return torch.device(problem.device).type == "cpu"


def triton_configs(problem: GemmProblem, shortlist: bool = False) -> list[TritonGemmConfig]:
    """The tile/stage/warp configurations to measure (`shortlist`: the few that won on measured
    products, for a product tuned without max_autotune), tiles shrunk to the problem."""
    if _interpreting(problem):  # Triton's interpreter runs tiles in numpy: small tiles, few candidates
        return [TritonGemmConfig(16, 16, 16, 1, 1, 2), TritonGemmConfig(32, 32, 16, 1, 1, 1)]
    half = problem.a.dtype in (torch.bfloat16, torch.float16)
    table = (_HALF_SHORTLIST if shortlist else _HALF_CONFIGS) if half else _FLOAT_CONFIGS
    out = []
    for bm, bn, bk, stages, warps in table:
        # shrink tiles to the problem (powers of two, at least 16 for tl.dot)
        bm, bn = min(bm, max(16, _pow2(problem.m))), min(bn, max(16, _pow2(problem.n)))
        bk = min(bk, max(16, _pow2(problem.k)))
        cfg = TritonGemmConfig(bm, bn, bk, stages, warps if bm * bn >= 128 * 64 else min(warps, 4))
        if cfg not in out:
            out.append(cfg)
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class EpilogueCodegen(TritonKernelCodegen):
    """The Triton kernel generator over one 2-D output tile instead of a flat block."""

    def _flatten(self, e: sympy.Expr) -> sympy.Expr:
        return sympy.expand(e)

    @property
    def needs_xmask(self) -> bool:
        return True

    def _shape(self, level: str) -> str:
        return "[BLOCK_M, BLOCK_N]"


def largest_offset(p: GemmProblem) -> int:
    """The largest element offset any operand's indexing reaches (int32 indexing below 2**31)."""
    top = 0
    for layout in p.layouts.values():
        sizes, strides = layout[0], layout[1]
        top = max(top, sum((s - 1) * abs(st) for s, st in zip(sizes, strides)))
    return max(top, p.batch * p.m * p.n, p.batch * p.m * p.k, p.batch * p.k * p.n)


def operand_offset(op: Operand, batch: str, row: str, col: str) -> str:
    sb, sr, sc = op.strides
    parts = [f"{s} * {v}" if s != 1 else v for s, v in ((sb, batch), (sr, row), (sc, col)) if s != 0]
    return " + ".join(parts) or "0"


def triton_gemm_source(problem: GemmProblem, config: TritonGemmConfig, name: str) -> GeneratedKernel:
    p, c = problem, config
    interpreted = _interpreting(p)
    group = p.epilogue.group if p.epilogue else FusionGroup(p.rows)
    cg = EpilogueCodegen(group, name, set(p.epilogue.needed) if p.epilogue else set(),
                          p.epilogue.dtypes if p.epilogue else {}, {}, set(), "cpu" if interpreted else "cuda")
    w = SourceWriter()
    tiles_m, tiles_n = -(-p.m // c.block_m), -(-p.n // c.block_n)
    even_k = p.k % c.block_k == 0
    wide = largest_offset(p) > INT32_LIMIT
    w.line("pid = tl.program_id(0)")
    w.line("bidx = tl.program_id(1).to(tl.int64)" if wide else "bidx = tl.program_id(1)")
    w.line(f"width = GROUP_M * {tiles_n}")
    w.line("group_id = pid // width")
    w.line(f"group_size = min({tiles_m} - group_id * GROUP_M, GROUP_M)")
    w.line("pid_m = group_id * GROUP_M + (pid % width) % group_size")
    w.line("pid_n = (pid % width) // group_size")
    cast = ".to(tl.int64)" if wide else ""
    w.line(f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){cast}")
    w.line(f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){cast}")
    # contiguity hints only where no block wraps around (a wrapped block is not contiguous)
    hint = "tl.max_contiguous(tl.multiple_of({0}, {1}), {1})"
    w.line(f"ram = {hint.format(f'rm % {p.m}', 'BLOCK_M') if p.m % c.block_m == 0 else f'rm % {p.m}'}")
    w.line(f"rbn = {hint.format(f'rn % {p.n}', 'BLOCK_N') if p.n % c.block_n == 0 else f'rn % {p.n}'}")
    w.line("rk = tl.arange(0, BLOCK_K)")
    w.line("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
    w.line(f"for k0 in range(0, {p.k}, BLOCK_K):")
    w.depth += 1
    w.line("kk = k0 + rk")
    a_ptr = f"a_ptr + ({operand_offset(p.a, 'bidx', 'ram[:, None]', 'kk[None, :]')})"
    b_ptr = f"b_ptr + ({operand_offset(p.b, 'bidx', 'kk[:, None]', 'rbn[None, :]')})"
    a_mask = "" if even_k else f", mask=kk[None, :] < {p.k}, other=0.0"
    b_mask = "" if even_k else f", mask=kk[:, None] < {p.k}, other=0.0"
    a_load, b_load = f"tl.load({a_ptr}{a_mask})", f"tl.load({b_ptr}{b_mask})"
    if interpreted:  # numpy has no bfloat16: operands widen to float32 (the products are exact either way)
        a_load, b_load = cg.widen(a_load, p.a.dtype), cg.widen(b_load, p.b.dtype)
    w.line(f"a = {a_load}")
    w.line(f"b = {b_load}")
    precision = "ieee" if p.a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    extra = f", input_precision=\"{precision}\"" if p.a.dtype == torch.float32 and not interpreted else ""
    w.line(f"acc += tl.dot(a, b{extra})")
    w.depth -= 1
    w.line(f"xmask = (rm[:, None] < {p.m}) & (rn[None, :] < {p.n})")
    render_epilogue(p, cg, w)
    return finish_source(p, c, cg, w, name, tiles_m * tiles_n)


def render_epilogue(p: GemmProblem, cg: EpilogueCodegen, w: SourceWriter) -> None:
    value = "acc" if p.alpha == 1 else f"acc * {float(p.alpha)!r}"
    if p.bias is not None:
        # a 2-D pointer block (the bias broadcasts along a stride-0 dimension) to match the mask
        offset = f"{operand_offset(p.bias, 'bidx', 'rm[:, None]', 'rn[None, :]')} + tl.zeros([BLOCK_M, BLOCK_N], tl.int32)"
        bias = cg.widen(f"tl.load(c_ptr + ({offset}), mask=xmask)", p.bias.dtype)
        value = f"{value} + {bias}" if p.beta == 1 else f"{value} + {float(p.beta)!r} * {bias}"
    w.line(f"mmv = {value}")
    if p.out.dtype in (torch.bfloat16, torch.float16):
        w.line(f"mmv = {cg.render('cast', ['mmv'], [torch.float32], p.out.dtype)}")
    full = "tl.zeros([BLOCK_M, BLOCK_N], tl.int32)"
    if p.epilogue is None:
        stored = cg.to_storage("mmv", p.out.dtype) if p.out.dtype != torch.float32 else "mmv"
        w.line(f"tl.store(out_ptr + ({operand_offset(p.out, 'bidx', 'rm[:, None]', 'rn[None, :]')}), {stored}, mask=xmask)")
        return
    if p.op == "bmm":
        w.line(f"x0 = bidx + {full}")
        w.line(f"x1 = rm[:, None] + {full}")
        w.line(f"x2 = rn[None, :] + {full}")
    else:
        splits = p.epilogue.row_splits()
        for d, (divisor, extent) in enumerate(splits):
            row = "rm[:, None]" if divisor == 1 else f"(rm[:, None] // {divisor})"
            w.line(f"x{d} = {row if d == 0 else f'{row} % {extent}'} + {full}")
        w.line(f"x{len(splits)} = rn[None, :] + {full}")
    local, memo = {p.out.name: "mmv"}, {}
    cg.var_axes["mmv"] = frozenset("x")
    for _, members in cg.items:
        for m in members:
            var = cg.value(m.node.body, memo, local, w, {})
            local[m.node.name] = var
            cg.store(m, var, w)


def finish_source(p: GemmProblem, c: TritonGemmConfig, cg: EpilogueCodegen, w: SourceWriter, name: str,
            tiles: int) -> GeneratedKernel:
    if cg.symbols or cg.host or cg.gather_indices:
        raise NotImplementedError("a GEMM epilogue with run-time sizes or gathers")
    names, tensors, dtypes = ["a_ptr", "b_ptr"], [p.a.name, p.b.name], [p.a.dtype, p.b.dtype]
    if p.bias is not None:
        names.append("c_ptr")
        tensors.append(p.bias.name)
        dtypes.append(p.bias.dtype)
    if p.epilogue is None:
        names.append("out_ptr")
        tensors.append(p.out.name)
        dtypes.append(p.out.dtype)
        written = [p.out.name]
    else:
        for t in dict.fromkeys(cg.read + cg.written):
            names.append(cg.params[t])
            tensors.append(t)
            dtypes.append(cg.dtypes[t])
        written = list(cg.written)
    constexprs = (("BLOCK_M", c.block_m), ("BLOCK_N", c.block_n), ("BLOCK_K", c.block_k), ("GROUP_M", c.group_m))
    head = ["import triton", "import triton.language as tl"]
    if cg.libdevice:
        head.append("from triton.language.extra import libdevice")
    params = names + [f"{k}: tl.constexpr" for k, _ in constexprs]
    lines = head + [""] + cg.helper_sources() + ["", "", "@triton.jit", f"def {name}({', '.join(params)}):"]
    source = "\n".join(lines + w.lines) + "\n"
    ops = [f"aten::{p.op}"] + ([m.node.origin for m in p.epilogue.group.members if m.node.origin] if p.epilogue else [])
    metadata = (
        ("ops", ",".join(dict.fromkeys(ops))),
        ("arg_names", tuple(names)),
        ("arg_types", tuple(f"ptr:{str(d).removeprefix('torch.')}" for d in dtypes)),
        ("constexprs", constexprs),
        ("num_warps", c.num_warps),
        ("num_stages", c.num_stages),
        ("index_dtype", "int64" if largest_offset(p) > INT32_LIMIT else "int32"),
        ("unaligned", tuple(names)),  # program inputs and views may be unaligned: checked at launch
    )
    grid = (sympy.Integer(tiles), sympy.Integer(p.batch))
    return GeneratedKernel(name, source, tuple(tensors), (), (), tuple(written), metadata, grid)
