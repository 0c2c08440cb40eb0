"""Sibling skinny products in one launch: products of the same few rows by several weights.

A decoding step's query, key and value projections multiply one normalized row by three weights
(2, 0.5 and 0.5 MB in a Llama-style layer). Each alone is a matrix-vector product bound by its
launch and memory latency more than by its bytes: on an H200 the 0.5 MB ones took about as long as
the 2 MB one. One kernel over the concatenated column blocks reads the row once per program and
runs every weight's columns side by side: program `pid` below the first product's block count
computes its columns, the next range the next product's, each with its own weight and output
pointer (the skinny template's body per branch; `triton_skinny.py`). Only products without an
epilogue or bias are grouped; whether the grouped launch beats the separate ones is measured
(`select_group`), against the sum of the separate winners' times.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import sympy
import torch

from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.templates import autotune
from wrapgen.kernels.templates.problem import GemmProblem
from wrapgen.kernels.templates.triton_gemm import EpilogueCodegen, largest_offset, operand_offset
from wrapgen.kernels.templates.triton_skinny import SkinnyConfig, skinny_configs
from wrapgen.kernels.triton.codegen import INT32_LIMIT
from wrapgen.kernels.triton.ops import SourceWriter
from wrapgen.loop_ir import FusionGroup


@dataclass(frozen=True)
class GroupSelection:
    kernel: GeneratedKernel | None  # None: the grouped launch lost (or could not run)
    milliseconds: float | None
    summary: str


def groupable(problem: GemmProblem) -> bool:
    """A plain skinny mm: no epilogue, no bias, no scaling (the grouped body stores the product)."""
    return (problem.op == "mm" and problem.epilogue is None and problem.bias is None and problem.alpha == 1
            and problem.beta == 1 and problem.a.dtype == problem.b.dtype == problem.out.dtype)


def group_configs(problems: list[GemmProblem]) -> list[SkinnyConfig]:
    """The skinny configurations of the widest product (one config serves every branch)."""
    widest = max(problems, key=lambda p: p.n)
    return skinny_configs(widest)


def group_source(problems: list[GemmProblem], config: SkinnyConfig, name: str) -> GeneratedKernel:
    """One kernel computing every product of `problems` (same A, m and k), branch by program id."""
    first, c = problems[0], config
    interpreted = torch.device(first.device).type == "cpu"
    cg = EpilogueCodegen(FusionGroup(first.rows), name, set(), {}, {}, set(), "cpu" if interpreted else "cuda")
    wide = any(largest_offset(p) > INT32_LIMIT for p in problems)
    cast = ".to(tl.int64)" if wide else ""
    w = SourceWriter()
    w.line(f"pid = tl.program_id(0){cast}")
    w.line("bidx = 0")
    w.line(f"rm = tl.arange(0, BLOCK_M){cast}")
    w.line(f"ram = rm % {first.m}")  # rows past m wrap onto real ones: loads stay unmasked, stores masked
    w.line("rk = tl.arange(0, BLOCK_K)")
    start = 0
    for i, p in enumerate(problems):
        blocks = -(-p.n // c.block_n)
        w.line(f"{'if' if i == 0 else 'elif'} pid < {start + blocks}:" if i < len(problems) - 1 else "else:")
        w.depth += 1
        w.line(f"rn = (pid - {start}) * BLOCK_N + tl.arange(0, BLOCK_N)")
        hint = f"tl.max_contiguous(tl.multiple_of(rn % {p.n}, BLOCK_N), BLOCK_N)"
        w.line(f"rbn = {hint if p.n % c.block_n == 0 else f'rn % {p.n}'}")
        w.line("acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)")
        w.line(f"for k0 in range(0, {p.k}, BLOCK_K):")
        w.depth += 1
        w.line("kk = k0 + rk")
        mask = "" if p.k % c.block_k == 0 else f", mask=kk[None, :] < {p.k}, other=0.0"
        a_load = f"tl.load(a_ptr + ({operand_offset(p.a, 'bidx', 'ram[:, None]', 'kk[None, :]')}){mask})"
        b_load = f"tl.load(b_ptr{i} + ({operand_offset(p.b, 'bidx', 'kk[None, :]', 'rbn[:, None]')}){mask})"
        w.line(f"a = {cg.widen(a_load, p.a.dtype)}")
        w.line(f"b = {cg.widen(b_load, p.b.dtype)}")
        w.line("acc3 += a[:, None, :] * b[None, :, :]")
        w.depth -= 1
        w.line("acc = tl.sum(acc3, axis=2)")
        value = "acc"
        if p.out.dtype != torch.float32:
            w.line(f"mmv = {cg.render('cast', ['acc'], [torch.float32], p.out.dtype)}")
            value = cg.to_storage("mmv", p.out.dtype)
        offset = operand_offset(p.out, "bidx", "rm[:, None]", "rn[None, :]")
        w.line(f"tl.store(out_ptr{i} + ({offset}), {value}, mask=(rm[:, None] < {p.m}) & (rn[None, :] < {p.n}))")
        w.depth -= 1
        start += blocks
    names, tensors, dtypes = ["a_ptr"], [first.a.name], [first.a.dtype]
    for i, p in enumerate(problems):
        names += [f"b_ptr{i}", f"out_ptr{i}"]
        tensors += [p.b.name, p.out.name]
        dtypes += [p.b.dtype, p.out.dtype]
    constexprs = (("BLOCK_M", c.block_m), ("BLOCK_N", c.block_n), ("BLOCK_K", c.block_k))
    params = names + [f"{k}: tl.constexpr" for k, _ in constexprs]
    head = ["import triton", "import triton.language as tl", *cg.helper_sources(), "", "", "@triton.jit",
            f"def {name}({', '.join(params)}):"]
    metadata = (
        ("ops", "aten::mm"),
        ("arg_names", tuple(names)),
        ("arg_types", tuple(f"ptr:{str(d).removeprefix('torch.')}" for d in dtypes)),
        ("constexprs", constexprs),
        ("num_warps", c.num_warps),
        ("num_stages", c.num_stages),
        ("index_dtype", "int64" if wide else "int32"),
        ("unaligned", tuple(names)),  # program inputs and views may be unaligned: checked at launch
    )
    written = tuple(p.out.name for p in problems)
    grid = (sympy.Integer(start), sympy.Integer(1))
    return GeneratedKernel(name, "\n".join(head + w.lines) + "\n", tuple(tensors), (), (), written, metadata, grid)


def select_group(problems: list[GemmProblem], name: str, separate_ms: float) -> GroupSelection:
    """The fastest grouped launch of `problems`, when it beats `separate_ms` (the separate
    winners' summed time); measured once, the result cached on disk like a product's."""
    candidates = [autotune.Candidate(c.tag, group_source(problems, c, f"{name}_g{i}"))
                  for i, c in enumerate(group_configs(problems))]
    h = hashlib.sha256()
    for part in [p.key() for p in problems] + [autotune._versions(problems[0], "triton")]:
        h.update(part.encode() + b"\0")
    for c in candidates:
        h.update(c.kernel.source.replace(c.kernel.name, "KERNEL").encode() + b"\0")
    key = "group_" + h.hexdigest()[:40]
    cached = autotune._read_cache(key)
    if cached is None:
        tensors: dict[str, torch.Tensor] = {}
        for p in problems:
            tensors.update({k: v for k, v in autotune._stand_ins(p).items() if k not in tensors})
        from wrapgen.kernels.templates.runners import triton_runners

        runners = triton_runners(candidates, tensors, problems[0])
        cuda = torch.device(problems[0].device).type == "cuda"
        cached = {"timings": {c.tag: (None if runners.get(c.tag) is None else autotune._time(runners[c.tag], cuda))
                              for c in candidates}}
        autotune._write_cache(key, cached)
    timings = {t: ms for t, ms in cached["timings"].items() if ms is not None}
    described = " + ".join(p.describe() for p in problems)
    if not timings:
        return GroupSelection(None, None, f"grouped {described}: no candidate ran, separate launches")
    best = min(timings, key=timings.get)
    chosen = timings[best] < separate_ms
    summary = (f"grouped {described}: {best} {timings[best]:.4f}ms{'*' if chosen else ''}, "
               f"separate {separate_ms:.4f}ms{'' if chosen else '*'}")
    winner = next(c for c in candidates if c.tag == best)
    return GroupSelection(winner.kernel if chosen else None, timings[best], summary)
