"""Block sizes of persistent row reductions: rows per program by row length, wider tiles for an
operand read with a stride along the reduced dimension (and the kernels still match eager)."""

from __future__ import annotations

import sympy
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.kernels.triton.launch_config import (
    ROW_ELEMENTS,
    SHORT_ROWS_XBLOCK,
    TRANSPOSED_ELEMENTS,
    TRANSPOSED_XBLOCK,
    choose_config,
)
from wrapgen.wrapper_ir.lines import KernelDefinition


def blocks(rows: int, row_length: int, transposed: bool = False) -> tuple[int, int, int]:
    config = choose_config(sympy.Integer(rows), sympy.Integer(row_length), {}, transposed=transposed)
    assert config.persistent
    return config.xblock, config.rblock, config.num_warps


def test_short_rows_take_sixteen_per_program_long_ones_up_to_row_elements() -> None:
    assert blocks(301056, 49) == (SHORT_ROWS_XBLOCK, 64, 4)  # a 7x7 window attention's softmax
    assert blocks(100352, 96) == (SHORT_ROWS_XBLOCK, 128, 8)  # a layer norm over 96 channels
    assert blocks(4096, 16) == (ROW_ELEMENTS // 16, 16, 4)  # short rows: at least ROW_ELEMENTS
    assert blocks(8192, 384) == (ROW_ELEMENTS // 512, 512, 4)
    assert blocks(8192, 768) == (1, 1024, 4)
    assert blocks(64, 4096) == (1, 4096, 16)
    assert blocks(3, 49) == (4, 64, 1)  # never more rows than there are


def test_a_strided_operand_widens_the_tile_up_to_transposed_elements() -> None:
    assert blocks(8192, 512, transposed=True)[0] == TRANSPOSED_XBLOCK
    assert blocks(8192, 768, transposed=True) == (TRANSPOSED_ELEMENTS // 1024, 1024, 16)
    assert blocks(8192, 49, transposed=True)[0] == SHORT_ROWS_XBLOCK


def vit_embedding_norm(patches: torch.Tensor, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """ViT's class token before its patches (channels first), plus positions, layer-normed."""
    tokens = torch.cat([token.expand(patches.shape[0], -1, -1), patches.flatten(2).transpose(1, 2)], dim=1)
    return F.layer_norm(tokens + position, (patches.shape[1],))


def test_a_layer_norm_reading_its_rows_shifted_and_transposed_takes_a_wide_tile() -> None:
    """The patches are read at a stride of 16 along the normalized channels, behind a shift of
    one row (the class token): the kernel takes several rows per program, and matches eager."""
    args = (torch.randn(2, 768, 4, 4), torch.randn(1, 1, 768), torch.randn(1, 17, 768))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(vit_embedding_norm, args)
        compiled = wrapgen.compile(vit_embedding_norm, args, target="python")
    norms = [dict(dict(k.metadata)["constexprs"]) for k in program.lines
             if isinstance(k, KernelDefinition) and "layer_norm" in k.name]
    assert norms and all(c["RBLOCK"] == 1024 and c["XBLOCK"] > 1 for c in norms), norms
    fresh = tuple(torch.randn_like(a) for a in args)
    torch.testing.assert_close(compiled(*fresh), vit_embedding_norm(*fresh), rtol=1e-4, atol=1e-4)
