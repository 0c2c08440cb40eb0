"""The C++ kernel of `index_put(self, [index], values, accumulate=True)` on a 2-d `self`: the
embedding backward (each token's gradient row added into its vocabulary row).

Rows are added in index order, so duplicate indices (a token seen twice) accumulate exactly as
eager's serial CPU kernel does, with no atomics and the same result every run. The parallel
loop is over blocks of columns: each thread owns its columns of every row, so no two threads
add into the same element. An index outside [-rows, rows) sets the kernel's status (the
caller raises IndexError) and that entry is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from wrapgen.kernels.cpp.codegen import PARALLEL_THRESHOLD, STATUS_KEY, GeneratedKernel
from wrapgen.kernels.cpp.printer import cpp_index

COLUMN_BLOCK = 64  # columns per parallel block: whole cache lines, a few vectors


@dataclass(frozen=True)
class IndexPutAccumulate:
    """The buffers and element indices of one accumulate-index_put, all sizes static.

    `index_at` / `values_at` are element indices over loop variables `x0..` (the index tensor's
    dims; `values_at` also over `j`, the column); `out_at` is over `row` and `j`."""

    out: str
    index: str
    values: str
    index_sizes: tuple[int, ...]
    rows: int
    columns: int
    index_at: sympy.Expr
    values_at: sympy.Expr
    out_at: sympy.Expr
    dtype: torch.dtype
    index_dtype: torch.dtype


_CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t"}


def generate_index_put(spec: IndexPutAccumulate, name: str) -> GeneratedKernel:
    t, it = _CTYPES[spec.dtype], _CTYPES[spec.index_dtype]
    xs = [f"x{d}" for d in range(len(spec.index_sizes))]
    work = spec.columns * max(1, int(sympy.Mul(*spec.index_sizes)))
    lines = [f'extern "C" int64_t {name}(const {it}* __restrict__ in_ptr0, const {t}* __restrict__ in_ptr1, '
             f'{t}* __restrict__ out_ptr2) {{',
             "  int64_t wg_bad_index = 0;"]
    if work >= PARALLEL_THRESHOLD:
        lines.append("  #pragma omp parallel for")
    lines.append(f"  for (int64_t jb = 0; jb < {spec.columns}; jb += {COLUMN_BLOCK}) {{")
    lines.append(f"    const int64_t je = jb + {COLUMN_BLOCK} < {spec.columns} ? jb + {COLUMN_BLOCK} : {spec.columns};")
    depth = 2
    for x, extent in zip(xs, spec.index_sizes):
        lines.append("  " * depth + f"for (int64_t {x} = 0; {x} < {extent}; ++{x}) {{")
        depth += 1
    pad = "  " * depth
    lines += [
        f"{pad}int64_t row = static_cast<int64_t>(in_ptr0[{cpp_index(spec.index_at)}]);",
        f"{pad}if (row < 0) row += {spec.rows};",
        f"{pad}if (row < 0 || row >= {spec.rows}) {{ __atomic_store_n(&wg_bad_index, 1, __ATOMIC_RELAXED); continue; }}",
        f"{pad}#pragma omp simd",
        f"{pad}for (int64_t j = jb; j < je; ++j) {{",
        f"{pad}  out_ptr2[{cpp_index(spec.out_at)}] += in_ptr1[{cpp_index(spec.values_at)}];",
        f"{pad}}}",
    ]
    for _ in range(len(xs) + 1):
        depth -= 1
        lines.append("  " * depth + "}")
    lines += ["  return wg_bad_index;", "}"]
    source = "\n".join(lines) + "\n"
    metadata = (("device", "cpu"), ("ops", "aten::index_put.default"), (STATUS_KEY, True))
    return GeneratedKernel(name, source, (spec.index, spec.values, spec.out), (), (), (spec.out,), metadata)
