"""Values computed from no input and no weight, folded into constants at compile time
(wrapgen/lowering/graph_passes/input_free.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import wrapgen
import wrapgen.dynamo
from benchmarks.suite.run import recorded_programs
from wrapgen.lowering.graph_passes import input_free
from wrapgen.wrapper_ir.lines import ExternKernel, KernelDefinition

TARGETS = ["python", "cpp", "fx", "interpret"]


def _relative_index(h: int, w: int) -> torch.Tensor:
    """BEiT's relative-position index, built as BEiT builds it in forward."""
    coords = torch.flatten(torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")), 1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += h - 1
    relative[:, :, 1] += w - 1
    relative[:, :, 0] *= 2 * w - 1
    index = torch.zeros((h * w + 1,) * 2, dtype=relative.dtype)
    index[1:, 1:] = relative.sum(-1)
    index[0, 0:] = (2 * h - 1) * (2 * w - 1)
    index[0:, 0] = (2 * h - 1) * (2 * w - 1) + 1
    return index


class RelativeBias(nn.Module):
    """Attention scores plus a bias gathered from a learned table by an index built in forward."""

    def __init__(self, h: int = 3, w: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.h, self.w = h, w
        self.table = nn.Parameter(torch.randn((2 * h - 1) * (2 * w - 1) + 2, heads))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        n = self.h * self.w + 1
        bias = self.table[_relative_index(self.h, self.w).view(-1)].view(n, n, -1).permute(2, 0, 1)
        return torch.softmax(scores + bias, dim=-1)


def _scores() -> torch.Tensor:
    return torch.randn(2, 2, 13, 13)


def _folded(program) -> list[str]:
    return [c.name for c in program.constants if c.name.endswith("_folded")]


@pytest.mark.parametrize("target", TARGETS)
def test_an_index_built_in_forward_is_a_constant(target):
    model = RelativeBias()
    program = wrapgen.lower(model, (_scores(),))
    assert _folded(program), str(program)
    origins = " ".join(c.origin for c in program.constants)
    assert "computed at compile time from no input" in origins
    # what built the index (arange, meshgrid's expands, the slice writes) runs no more
    ops = " ".join(dict(line.metadata).get("ops", "") for line in program.lines if isinstance(line, KernelDefinition))
    assert "arange" not in ops and "slice_scatter" not in ops, ops
    compiled = wrapgen.compile(model, (_scores(),), target=target)
    for _ in range(2):
        scores = _scores()
        torch.testing.assert_close(compiled(scores), model(scores))


def test_a_weight_changed_in_place_is_still_read():
    """The table is a weight: what reads it is not folded, so an update between calls shows."""
    model = RelativeBias()
    compiled = wrapgen.compile(model, (_scores(),), target="python")
    with torch.no_grad():
        model.table.mul_(-2.0)
    scores = _scores()
    torch.testing.assert_close(compiled(scores), model(scores))


def test_returned_and_creation_only_values_stay_computed():
    """A returned value would be shared between calls; a `zeros` / `arange` alone is cheaper to
    fill than to hold."""

    def fn(x):
        index = torch.arange(6).view(2, 3) * 2 + 1  # returned: stays an op
        return x + torch.zeros(2, 3), index

    x = torch.randn(2, 3)
    program = wrapgen.lower(fn, (x,))
    assert not _folded(program), str(program)
    compiled = wrapgen.compile(fn, (x,), target="python")
    first, index = compiled(x)
    index.add_(100)  # the caller owns what it got back
    torch.testing.assert_close(compiled(x)[1], fn(x)[1])


def test_random_values_are_drawn_every_call():
    def fn(x):
        return x + torch.rand(4) * torch.arange(4)

    x = torch.zeros(4)
    compiled = wrapgen.compile(fn, (x,), target="python")
    assert not _folded(wrapgen.lower(fn, (x,)))
    assert not torch.equal(compiled(x), compiled(x))


def test_a_large_value_is_left_to_the_program(monkeypatch):
    monkeypatch.setattr(input_free, "FOLD_BYTES", 64)
    program = wrapgen.lower(RelativeBias(), (_scores(),))
    sizes = {c.name: c.value.numel() * c.value.element_size() for c in program.constants if c.name in _folded(program)}
    assert all(size <= 64 for size in sizes.values()), sizes  # the 169-entry int64 index is not among them
    model = RelativeBias()
    compiled = wrapgen.compile(model, (_scores(),), target="python")
    scores = _scores()
    torch.testing.assert_close(compiled(scores), model(scores))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_a_cpu_index_of_a_cuda_table_is_a_cuda_constant(target):
    """BEiT's case: the index is built on the CPU and indexes a CUDA table; the constant is made
    on the GPU, so no call copies it from host memory."""
    model = RelativeBias().cuda()
    scores = _scores().cuda()
    program = wrapgen.lower(model, (scores,))
    folded = [c for c in program.constants if c.name.endswith("_folded")]
    assert folded and all(c.value.device.type == "cuda" for c in folded if c.value.dtype == torch.int64)
    assert not any(isinstance(line, ExternKernel) and "_to_copy" in line.op for line in program.lines)
    compiled = wrapgen.compile(model, (scores,), target=target)
    fresh = torch.randn_like(scores)
    torch.testing.assert_close(compiled(fresh), model(fresh))


def test_a_value_an_in_place_update_writes_later_is_not_folded_from_before_it():
    """An input-free buffer that an in-place op writes (as the in-place passes make them) is not
    the source of a constant: what reads it after the write sees the write."""

    from wrapgen.lowering.capture import capture

    def fn(x):
        base = torch.arange(6.0) * 2
        return (base.view(2, 3) + x,)

    captured = capture(fn, (torch.randn(2, 3),), dynamic=False)
    graph = captured.graph_module.graph
    mul = next(n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):  # base.add_(x.sum()) after the read: the read must stay before it
        total = graph.call_function(torch.ops.aten.sum.default, (placeholder,))
        graph.call_function(torch.ops.aten.add_.Tensor, (mul, total))
    input_free_nodes = {n for n in graph.nodes if n.op == "call_function" and not n.all_input_nodes or n is mul}
    assert input_free._written_later(mul, input_free_nodes)


def test_the_dynamo_entry_folds_an_index_built_with_scalar_writes():
    """Through torch.compile, `index[0, 0:] = value` writes a tensor attribute dynamo made of the
    Python number (`_tensor_constant<N>`): a value of known content, so the index still folds."""
    wrapgen.dynamo.ensure_registered()
    model = RelativeBias()
    compiled = torch.compile(model, backend="wrapgen")
    with torch.no_grad(), recorded_programs() as programs:
        for _ in range(2):
            scores = _scores()
            torch.testing.assert_close(compiled(scores), model(scores))
    (program,) = programs
    assert _folded(program), str(program)
    ops = " ".join(dict(line.metadata).get("ops", "") for line in program.lines if isinstance(line, KernelDefinition))
    ops += " ".join(line.op for line in program.lines if isinstance(line, ExternKernel))
    assert "arange" not in ops and "where" not in ops and "copy" not in ops, ops


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_dynamo_entry_makes_a_cpu_index_of_a_cuda_table_a_cuda_constant():
    """BEiT through torch.compile: the CPU index, built with scalar writes, is a CUDA constant, so
    no call rebuilds it on the CPU and copies it over."""
    wrapgen.dynamo.ensure_registered()
    model = RelativeBias().cuda()
    compiled = torch.compile(model, backend="wrapgen")
    with torch.no_grad(), recorded_programs() as programs:
        scores = _scores().cuda()
        torch.testing.assert_close(compiled(scores), model(scores))
    (program,) = programs
    built = ("arange", "where", "copy", "lift_fresh")  # what built the index on the CPU, then moved it
    assert not any(isinstance(line, ExternKernel) and any(op in line.op for op in built) for line in program.lines)
    folded = [c for c in program.constants if c.name.endswith("_folded")]
    assert folded and all(c.value.device.type == "cuda" for c in folded if c.value.dtype == torch.int64)


class TwoLayers(nn.Module):
    """Two attention layers that each build the same index in forward (ConViT's layers each build
    their relative positions), with different tables."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = RelativeBias(), RelativeBias()

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(scores))


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_equal_folded_values_are_held_once(target):
    model = TwoLayers()
    program = wrapgen.lower(model, (_scores(),))
    indices = [c for c in program.constants if c.name.endswith("_folded") and c.value.dtype == torch.int64]
    assert len(indices) == 1, [c.name for c in program.constants]
    compiled = wrapgen.compile(model, (_scores(),), target=target)
    scores = _scores()
    torch.testing.assert_close(compiled(scores), model(scores))
