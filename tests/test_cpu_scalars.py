"""0-dim CPU tensors of known value read by generated kernels as numbers
(wrapgen/lowering/graph_passes/cpu_scalars.py), and the asserts the traced metadata proves
leaving with the values only they read (graph_passes/dead_code.py).

The CUDA programs are lowered from graphs of fake CUDA tensors: lowering needs no GPU, so the
CPU machines check what a CUDA program holds; the GPU test runs one."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import wrapgen
from wrapgen.lowering.capture import capture, capture_aten_graph
from wrapgen.lowering.graph_passes.cpu_scalars import cpu_scalars_as_numbers
from wrapgen.lowering.graph_passes.dead_code import remove_dead_code
from wrapgen.wrapper_ir.lines import ExternKernel, KernelCall, KernelDefinition

aten = torch.ops.aten


def _relative_scores(scores: torch.Tensor, table: torch.Tensor, copy_bound: bool) -> torch.Tensor:
    """DeBERTa-v2's shape: a position index bucketed with a CPU `torch.tensor` bound (with
    `copy_bound`, copied to the scores' device first, as its `type_as` does), a gather from a
    relative-position table, divided by a CPU `sqrt(torch.tensor(d) * s)` scale."""
    n = scores.shape[-1]
    positions = torch.arange(n, device=scores.device)
    relative = positions.unsqueeze(1) - positions.unsqueeze(0)
    bound = torch.tensor(3).type_as(relative) if copy_bound else torch.tensor(3)
    bucket = torch.where(relative.abs() < 4, bound, relative.abs())
    index = torch.clamp(bucket + n // 2, 0, table.shape[-1] - 1)
    scale = torch.sqrt(torch.tensor(16, dtype=torch.float) * 2).to(scores.dtype)
    gathered = torch.gather(table, -1, index.unsqueeze(0).expand(scores.shape[0], n, n))
    return torch.softmax(scores + gathered / scale, -1)


def relative_scores(scores: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return _relative_scores(scores, table, copy_bound=False)


def relative_scores_with_a_copied_bound(scores: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return _relative_scores(scores, table, copy_bound=True)


def _fake_cuda_graph(fn, *shapes, dtype=torch.float32):
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.randn(*s, device="cuda", dtype=dtype) for s in shapes]
        traced = make_fx(fn)(*args)  # the tensors `fn` makes from numbers stay real
    return capture_aten_graph(traced)


def _externs(program) -> list[str]:
    return [line.op for line in program.lines if isinstance(line, ExternKernel)]


def test_known_cpu_scalars_in_a_cuda_graph_become_numbers():
    captured = _fake_cuda_graph(relative_scores, (4, 32, 32), (4, 32, 40), dtype=torch.bfloat16)
    rewritten = cpu_scalars_as_numbers(captured, "cuda").graph_module.graph
    calls = {n.target: n for n in rewritten.nodes if n.op == "call_function" and n.users}
    assert calls[aten.where.ScalarSelf].args[1] == 3  # where.self took the CPU tensor; its number overload
    divide = calls[aten.div.Tensor]
    assert divide.args[1] == float(torch.tensor(32.0).sqrt().to(torch.bfloat16))


def test_an_exported_cuda_program_reads_its_cpu_scalars_as_numbers_and_fuses_the_gather_into_the_softmax():
    """Through torch.export (CUDA inputs as fake tensors: lowering needs no GPU), whose lifted CPU
    constants come ahead of the inputs: the kernels still run on CUDA, and read no CPU tensor."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        scores = torch.randn(4, 32, 32, device="cuda", dtype=torch.bfloat16)
        table = torch.randn(4, 32, 40, device="cuda", dtype=torch.bfloat16)
    program = wrapgen.lower(relative_scores_with_a_copied_bound, (scores, table))
    assert not _externs(program), str(program)  # nor the bound's copy to the GPU
    kernels = [line for line in program.lines if isinstance(line, KernelDefinition)]
    assert len(kernels) == 1 and "softmax" in kernels[0].name and kernels[0].language == "triton", str(program)
    assert kernels[0].source.count("tl.load") == 2  # the scores and the table


def test_a_read_that_would_change_the_result_dtype_keeps_the_tensor():
    """An int64 tensor times a 0-dim float64 tensor is float64; times a Python float it would be
    float32 (the default dtype): that read stays a tensor, and its op a library call."""
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x.long() * torch.tensor(1.5, dtype=torch.float64)

    captured = _fake_cuda_graph(scaled, (8,))
    assert cpu_scalars_as_numbers(captured, "cuda") is captured


def test_a_cpu_scalar_computed_from_an_input_stays_a_tensor():
    def from_input(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x / s.sqrt()

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, s = torch.randn(8, device="cuda"), torch.tensor(4.0)
        traced = make_fx(from_input)(x, s)
    captured = capture_aten_graph(traced)
    assert cpu_scalars_as_numbers(captured, "cuda") is captured


@pytest.mark.parametrize("target", ["python", "cpp", "fx", "interpret"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_programs_read_the_numbers_and_match_eager(target, dtype):
    scores, table = torch.randn(4, 32, 32, dtype=dtype), torch.randn(4, 32, 40, dtype=dtype)
    program = wrapgen.lower(relative_scores, (scores, table))
    assert not _externs(program), str(program)
    assert len([line for line in program.lines if isinstance(line, KernelCall)]) == 1, str(program)
    compiled = wrapgen.compile(relative_scores, (scores, table), target=target)
    for _ in range(2):
        scores, table = torch.randn_like(scores), torch.randn_like(table)
        torch.testing.assert_close(compiled(scores, table), relative_scores(scores, table))


def test_an_assert_the_metadata_proves_leaves_with_what_only_it_read():
    """torch.export checks each `.to()`'s source with `_assert_tensor_metadata`; where the scale's
    cast became a number, the CPU `sqrt` it checked was computed for the assert alone."""
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(torch.tensor(64.0)).to(x.dtype)

    x = torch.randn(8)
    captured = capture(scaled, (x,), False)
    graph = captured.graph_module.graph
    assert any(n.target is aten._assert_tensor_metadata.default for n in graph.nodes), graph
    after = remove_dead_code(cpu_scalars_as_numbers(captured, "cpu")).graph_module.graph
    targets = {n.target for n in after.nodes if n.op == "call_function"}
    assert aten.sqrt.default not in targets and aten._assert_tensor_metadata.default not in targets, after
    compiled = wrapgen.compile(scaled, (x,), target="cpp")
    fresh = torch.randn(8)
    torch.testing.assert_close(compiled(fresh), scaled(fresh))


def test_an_assert_the_lowering_does_not_prove_stays():
    def checked(x: torch.Tensor) -> torch.Tensor:
        aten._assert_tensor_metadata.default(x, [4], None, torch.float32)  # sizes: checked at run time
        return x + 1

    x = torch.randn(4)
    captured = capture_aten_graph(make_fx(checked)(x))
    after = remove_dead_code(captured).graph_module.graph
    assert any(n.target is aten._assert_tensor_metadata.default for n in after.nodes)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_a_cuda_program_reads_cpu_scalars_as_numbers(target):
    scores = torch.randn(4, 64, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.randn(4, 64, 80, device="cuda", dtype=torch.bfloat16)
    program = wrapgen.lower(relative_scores_with_a_copied_bound, (scores, table))
    assert not _externs(program), str(program)
    compiled = wrapgen.compile(relative_scores_with_a_copied_bound, (scores, table), target=target)
    scores, table = torch.randn_like(scores), torch.randn_like(table)
    torch.testing.assert_close(compiled(scores, table), relative_scores_with_a_copied_bound(scores, table))
