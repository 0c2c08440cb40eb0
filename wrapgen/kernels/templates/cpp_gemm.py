"""The CPU GEMM template: a register-blocked C++ micro-kernel with the epilogue fused.

Layout of one instance (all sizes and strides are compile-time constants):

    parallel (OpenMP) over output tiles BM x BN (and the batch)
      float acc[BM][BN] = 0
      for each K block of BK:  pack A's BM x BK and B's BK x BN blocks (float, zero padded)
        for each MR x NR micro-tile: MR x NR/VW vector accumulators held in registers
          (GCC vector extensions: VW = 16 floats with AVX-512, the same code as two AVX2
          halves otherwise), k loop of broadcast-multiply-adds
      epilogue per element of the tile (simd over columns): alpha * acc + beta * bias,
      rounded to the product's dtype, then the fused pointwise group's statements

Operands of half dtypes are widened while packing, so accumulation is float32 throughout.
Packing makes any strides (a transposed weight) read as contiguous panels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wrapgen.kernels.cpp.build import has_avx512
from wrapgen.kernels.cpp.codegen import STORAGE_CTYPES, CppKernelCodegen, GeneratedKernel, _Writer, narrow, widen
from wrapgen.kernels.templates.problem import GemmProblem, Operand

# below this many multiply-adds one thread does the whole product (no OpenMP fork)
PARALLEL_WORK = 1 << 18


@dataclass(frozen=True)
class CppGemmConfig:
    bm: int
    bn: int
    bk: int
    mr: int
    nr: int

    @property
    def tag(self) -> str:
        return f"cpp_gemm_{self.bm}x{self.bn}x{self.bk}_r{self.mr}x{self.nr}"


def vector_width() -> int:
    return 16 if has_avx512() else 8


def cpp_configs(problem: GemmProblem) -> list[CppGemmConfig]:
    """Candidate tilings: NR a multiple of the vector width, MR x NR/VW accumulators in registers."""
    vw = vector_width()
    configs = [
        CppGemmConfig(48, 2 * vw, 256, 6, 2 * vw),
        CppGemmConfig(64, 4 * vw, 256, 4, 2 * vw),
        CppGemmConfig(96, 4 * vw, 128, 6, 2 * vw),
        CppGemmConfig(32, 2 * vw, 512, 4, vw),
        CppGemmConfig(64, 8 * vw, 128, 4, 4 * vw),
    ]
    # tiles far larger than the product only waste work: keep those that fit (and the smallest)
    fitting = [c for c in configs if c.bm <= max(problem.m, 32) * 2 and c.bn <= max(problem.n, vw) * 2]
    return fitting or configs[-2:-1]


def _element(op: Operand, batch: str, row: str, col: str) -> str:
    sb, sr, sc = op.strides
    parts = [f"{s} * ({v})" for s, v in ((sb, batch), (sr, row), (sc, col)) if s != 0]
    return f"{' + '.join(parts) or '0'}"


def cpp_gemm_source(problem: GemmProblem, config: CppGemmConfig, name: str) -> GeneratedKernel:
    """One template instance for `problem` with tiling `config`."""
    p, c = problem, config
    vw = vector_width()
    w = _Writer()
    epilogue = _EpilogueWriter(p, name)
    tiles_m, tiles_n = -(-p.m // c.bm), -(-p.n // c.bn)
    tiles = p.batch * tiles_m * tiles_n
    w.line(f"typedef float wg_vec __attribute__((vector_size({4 * vw})));")
    if p.batch * p.m * p.n * p.k >= PARALLEL_WORK and tiles > 1:
        w.line("#pragma omp parallel for schedule(static)")
    w.line(f"for (int64_t tile = 0; tile < {tiles}; ++tile) {{")
    w.depth += 1
    w.line(f"const int64_t bidx = tile / {tiles_m * tiles_n};")
    w.line(f"const int64_t i0 = ((tile % {tiles_m * tiles_n}) / {tiles_n}) * {c.bm};")
    w.line(f"const int64_t j0 = (tile % {tiles_n}) * {c.bn};")
    w.line(f"alignas(64) float acc[{c.bm}][{c.bn}] = {{}};")
    # packed panels: A as [BM/MR][BK][MR], B as [BN/NR][BK][NR], so the micro-kernel streams
    # through both sequentially
    w.line(f"alignas(64) float ap[{c.bm * c.bk}];")
    w.line(f"alignas(64) float bp[{c.bk * c.bn}];")
    w.line(f"for (int64_t k0 = 0; k0 < {p.k}; k0 += {c.bk}) {{")
    w.depth += 1
    w.line(f"const int64_t kb = std::min<int64_t>({c.bk}, {p.k} - k0);")
    a_elem = widen(f"a_ptr[{_element(p.a, 'bidx', 'i0 + i', 'k0 + k')}]", p.a.dtype)
    b_elem = widen(f"b_ptr[{_element(p.b, 'bidx', 'k0 + k', 'j0 + j')}]", p.b.dtype)
    a_slot = f"ap[(i / {c.mr}) * {c.bk * c.mr} + k * {c.mr} + i % {c.mr}]"
    b_slot = f"bp[(j / {c.nr}) * {c.bk * c.nr} + k * {c.nr} + j % {c.nr}]"
    # the loop along the operand's contiguous dimension innermost (a transposed weight reads along k)
    a_loops = ("i", c.bm, "k", "kb") if abs(p.a.strides[2]) <= abs(p.a.strides[1]) else ("k", "kb", "i", c.bm)
    b_loops = ("k", "kb", "j", c.bn) if abs(p.b.strides[2]) <= abs(p.b.strides[1]) else ("j", c.bn, "k", "kb")
    w.line(f"for (int64_t {a_loops[0]} = 0; {a_loops[0]} < {a_loops[1]}; ++{a_loops[0]})")
    w.line(f"  for (int64_t {a_loops[2]} = 0; {a_loops[2]} < {a_loops[3]}; ++{a_loops[2]})")
    w.line(f"    {a_slot} = i0 + i < {p.m} ? {a_elem} : 0.0f;")
    w.line(f"for (int64_t {b_loops[0]} = 0; {b_loops[0]} < {b_loops[1]}; ++{b_loops[0]})")
    w.line(f"  for (int64_t {b_loops[2]} = 0; {b_loops[2]} < {b_loops[3]}; ++{b_loops[2]})")
    w.line(f"    {b_slot} = j0 + j < {p.n} ? {b_elem} : 0.0f;")
    nv = c.nr // vw
    w.line(f"for (int64_t ii = 0; ii < {c.bm}; ii += {c.mr}) {{")
    w.line(f"  for (int64_t jj = 0; jj < {c.bn}; jj += {c.nr}) {{")
    w.line(f"    wg_vec cv[{c.mr}][{nv}];")
    w.line(f"    for (int r = 0; r < {c.mr}; ++r) for (int v = 0; v < {nv}; ++v)")
    w.line(f"      cv[r][v] = *reinterpret_cast<const wg_vec*>(&acc[ii + r][jj + v * {vw}]);")
    w.line(f"    const float* __restrict__ apanel = ap + (ii / {c.mr}) * {c.bk * c.mr};")
    w.line(f"    const float* __restrict__ bpanel = bp + (jj / {c.nr}) * {c.bk * c.nr};")
    w.line("    for (int64_t k = 0; k < kb; ++k) {")
    w.line(f"      wg_vec bv[{nv}];")
    w.line(f"      for (int v = 0; v < {nv}; ++v) bv[v] = *reinterpret_cast<const wg_vec*>(bpanel + k * {c.nr} + v * {vw});")
    w.line(f"      #pragma GCC unroll {c.mr}")
    w.line(f"      for (int r = 0; r < {c.mr}; ++r) {{")
    w.line(f"        const float av = apanel[k * {c.mr} + r];")
    w.line(f"        #pragma GCC unroll {nv}")
    w.line(f"        for (int v = 0; v < {nv}; ++v) cv[r][v] += av * bv[v];")
    w.line("      }")
    w.line("    }")
    w.line(f"    for (int r = 0; r < {c.mr}; ++r) for (int v = 0; v < {nv}; ++v)")
    w.line(f"      *reinterpret_cast<wg_vec*>(&acc[ii + r][jj + v * {vw}]) = cv[r][v];")
    w.line("  }")
    w.line("}")
    w.depth -= 1
    w.line("}")
    # the epilogue, element by element over the valid part of the tile
    w.line(f"const int64_t mi = std::min<int64_t>({c.bm}, {p.m} - i0);")
    w.line(f"const int64_t nj = std::min<int64_t>({c.bn}, {p.n} - j0);")
    w.line("for (int64_t i = 0; i < mi; ++i) {")
    w.depth += 1
    w.line("#pragma omp simd")
    w.line("for (int64_t j = 0; j < nj; ++j) {")
    w.depth += 1
    epilogue.write(w)
    for _ in range(3):
        w.depth -= 1
        w.line("}")
    return epilogue.finish(w)


class _EpilogueWriter:
    """The product of one element, then the fused group's statements (C++ codegen's renderer)."""

    def __init__(self, problem: GemmProblem, name: str) -> None:
        self.p, self.name = problem, name
        ep = problem.epilogue
        self.codegen = CppKernelCodegen(ep.group, name, set(ep.needed), ep.dtypes) if ep else None

    def product(self, w: _Writer) -> str:
        p = self.p
        text = "acc[i][j]" if p.alpha == 1 else f"{float(p.alpha)!r}f * acc[i][j]"
        if p.bias is not None:
            bias = widen(f"c_ptr[{_element(p.bias, 'bidx', 'i0 + i', 'j0 + j')}]", p.bias.dtype)
            text = f"{text} + {bias}" if p.beta == 1 else f"{text} + {float(p.beta)!r}f * {bias}"
        rounded = {"torch.bfloat16": "wg_round_bf16", "torch.float16": "wg_round_half"}.get(str(p.out.dtype))
        w.line(f"const float mmv = {f'{rounded}({text})' if rounded else text};")
        return "mmv"

    def write(self, w: _Writer) -> None:
        value = self.product(w)
        if self.codegen is None:
            out = self.p.out
            w.line(f"out_ptr[{_element(out, 'bidx', 'i0 + i', 'j0 + j')}] = {narrow(value, torch.float32, out.dtype)};")
            return
        if self.p.op == "bmm":
            w.line("const int64_t x0 = bidx; const int64_t x1 = i0 + i; const int64_t x2 = j0 + j;")
        else:
            splits = self.p.epilogue.row_splits()
            for d, (divisor, extent) in enumerate(splits):
                row = "(i0 + i)" if divisor == 1 else f"((i0 + i) / {divisor})"
                w.line(f"const int64_t x{d} = {row if d == 0 else f'{row} % {extent}'};")
            w.line(f"const int64_t x{len(splits)} = j0 + j;")
        cg, memo, local = self.codegen, {}, {self.p.out.name: value}
        for _, members in cg.items:
            for m in members:
                var = cg.value(m.node.body, memo, local, w)
                local[m.node.name] = var
                cg.store(m, var, w)

    def finish(self, w: _Writer) -> GeneratedKernel:
        p = self.p
        params = [f"const {STORAGE_CTYPES[p.a.dtype]}* __restrict__ a_ptr",
                  f"const {STORAGE_CTYPES[p.b.dtype]}* __restrict__ b_ptr"]
        tensors = [p.a.name, p.b.name]
        if p.bias is not None:
            params.append(f"const {STORAGE_CTYPES[p.bias.dtype]}* __restrict__ c_ptr")
            tensors.append(p.bias.name)
        written: list[str] = []
        if self.codegen is None:
            params.append(f"{STORAGE_CTYPES[p.out.dtype]}* __restrict__ out_ptr")
            tensors.append(p.out.name)
            written.append(p.out.name)
        else:
            cg = self.codegen
            if cg.symbols or cg.host or cg.gather_indices:
                raise NotImplementedError("a GEMM epilogue with run-time sizes or gathers")
            for t in dict.fromkeys(cg.read_from_memory + cg.written):
                const = "" if t in cg.written else "const "
                params.append(f"{const}{STORAGE_CTYPES[cg.dtypes[t]]}* __restrict__ {cg.params[t]}")
                tensors.append(t)
            written = list(cg.written)
        source = "\n".join([f'extern "C" void {self.name}({", ".join(params)}) {{', *w.lines, "}"]) + "\n"
        origins = [m.node.origin for m in p.epilogue.group.members if m.node.origin] if p.epilogue else []
        ops = ",".join(dict.fromkeys([f"aten::{p.op}", *origins]))
        return GeneratedKernel(self.name, source, tuple(tensors), (), (), tuple(written),
                               (("device", "cpu"), ("ops", ops)))
