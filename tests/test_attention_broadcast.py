"""A key/value broadcast against the query (multi-query attention) is expanded before SDPA, so
the call takes a fused backend instead of the math one, through both entry points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
import wrapgen.dynamo
from wrapgen.lowering.capture import capture
from wrapgen.lowering.graph_passes.attention_broadcast import broadcast_sizes, expand_broadcast_attention

TARGETS = ("python", "cpp", "fx", "interpret")
MATH = torch.nn.attention.SDPBackend.MATH.value


class MultiQueryAttention(torch.nn.Module):
    """Four query heads over one key/value head, passed to SDPA unexpanded (as Falcon does)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = torch.nn.Linear(32, 32)
        self.key_value = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q = self.query(x).view(batch, tokens, 4, 8).transpose(1, 2)
        k, v = self.key_value(x).view(batch, tokens, 2, 1, 8).unbind(2)
        return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


def batch_broadcast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def attention_arguments(graph: torch.fx.Graph) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(a.meta["val"] for a in node.args[:3]) for node in graph.nodes
            if node.op == "call_function" and node.target == torch.ops.aten.scaled_dot_product_attention.default]


def test_the_rewritten_call_takes_a_fused_backend():
    model, x = MultiQueryAttention().eval(), torch.randn(2, 16, 32)
    captured = capture(model, [x], False)
    (before,) = attention_arguments(captured.graph_module.graph)
    assert torch._fused_sdp_choice(*(torch.empty_strided(t.shape, t.stride()) for t in before), is_causal=True) == MATH
    (after,) = attention_arguments(expand_broadcast_attention(captured).graph_module.graph)
    assert [tuple(t.shape) for t in after] == [(2, 4, 16, 8)] * 3
    assert after[1].stride()[1] == 0 and after[2].stride()[1] == 0  # a view, not a copy
    assert torch._fused_sdp_choice(*(torch.empty_strided(t.shape, t.stride()) for t in after), is_causal=True) != MATH


def test_the_callers_graph_is_not_changed():
    captured = capture(MultiQueryAttention().eval(), [torch.randn(2, 16, 32)], False)
    before = str(captured.graph_module.graph)
    assert expand_broadcast_attention(captured).graph_module is not captured.graph_module
    assert str(captured.graph_module.graph) == before


@pytest.mark.parametrize("target", TARGETS)
def test_results_match_eager(target):
    model = MultiQueryAttention().eval()
    with torch.no_grad():
        compiled = wrapgen.compile(model, (torch.randn(2, 16, 32),), target=target)
        for _ in range(2):
            x = torch.randn(2, 16, 32)
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("target", ("python", "cpp"))
def test_a_broadcast_batch_matches_eager(target):
    def args() -> list[torch.Tensor]:
        return [torch.randn(3, 2, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)]

    compiled = wrapgen.compile(batch_broadcast, args(), target=target)
    fresh = args()
    torch.testing.assert_close(compiled(*fresh), batch_broadcast(*fresh))


def test_the_dynamo_entry_takes_the_fused_kernel(tmp_path):
    wrapgen.dynamo.ensure_registered()
    model = MultiQueryAttention().eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="wrapgen", options={"debug_dir": str(tmp_path)})
        x = torch.randn(2, 16, 32)
        torch.testing.assert_close(compiled(x), model(x))
    programs = "\n".join(p.read_text() for p in tmp_path.rglob("program.txt"))
    assert "_scaled_dot_product_flash_attention_for_cpu" in programs
    assert "bmm" not in programs  # the math backend's decomposition


def test_sizes_that_do_not_broadcast_are_left_alone():
    query = torch.empty(2, 4, 16, 8)
    assert broadcast_sizes(query, torch.empty(2, 4, 16, 8)) is None  # already equal
    assert broadcast_sizes(query, torch.empty(2, 2, 16, 8)) is None  # grouped heads: enable_gqa's case
    assert broadcast_sizes(query, torch.empty(4, 16, 8)) is None  # another rank
    assert broadcast_sizes(query, torch.empty(1, 1, 16, 8)) == [2, 4, 16, 8]
