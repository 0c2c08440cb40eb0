"""A transposed copy made only to feed a matrix product is made in its source's order (its last two
strides swapped), so the kernel making it reads and writes along the same dimension."""

from __future__ import annotations

import pytest
import torch

import wrapgen
import wrapgen.dynamo
from wrapgen.lowering.capture import capture
from wrapgen.lowering.graph_passes.transposed_operands import copy_matmul_operands_in_order

TARGETS = ("python", "cpp", "fx", "interpret")
aten = torch.ops.aten


def scores(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Eager attention's `q @ k^T` on heads split from a sequence-major projection (GPT-J, Swin)."""
    batch, tokens, _ = x.shape
    q = (x * 2).view(batch, tokens, 4, 8).permute(0, 2, 1, 3)
    k = (y + 1).view(batch, tokens, 4, 8).permute(0, 2, 1, 3)
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


def copied_and_kept(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The transposed copy is also returned: its layout is seen, so it stays row-major."""
    k_t = (y + 1).view(2, 16, 4, 8).permute(0, 2, 3, 1).contiguous()
    return x.view(2, 16, 4, 8).permute(0, 2, 1, 3) @ k_t, k_t


def inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(2, 16, 32, dtype=dtype), torch.randn(2, 16, 32, dtype=dtype)]


def transposed_clones(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.target == aten.clone.default and n.args[0].meta["val"].stride(-2) == 1
            and n.args[0].meta["val"].stride(-1) != 1]


def test_the_copy_is_made_in_its_sources_order():
    captured = capture(scores, inputs(), False)
    assert transposed_clones(captured.graph_module.graph)
    rewritten = copy_matmul_operands_in_order(captured).graph_module.graph
    assert not transposed_clones(rewritten)
    (product,) = [n for n in rewritten.nodes if n.target == aten.bmm.default]
    key = product.args[1].meta["val"]
    assert key.stride(-2) == 1 and key.stride(-1) != 1  # the product reads it transposed


def test_a_copy_whose_layout_is_seen_is_kept():
    captured = capture(copied_and_kept, inputs(), False)
    assert copy_matmul_operands_in_order(captured) is captured


def test_the_callers_graph_is_not_changed():
    captured = capture(scores, inputs(), False)
    before = str(captured.graph_module.graph)
    assert copy_matmul_operands_in_order(captured).graph_module is not captured.graph_module
    assert str(captured.graph_module.graph) == before


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_results_match_eager(target, dtype):
    tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for fn in (scores, copied_and_kept):
        compiled = wrapgen.compile(fn, inputs(dtype), target=target)
        for _ in range(2):
            args = inputs(dtype)
            torch.testing.assert_close(compiled(*args), fn(*args), **tolerance)


def test_triton_kernels_match_eager():
    from wrapgen.kernels.triton import compat

    if not (compat.available() and compat.interpreting()):
        pytest.skip("needs triton in interpreter mode (CPU machines)")
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        compiled = wrapgen.compile(scores, inputs(), target="python")
    args = inputs()
    torch.testing.assert_close(compiled(*args), scores(*args))


def test_the_dynamo_entry_matches_eager():
    wrapgen.dynamo.ensure_registered()
    compiled = torch.compile(scores, backend="wrapgen")
    args = inputs()
    torch.testing.assert_close(compiled(*args), scores(*args))


def test_a_training_step_matches_eager():
    wrapgen.dynamo.ensure_registered()
    x, y = (t.requires_grad_() for t in inputs())
    compiled = torch.compile(scores, backend="wrapgen")
    compiled(x, y).square().sum().backward()
    grads = (x.grad, y.grad)
    x.grad = y.grad = None
    scores(x, y).square().sum().backward()
    torch.testing.assert_close(grads, (x.grad, y.grad))


class NamedInput(torch.nn.Module):
    """Its argument is named `input`, a builtin: a copied graph renames the placeholder."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return scores(input, input * 3)


@pytest.mark.parametrize("target", ("python", "cpp"))
def test_an_input_named_after_a_builtin_survives_the_rewrite(target):
    compiled = wrapgen.compile(NamedInput(), inputs()[:1], target=target)
    (x,) = inputs()[:1]
    torch.testing.assert_close(compiled(x), NamedInput()(x))


class TokenMixing(torch.nn.Module):
    """An MLP-Mixer block: a linear layer over the transposed, normalized tokens, then one over the
    channels. The transposed copy feeds a flattening view that its swapped strides cannot express
    (dynamo's graph checks that with torch's Python references, which raise ValueError), so it
    stays row-major."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.tokens, self.channels = torch.nn.LayerNorm(32), torch.nn.Linear(16, 16), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm(x))


@pytest.mark.parametrize("entry", ("compile", "dynamo"))
def test_a_flattened_transposed_copy_stays_row_major(entry):
    wrapgen.dynamo.ensure_registered()
    model = TokenMixing().eval()
    with torch.no_grad():
        compiled = (wrapgen.compile(model, (torch.randn(4, 16, 32),)) if entry == "compile"
                    else torch.compile(model, backend="wrapgen"))
        x = torch.randn(4, 16, 32)
        torch.testing.assert_close(compiled(x), model(x))
