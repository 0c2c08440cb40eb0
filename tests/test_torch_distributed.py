"""torch.distributed's own parallelisms, compiled by wrapgen: FSDP2 (`fully_shard`), DTensor tensor
parallelism (`parallelize_module`) and DDP, on gloo over loopback with 2 and 4 rank processes.

Each rank (tests/torch_distributed_worker.py) wraps a small MLP as a user does, compiles it with
torch.compile(backend="wrapgen") on the python and cpp targets and trains three SGD steps: every
loss, gradient and final parameter equals the same model's trained without distribution on all
ranks' data. The ranks are plain subprocesses with a deadline (`run_ranks`), so CI never hangs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_collectives_distributed import run_ranks

WORKER = Path(__file__).with_name("torch_distributed_worker.py")
SCENARIOS = ("fsdp2", "tp", "ddp")
TARGETS = ("python", "cpp")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torch_distributed_cache")


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_tensor_parallel_and_ddp_train_like_eager(world, shared_cache):
    reports = run_ranks(world, shared_cache, TARGETS, SCENARIOS, worker=WORKER)
    for rank, report in enumerate(reports):
        done = {(r["scenario"], r["target"]) for r in report}
        assert done == {(s, t) for s in SCENARIOS for t in TARGETS}, f"rank {rank} checked only {sorted(done)}"
        for r in report:
            assert r["programs"] >= 2, r  # wrapgen compiled the forward and the backward, no fallback


def test_an_opaque_input_that_is_only_returned_is_handed_on_around_the_program():
    """aot_autograd hands a DTensor's mesh from the forward to the backward as a graph input and
    output: the program is compiled without it and the object is put back in its place."""
    import torch
    import torch.fx

    from wrapgen.dynamo import compile_aten_graph

    graph = torch.fx.Graph()
    x, mesh, unused = graph.placeholder("x"), graph.placeholder("mesh"), graph.placeholder("unused")
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    graph.output((doubled, mesh))
    example = torch.randn(3)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x.meta["val"] = mode.from_tensor(example)
    doubled.meta["val"] = x.meta["val"] * 2
    mesh.meta["val"], unused.meta["val"] = object(), object()
    call = compile_aten_graph(torch.fx.GraphModule(torch.nn.Module(), graph), "forward", "python")
    token = object()
    out = call([example, token, object()])
    torch.testing.assert_close(out[0], example * 2)
    assert out[1] is token
