"""CUDA graphs on a CUDA device (`cuda_graphs=True`): recording and replay against eager on fresh
inputs, for the python and cpp targets (skipped without a GPU). The CPU side is
tests/test_graph_partition.py."""

from __future__ import annotations

import copy

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir import GraphBegin

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TARGETS = ["python", "cpp"]


def block() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True).cuda().eval()


def regions(program) -> list[GraphBegin]:
    return [line for line in program.lines if isinstance(line, GraphBegin)]


def python_regions(compiled) -> list:
    """The GraphRegion objects of a python-target CompiledFunction (module globals `_graph_g*`)."""
    names = compiled.artifact.call.__globals__
    return [names[f"_graph_{b.graph}"] for b in regions(compiled.program)]


def compile_with_graphs(model, inputs, target, dynamic=False):
    with wrapgen.config.patch(cuda_graphs=True):
        return wrapgen.compile(model, inputs, target=target, dynamic=dynamic)


@pytest.mark.parametrize("target", TARGETS)
def test_replay_equals_eager_on_fresh_inputs(target):
    model = block()
    fn = compile_with_graphs(model, (torch.randn(2, 16, 64, device="cuda"),), target)
    assert len(regions(fn.program)) == 1, str(fn.program)
    with torch.no_grad():
        for _ in range(6):  # warm-up, record, replays; every input at a new address
            x = torch.randn(2, 16, 64, device="cuda")
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    if target == "python":
        (graph,) = python_regions(fn)
        assert graph.records == 1 and graph.replays >= 4, graph


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_held_across_calls_stay_correct(target):
    model = block()
    fn = compile_with_graphs(model, (torch.randn(2, 16, 64, device="cuda"),), target)
    xs = [torch.randn(2, 16, 64, device="cuda") for _ in range(5)]
    outs = [fn(x) for x in xs]  # outputs are fresh tensors: a later replay does not overwrite them
    with torch.no_grad():
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_input_mutated_in_place_at_the_same_address(target):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).cuda().eval()
    x = torch.randn(4, 32, device="cuda")
    fn = compile_with_graphs(model, (x,), target)
    with torch.no_grad():
        for _ in range(4):
            x.normal_()  # same tensor, new values
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_calls_on_two_streams_are_ordered(target):
    """A call on a second stream while the first stream's replay (a few ms of matmuls) still runs:
    its input copy must wait, or it overwrites the static buffer the running replay reads."""
    layers = [m for _ in range(12) for m in (torch.nn.Linear(2048, 2048), torch.nn.Tanh())]
    model = torch.nn.Sequential(*layers).cuda().eval()
    fn = compile_with_graphs(model, (torch.randn(2048, 2048, device="cuda"),), target)
    side = torch.cuda.Stream()
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay: on the default stream
            fn(torch.randn(2048, 2048, device="cuda"))
        xs = [torch.randn(2048, 2048, device="cuda") for _ in range(3)]
        torch.cuda.synchronize()
        first = fn(xs[0])
        with torch.cuda.stream(side):
            second = fn(xs[1])
        third = fn(xs[2])  # back on the default stream, after the side stream's call
        torch.cuda.synchronize()
        for x, out in zip(xs, (first, second, third)):
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


def _split(x, w):
    y = torch.relu(x @ w)
    n = (y > 0.5).sum().item()  # a host sync: ends the first graph
    z = (y.cpu() * 2).to(x.device)  # a CPU op: ends the second
    return torch.sin(z) + n, y.cos()


@pytest.mark.parametrize("target", TARGETS)
def test_program_partitioned_around_item_and_a_cpu_op(target):
    x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, 16, device="cuda")
    fn = compile_with_graphs(_split, (x, w), target)
    assert len(regions(fn.program)) >= 2, str(fn.program)
    assert "bind u0 = " in str(fn.program)
    for _ in range(5):
        a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 16, device="cuda")
        torch.testing.assert_close(fn(a, b), _split(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_three_batch_sizes_of_a_dynamic_program(target):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda().eval()
    fn = compile_with_graphs(model, (torch.randn(4, 32, device="cuda"),), target, dynamic=True)
    assert regions(fn.program) and regions(fn.program)[0].key, str(fn.program)
    with torch.no_grad():
        for _ in range(4):
            for batch in (2, 3, 5):
                x = torch.randn(batch, 32, device="cuda")
                torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    if target == "python":
        (graph,) = python_regions(fn)
        assert len(graph.graphs) == 3 and graph.records == 3, graph


def test_parameter_swapped_for_another_tensor_is_recorded_again():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()).cuda().eval()
    compiled = torch.compile(model, backend="wrapgen", options={"cuda_graphs": True})
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 32, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        model[0].weight.data = torch.randn(32, 32, device="cuda")  # a new address: the graph must not replay stale
        for _ in range(4):
            x = torch.randn(4, 32, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_cpp_package_with_graphs_after_a_weight_update(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).cuda().eval()
    x = torch.randn(4, 32, device="cuda")
    with wrapgen.config.patch(cuda_graphs=True):
        path = wrapgen.aot_compile(model, (x,), tmp_path / "pkg")
    assert "wrapgen::graphs::Call" in (tmp_path / "pkg" / "model.cpp").read_text()
    runner = wrapgen.load_package(path)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 32, device="cuda")
            torch.testing.assert_close(runner(x), model(x), rtol=1e-4, atol=1e-4)
        new = {name: torch.randn_like(p) for name, p in model.named_parameters()}
        runner.update_weights(new)  # the other constant set: new addresses, recorded again
        model.load_state_dict(new, strict=False)
        for _ in range(4):
            x = torch.randn(4, 32, device="cuda")
            torch.testing.assert_close(runner(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_training_step_with_graphs(target):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)).cuda()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="wrapgen", options={"cuda_graphs": True, "target": target})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(5):
        x = torch.randn(16, 32, device="cuda")
        loss = compiled(x).square().mean()
        loss.backward()
        ref_loss = reference(x).square().mean()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()


def test_peak_memory_with_graphs_is_close_to_without():
    model = block()
    x = torch.randn(1, 32, 64, device="cuda")
    peaks = {}
    for graphs in (False, True):
        with wrapgen.config.patch(cuda_graphs=graphs):
            fn = wrapgen.compile(model, (x,))
        for _ in range(3):
            fn(torch.randn_like(x))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for _ in range(3):
            fn(torch.randn_like(x))
        torch.cuda.synchronize()
        peaks[graphs] = torch.cuda.max_memory_allocated() - base
        del fn
    assert peaks[True] <= 1.1 * peaks[False] + (1 << 20), peaks


@pytest.mark.parametrize("target", TARGETS)
def test_whole_life_peak_with_graphs_makes_no_second_cublas_workspace(target):
    """From the compile on, cuBLAS workspaces included (the benchmark's accounting): the warm-up
    runs on the stream that records, so a program whose matmuls are all recorded makes cuBLAS's
    workspace (32 MiB on Hopper) for that stream only, not a second one for the caller's."""
    import gc

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda().eval()
    x = torch.randn(4, 256, device="cuda")
    with torch.no_grad():
        expected = model(x)
    peaks = {}
    for graphs in (False, True):
        gc.collect()
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with wrapgen.config.patch(cuda_graphs=graphs):
            fn = wrapgen.compile(model, (x,), target=target)
        for _ in range(4):  # warm-up, record, replays
            torch.testing.assert_close(fn(x), expected, rtol=1e-4, atol=1e-4)
        torch.cuda.synchronize()
        peaks[graphs] = torch.cuda.max_memory_allocated() - base
        del fn
    assert peaks[True] <= 1.1 * peaks[False], peaks
