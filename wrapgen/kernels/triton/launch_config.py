"""Launch configuration of a generated Triton kernel: block sizes and warps from the problem size,
and whether a reduction keeps whole rows in registers (persistent) or loops over them."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

PERSISTENT_LIMIT = 8192


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes and warps, chosen from the problem size."""

    xblock: int
    rblock: int | None
    num_warps: int
    persistent: bool


# A column reduction (the reduced dimension strided, the kept one contiguous: a bias gradient,
# a layer norm's weight gradient) reads, per reduced element, XBLOCK neighbouring kept elements.
# At least this many make one 32-byte memory sector of float32 per row, instead of two elements
# (8 bytes) of each sector, which the row-reduction blocks below would give it.
COLUMN_XBLOCK = 8
# A row reduction that reads one operand transposed (DeBERTa-v2's softmax over scores plus its
# position-to-content term, stored [key, query]) reads that operand XBLOCK rows at a time per
# reduced element: 8 rows of 512 gave it 16 bytes of each 32-byte sector of bf16. At most
# TRANSPOSED_ELEMENTS per program (16 rows of 512, 8 of 1024: 16 values per thread at 16 warps).
TRANSPOSED_XBLOCK = 16
TRANSPOSED_ELEMENTS = 8192
# Rows per program of a persistent row reduction read along its rows: SHORT_ROWS_XBLOCK rows of
# up to SHORT_ROW elements (a window attention's softmax over 49, a layer norm over 96 channels),
# else up to ROW_ELEMENTS elements (one row of 1024). Measured on an H200 over the suite's layer
# norms and softmaxes (both dtypes), against 4096 elements per program: those over 49-1024
# elements ran 22-47% faster; 4 or 8 rows of 128 ran up to twice as long as 16.
SHORT_ROW = 128
SHORT_ROWS_XBLOCK = 16
ROW_ELEMENTS = 1024
# A column reduction keeps a whole column block in registers (persistent) only up to this many
# elements (8 columns of 2048 rows: 32 per thread at 16 warps); longer ones loop over the rows.
COLUMN_PERSISTENT_ELEMENTS = 16384


def choose_config(xnumel: sympy.Expr, rnumel: sympy.Expr | None, hint: dict, column: bool = False,
                  transposed: bool = False) -> LaunchConfig:
    """`column`: the reduction reads along a strided reduced dimension (see COLUMN_XBLOCK);
    `transposed`: some operand of it does (see TRANSPOSED_XBLOCK)."""
    x = int(sympy.sympify(xnumel).xreplace(hint)) if hint is not None else 1
    if rnumel is None:  # pointwise: 1024 elements per program for large problems, fewer for small
        xblock = min(1024, next_pow2(max(x, 1)))
        return LaunchConfig(xblock, None, max(1, min(4, xblock // 256)), False)
    r_static = sympy.sympify(rnumel).is_Integer
    r = int(sympy.sympify(rnumel).xreplace(hint))
    columns = min(COLUMN_XBLOCK, next_pow2(max(x, 1))) if column else 1
    in_registers = not column or columns * next_pow2(max(r, 1)) <= COLUMN_PERSISTENT_ELEMENTS
    if r_static and r <= PERSISTENT_LIMIT and in_registers:
        rblock = next_pow2(max(r, 1))
        rows = min(next_pow2(max(x, 1)), _rows_per_program(rblock))
        tiles = min(TRANSPOSED_XBLOCK, max(1, TRANSPOSED_ELEMENTS // rblock), next_pow2(max(x, 1))) \
            if transposed and not column else 1
        xblock = max(columns, tiles, rows)
        warps = max(1, min(16, xblock * rblock // 256))
        return LaunchConfig(xblock, rblock, warps, True)
    rblock = min(2048, next_pow2(max(r, 1)))
    xblock = max(columns, 1 if r >= 256 else max(1, min(64, 2048 // rblock, next_pow2(max(x, 1)))))
    return LaunchConfig(xblock, rblock, max(1, min(8, xblock * rblock // 256)), False)


def _rows_per_program(rblock: int) -> int:
    """Rows a persistent row reduction keeps per program (see SHORT_ROWS_XBLOCK)."""
    if rblock <= SHORT_ROW:
        return min(64, max(SHORT_ROWS_XBLOCK, ROW_ELEMENTS // rblock))
    return max(1, ROW_ELEMENTS // rblock)
