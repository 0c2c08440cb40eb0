"""A bmm against one matrix broadcast over the batch becomes one mm (lowering/graph_passes/broadcast_bmm.py):
nn.MultiheadAttention's in-projection of a sequence-first view, both fold orders of the rows,
and the cases it must leave alone, on every target against eager."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir.lines import ExternKernel

TARGETS = ["python", "cpp", "fx"]


def extern_ops(model: torch.nn.Module, inputs: tuple, **options: object) -> list[str]:
    with wrapgen.config.patch(**options), torch.no_grad():
        program = wrapgen.lower(model, inputs)
    return [line.op for line in program.lines if isinstance(line, ExternKernel)]


def check_every_target(model: torch.nn.Module, make_input, **tolerance: float) -> None:
    with torch.no_grad():
        for target in TARGETS:
            compiled = wrapgen.compile(model, (make_input(),), target=target)
            for _ in range(2):
                x = make_input()
                torch.testing.assert_close(compiled(x), model(x), **tolerance)


class AttentionBlock(torch.nn.Module):
    """torchvision's ViT encoder block's attention half: batch-first MultiheadAttention."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        y, _ = self.attention(y, y, y, need_weights=False)
        return x + y


class BroadcastProduct(torch.nn.Module):
    """bmm of the input (as given, or transposed to sequence-first) by one weight expanded over
    the batch: the two orders its rows fold in (reduced length 96: a library product, not a
    generated kernel)."""

    def __init__(self, transpose: bool, depth: int = 96, columns: int = 40) -> None:
        super().__init__()
        self.transpose = transpose
        self.weight = torch.nn.Parameter(torch.randn(depth, columns))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.transpose(0, 1) if self.transpose else x
        return torch.bmm(a, self.weight.expand(a.shape[0], *self.weight.shape)).relu()


def test_multihead_attention_projection_is_one_mm():
    model = AttentionBlock().eval()
    ops = extern_ops(model, (torch.randn(2, 197, 64),))
    assert not any("bmm" in op for op in ops), ops
    assert "aten::mm.out" in ops
    assert extern_ops(model, (torch.randn(2, 197, 64),), kernels=False).count("aten::mm.out") >= 1
    check_every_target(model, lambda: torch.randn(2, 197, 64))


@pytest.mark.parametrize("transpose", [False, True], ids=["batch-major", "row-major"])
def test_both_fold_orders(transpose: bool):
    model = BroadcastProduct(transpose).eval()
    ops = extern_ops(model, (torch.randn(6, 5, 96),))
    assert "aten::mm.out" in ops and not any("bmm" in op for op in ops), ops
    check_every_target(model, lambda: torch.randn(6, 5, 96))


class SlicedRows(BroadcastProduct):
    def __init__(self, rows: slice) -> None:
        super().__init__(False)
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x[:, self.rows, :]
        return torch.bmm(a, self.weight.expand(a.shape[0], *self.weight.shape))


@pytest.mark.parametrize("rows, folds", [(slice(None, None, 2), True), (slice(None, 3), False)],
                         ids=["every-other-row-folds", "first-rows-do-not"])
def test_strided_rows(rows: slice, folds: bool):
    # [4, 6, 96][:, ::2] has batch stride 576 = 3 rows x 192: one row dim; [:, :3] has batch
    # stride 576 against 3 rows x 96, and row stride 96 against 4 x 576: no single row stride.
    model = SlicedRows(rows).eval()
    ops = extern_ops(model, (torch.randn(4, 6, 96),))
    assert any("bmm" in op for op in ops) != folds, ops
    check_every_target(model, lambda: torch.randn(4, 6, 96))


def test_a_batch_of_different_matrices_keeps_the_bmm():
    class Batched(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.bmm(a, a.transpose(1, 2))

    ops = extern_ops(Batched(), (torch.randn(3, 5, 80),))
    assert any("bmm" in op for op in ops), ops
    check_every_target(Batched(), lambda: torch.randn(3, 5, 80))


def test_dynamic_batch_keeps_the_bmm_and_is_correct():
    model = BroadcastProduct(False).eval()
    with torch.no_grad():
        compiled = wrapgen.compile(model, (torch.randn(6, 5, 96),), target="python", dynamic=True)
        for batch in (3, 7):
            x = torch.randn(batch, 5, 96)
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_multihead_attention(dtype: torch.dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = AttentionBlock(128, 4).cuda().to(dtype).eval()
    tolerance = {} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    check_every_target(model, lambda: torch.randn(4, 197, 128, device="cuda", dtype=dtype), **tolerance)


def test_an_input_named_like_a_builtin_keeps_its_binding():
    # The pass copies the graph, and fx renames a copied placeholder that shadows a builtin
    # (`input` becomes `input_1`): the program must still bind the caller's argument to it.
    class Named(BroadcastProduct):
        def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the name under test
            return torch.bmm(input, self.weight.expand(input.shape[0], *self.weight.shape))

    model = Named(False).eval()
    assert "aten::mm.out" in extern_ops(model, (torch.randn(6, 5, 96),))
    check_every_target(model, lambda: torch.randn(6, 5, 96))
