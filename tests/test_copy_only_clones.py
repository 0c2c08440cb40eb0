"""Copy-only clones removed from the joint graph before partitioning (graph_passes.copy_only_clones):
a training step saves a value once, not once more as its copy; clones that keep an output from
aliasing an input or another output stay."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn

import wrapgen.backends
import wrapgen.dynamo
from wrapgen.lowering.graph_passes.copy_only_clones import remove_copy_only_clones

TARGETS = wrapgen.backends.registered_backends()


class CopiedAttention(nn.Module):
    """BLOOM's attention core: softmax, a copy of it (`.to()` / dropout in eval), the copy's product
    with the values; the softmax backward reads the softmax, the values' gradient the copy."""

    def __init__(self, copy: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.copy = copy

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return self.proj((probs.clone() if self.copy else probs) @ v).sum()


def _saved_storages(fn, *inputs: torch.Tensor) -> int:
    storages = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs).backward()
    return len(storages)


@pytest.mark.parametrize("target", TARGETS)
def test_a_training_step_saves_a_value_not_also_its_copy(target: str) -> None:
    torch.manual_seed(0)
    model = CopiedAttention()
    inputs = [torch.randn(2, 8, 16, requires_grad=True) for _ in range(3)]
    compiled = torch.compile(model, backend="wrapgen", options={"target": target}, fullgraph=True)
    compiled(*inputs).backward()  # compiled, then measured
    for x in inputs:
        x.grad = None
    model.zero_grad()
    copies = _saved_storages(compiled, *inputs)
    got = [x.grad for x in inputs] + [p.grad for p in model.parameters()]
    for x in inputs:
        x.grad = None
    model.zero_grad()
    model(*inputs).backward()
    expected = [x.grad for x in inputs] + [p.grad for p in model.parameters()]
    torch.testing.assert_close(got, expected)

    plain = torch.compile(CopiedAttention(copy=False), backend="wrapgen", options={"target": target}, fullgraph=True)
    plain(*inputs).backward()
    assert copies == _saved_storages(plain, *inputs)  # the copy is not saved besides the softmax


def _graph(body) -> torch.fx.Graph:
    """`body(x)` traced with fake values (the joint graph's `val` meta) on a (4, 4) input."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode() as mode:
        gm = make_fx(body, tracing_mode="fake")(mode.from_tensor(torch.randn(4, 4)))
    return gm.graph


def _clones(graph: torch.fx.Graph) -> int:
    return sum(n.target is torch.ops.aten.clone.default for n in graph.nodes)


def test_a_clone_read_only_inside_the_graph_is_removed() -> None:
    graph = _graph(lambda x: (torch.ops.aten.clone.default(x.sin()) * 2,))
    assert remove_copy_only_clones(graph) == 1 and _clones(graph) == 0


def test_clones_that_keep_outputs_apart_stay() -> None:
    of_input = _graph(lambda x: (torch.ops.aten.clone.default(x),))
    assert remove_copy_only_clones(of_input) == 0  # the output would be the input

    def sine_and_its_copy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sine = x.sin()
        return sine, torch.ops.aten.clone.default(sine)

    two_outputs = _graph(sine_and_its_copy)
    assert remove_copy_only_clones(two_outputs) == 0  # two outputs would share one storage


def test_a_clone_to_another_layout_stays() -> None:
    graph = _graph(lambda x: (torch.ops.aten.clone.default(x.t(), memory_format=torch.contiguous_format) * 2,))
    assert remove_copy_only_clones(graph) == 0
