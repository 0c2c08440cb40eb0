"""C++ reduction kernels whose rows end in a costly function (a small product's GELU or SiLU) run
that epilogue in a SIMD loop over a tile of rows instead of once per row inside the reduction's
loop; partial tiles, cheap epilogues and dynamic row counts included, results equal eager's."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir import KernelDefinition


class Product(torch.nn.Module):
    def __init__(self, inputs: int, outputs: int, activation) -> None:
        super().__init__()
        self.fc, self.activation = torch.nn.Linear(inputs, outputs), activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.fc(x))


def _sources(compiled) -> list[str]:
    return [line.source for line in compiled.program.lines if isinstance(line, KernelDefinition)]


@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("inputs,outputs,batch,activation", [
    (32, 40, 1, torch.nn.functional.gelu),   # 40 rows: two full tiles and a partial one
    (32, 48, 2, torch.nn.functional.silu),
    (16, 24, 2, torch.tanh),
], ids=["gelu-partial-tile", "silu", "tanh"])
def test_costly_epilogues_run_over_tiles_equal_to_eager(target: str, inputs: int, outputs: int, batch: int,
                                                         activation) -> None:
    model = Product(inputs, outputs, activation).eval()
    with torch.no_grad():
        compiled = wrapgen.compile(model, (torch.randn(batch, inputs),), target=target)
        tiled = [s for s in _sources(compiled) if "x1t += 16" in s]
        assert tiled, _sources(compiled)
        assert tiled[0].count("#pragma omp simd") >= 2  # the reduction's and the epilogue's
        for _ in range(3):
            x = torch.randn(batch, inputs)
            torch.testing.assert_close(compiled(x), model(x))


def test_cheap_epilogues_and_dynamic_rows_keep_one_row_loop() -> None:
    cheap = lambda x: x.amax(-1) * 2.0 + 1.0  # noqa: E731  (a max: no lane tile either)
    compiled = wrapgen.compile(cheap, (torch.randn(4, 64, 32),), target="python")
    assert not any("x1t" in s for s in _sources(compiled))
    costly = lambda x: torch.exp(x.sum(-1))  # noqa: E731
    dynamic = wrapgen.compile(costly, (torch.randn(3, 40, 8),), target="python", dynamic=True)
    assert not any("x1t" in s for s in _sources(dynamic))
    for shape in ((3, 40, 8), (5, 33, 8)):
        x = torch.randn(shape)
        torch.testing.assert_close(dynamic(x), costly(x))
    static = wrapgen.compile(costly, (torch.randn(3, 40, 8),), target="cpp")
    assert any("x1t += 16" in s for s in _sources(static))
    x = torch.randn(3, 40, 8)
    torch.testing.assert_close(static(x), costly(x))
