"""Short row sums of a tile of rows interleaved across SIMD lanes (kernels/cpp/lane_tiles.py):
small matrix products with and without epilogues, row sums whose length is not a multiple of
the vector, partial tiles, stored sums, float64 and bfloat16 rows, results equal to eager's;
sums the form does not fit (max, strided rows, long rows) keep the plain row loop."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.kernels.cpp import lane_tiles
from wrapgen.wrapper_ir import KernelDefinition


def _sources(compiled) -> list[str]:
    return [line.source for line in compiled.program.lines if isinstance(line, KernelDefinition)]


def _lane_tiled(compiled) -> bool:
    return any("lanesv" in s for s in _sources(compiled))


class Layers(torch.nn.Module):
    """fc -> gelu -> fc (no epilogue) -> + gated residual: the demo block's three small products."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down, self.gate = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim, bias=False), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x))) * torch.sigmoid(self.gate(x))


@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("dim,hidden,batch", [(64, 256, 1), (70, 37, 3), (20, 9, 2)],
                         ids=["demo-sizes", "tails", "short-rows"])
def test_small_products_equal_eager(target: str, dim: int, hidden: int, batch: int) -> None:
    torch.manual_seed(0)
    model = Layers(dim, hidden).eval()
    with torch.no_grad():
        compiled = wrapgen.compile(model, (torch.randn(batch, dim),), target=target)
        assert _lane_tiled(compiled), _sources(compiled)
        for _ in range(3):
            x = torch.randn(batch, dim)
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_sums_stored_and_finished_equal_eager(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = x.sum(-1)
        return total, total * 2.0  # exact: a bf16 eager rounds `total` before what follows, we do not

    x = torch.randn(5, 33, 100).to(dtype)  # 100 = whole vectors and a tail; 33 rows = 2 tiles + 1
    compiled = wrapgen.compile(fn, (x,), target="cpp")
    assert _lane_tiled(compiled), _sources(compiled)
    for _ in range(2):
        x = torch.randn(5, 33, 100).to(dtype)
        for got, want in zip(compiled(x), fn(x)):
            torch.testing.assert_close(got, want)


def test_sums_the_form_does_not_fit_keep_the_row_loop() -> None:
    cases = {
        "max": (lambda x: x.amax(-1), (8, 64)),
        "strided rows": (lambda x: x.sum(0), (64, 8)),
        "long rows": (lambda x: x.sum(-1), (4, lane_tiles.MAX_REDUCED + 16)),
        "one row": (lambda x: x.sum(-1), (1, 64)),
    }
    for name, (fn, shape) in cases.items():
        compiled = wrapgen.compile(fn, (torch.randn(shape),), target="cpp")
        assert not _lane_tiled(compiled), name
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))


def test_eight_lane_tiles_of_avx2_hosts_equal_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX-512 a row keeps 8 float lanes and its sums are folded one row at a time."""
    monkeypatch.setattr(lane_tiles.kernel_build, "has_avx512", lambda: False)
    torch.manual_seed(0)
    model = Layers(70, 37).eval()
    with torch.no_grad():
        compiled = wrapgen.compile(model, (torch.randn(3, 70),), target="cpp")
        assert any("[16][8]" in s for s in _sources(compiled)), _sources(compiled)
        x = torch.randn(3, 70)
        torch.testing.assert_close(compiled(x), model(x))
