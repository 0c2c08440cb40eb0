"""Short row sums of a tile of rows, interleaved across SIMD lanes.

A reduction kernel sums each row in a `#pragma omp simd reduction` loop and then folds the
vector accumulator into one number: for short rows (a small matrix product's dot products of
64 or 256 elements, what CPU-generated layers of small models are) that horizontal fold, and
the one dependent accumulator chain per row, cost as much as the multiplies. Here the rows of
an epilogue tile (epilogue_tiles.py) are summed together: each row keeps `lanes` partial sums
in a `[tile][lanes]` array that stays in vector registers, the reduced loop advances `lanes`
elements at a time for every row of the tile (independent chains, one contiguous vector load
per row operand), and the tile's partial sums are folded at the end, 16 rows at once where they
fill a [16][16] float tile (the prelude's `wg_fold16x16`). The demo model's four kernels at
batch 1 took 1.93 -> 1.00 µs a call (g++ 12, AVX-512 EPYC, each kernel timed alone). Only a sum
of one floating-point result over one static reduced dimension, whose loads run along memory
(or stay fixed) in it, takes this form.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from wrapgen.kernels.cpp import build as kernel_build
from wrapgen.loop_ir import Load, Member, red_vars, walk

Generator = Any  # codegen.CppKernelCodegen (which imports this module)
Writer = Any

MAX_REDUCED = 1024  # longer rows amortize their fold, and a tile of them outruns the prefetchers


def lanes(dtype: torch.dtype) -> int:
    """Partial sums per row: one vector register of `dtype`. A tile of 16 rows then holds its
    sums in 16 of the 32 AVX-512 registers, or in all 16 of AVX2's: gcc spills some there, and
    the demo's kernels built for Haswell still went 1.89 -> 1.47 µs."""
    vector_bytes = 64 if kernel_build.has_avx512() else 32
    return vector_bytes // (8 if dtype == torch.float64 else 4)


def eligible(gen: Generator) -> bool:
    """Whether the kernel's first segment is one float sum over one static reduced dimension
    at least one vector long and at most MAX_REDUCED, every load of it contiguous or fixed
    along that dimension, with no other member inside the reduced loop."""
    g, items = gen.group, gen.items
    if len(g.reduced) != 1 or not items or items[0][0] != "segment":
        return False
    members = items[0][1]
    if len(members) != 1 or members[0].level != "reduction":
        return False
    node = members[0].node
    if node.reduction != "sum" or node.acc_dtype not in (torch.float32, torch.float64):
        return False
    extent = sympy.sympify(g.reduced[0])
    if not extent.is_Integer or not lanes(node.acc_dtype) <= int(extent) <= MAX_REDUCED:
        return False
    r = red_vars(1)[0]
    for body in walk(node.body):
        if isinstance(body, Load):
            if body.indirect or body.buffer in gen.row_cache:
                return False
            step = sympy.sympify(body.index).diff(r)
            if step not in (0, 1):
                return False
    return True


def emit(gen: Generator, x: str, bound: str, tile: int, member: Member, memo: dict, local: dict[str, str],
         w: Writer, ctype: Any) -> str:
    """Sum `member` for every row of the tile (rows `{x}t + {x}i`, `{x}i < bound`) into an array,
    store it where the kernel's result is, and return the array's name."""
    node = member.node
    acc_t, out_t = ctype(node.acc_dtype), ctype(node.dtype)
    width = lanes(node.acc_dtype)
    extent = int(sympy.sympify(gen.group.reduced[0]))
    whole = extent - extent % width
    r = str(red_vars(1)[0])
    acc, result = f"lanes{gen.tmp()}", f"tile{gen.tmp()}"
    w.line(f"alignas(64) {acc_t} {acc}[{tile}][{width}] = {{}};")
    w.line(f"{out_t} {result}[{tile}];")

    def accumulate(start: str, stop: str, lane: str) -> None:
        w.line(f"for (int64_t {x}i = 0; {x}i < {bound}; ++{x}i) {{")
        w.depth += 1
        w.line(f"const int64_t {x} = {x}t + {x}i;")
        w.line("#pragma omp simd")
        w.line(f"for (int64_t {r} = {start}; {r} < {stop}; ++{r}) {{")
        w.depth += 1
        value = gen.value(node.body, dict(memo), dict(local), w)
        w.line(f"{acc}[{x}i][{lane}] += static_cast<{acc_t}>({value});")
        w.depth -= 1
        w.line("}")
        w.depth -= 1
        w.line("}")

    block = f"{r}b"
    w.line(f"for (int64_t {block} = 0; {block} < {whole}; {block} += {width}) {{")
    w.depth += 1
    accumulate(block, f"{block} + {width}", f"{r} - {block}")
    w.depth -= 1
    w.line("}")
    if whole < extent:
        accumulate(str(whole), str(extent), f"{r} - {whole}")
    stored = node.name in gen.stored
    tree = tile == 16 and width == 16 and acc_t == out_t == "float"  # the prelude's wg_fold16x16
    if tree:
        w.line(f"wg_fold16x16({acc}, {result});")
        if not stored:
            return result
    w.line(f"for (int64_t {x}i = 0; {x}i < {bound}; ++{x}i) {{")
    w.depth += 1
    if not tree:
        total = gen.tmp()
        w.line(f"{acc_t} {total} = 0;")
        w.line(f"for (int64_t l = 0; l < {width}; ++l) {total} += {acc}[{x}i][l];")
        w.line(f"{result}[{x}i] = static_cast<{out_t}>({total});")
    if stored:
        w.line(f"const int64_t {x} = {x}t + {x}i;")
        gen.store(member, f"{result}[{x}i]", w)
    w.depth -= 1
    w.line("}")
    return result
