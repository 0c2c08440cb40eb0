"""cuBLAS's workspaces and recorded CUDA graphs (skipped without a GPU).

A recorded matmul writes into the cuBLAS workspace its stream had when it was recorded. PyTorch
frees workspaces behind a graph's back: `torch._C._cuda_clearCublasWorkspaces()` (torch.compile's
reduce-overhead calls it whenever it records) frees all of them, and destroying a `CUDAGraph`
frees the one of the stream it was recorded on. These tests free them between replays, fill
the freed memory with tensors of a known value, and check that the replays leave those alone.
"""

from __future__ import annotations

import gc

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir import GraphBegin

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TARGETS = ["python", "cpp"]
FILL = 7.0


def split_k_linear(out_features: int = 1024) -> tuple[torch.nn.Module, torch.Tensor]:
    """A product cuBLAS splits along K on Hopper: its partial sums go through the workspace."""
    model = torch.nn.Linear(4096, out_features, bias=False).cuda().to(torch.bfloat16).eval()
    return model, torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)


def compile_with_graphs(model, inputs, target):
    with wrapgen.config.patch(cuda_graphs=True):
        return wrapgen.compile(model, inputs, target=target)


def recording_streams(*compiled) -> list[torch.cuda.Stream]:
    """Streams a freed workspace may have belonged to: the caller's, and the stream each python
    program records on (a C++ model's own stream is not reachable from Python)."""
    streams = [torch.cuda.current_stream()]
    for fn in compiled:
        call = getattr(fn.artifact, "call", None)
        names = getattr(call, "__globals__", {})
        for line in fn.program.lines:
            region = names.get(f"_graph_{line.graph}") if isinstance(line, GraphBegin) else None
            stream = getattr(getattr(region, "pool", None), "stream", None)
            if callable(stream):
                streams.append(stream(region.device))
    return streams


def fill_freed_memory(streams: list[torch.cuda.Stream]) -> list[torch.Tensor]:
    """Tensors of `FILL` over the memory freed workspaces left, on each stream that may reuse it
    (the cache emptied first, so memory no stream can reuse goes back to the driver: its next
    allocation, a fill here, or an illegal address for a replay that still writes there)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    victims = []
    for stream in streams:
        with torch.cuda.stream(stream):
            victims += [torch.full((8 << 20,), FILL, device="cuda") for _ in range(3)]  # 3 x 32 MiB
    torch.cuda.synchronize()
    return victims


def assert_untouched(victims: list[torch.Tensor]) -> None:
    torch.cuda.synchronize()
    for i, victim in enumerate(victims):
        assert bool((victim == FILL).all()), f"tensor {i} was overwritten by a replay"


def assert_replays_overwrite_nothing(fn, model, x: torch.Tensor, streams: list[torch.cuda.Stream]) -> None:
    """Fill the freed memory, replay on fresh inputs against eager, and check the fill is intact."""
    gc.collect()
    victims = fill_freed_memory(streams)
    for _ in range(3):
        x = torch.randn_like(x)
        torch.testing.assert_close(fn(x), model(x), rtol=2e-2, atol=2e-2)
    assert_untouched(victims)


@pytest.mark.parametrize("target", TARGETS)
def test_a_workspace_clear_between_replays_overwrites_nothing(target):
    """torch.compile's reduce-overhead clears every cuBLAS workspace when it records; graphs
    recorded before the clear must not go on writing into the memory it frees."""
    torch.manual_seed(0)
    model, x = split_k_linear()
    with torch.no_grad():
        fn = compile_with_graphs(model, (x,), target)
        for _ in range(3):  # warm-up, record, replay
            fn(x)
        streams = recording_streams(fn)
        torch._C._cuda_clearCublasWorkspaces()
        assert_replays_overwrite_nothing(fn, model, x, streams)


@pytest.mark.parametrize("target", TARGETS)
def test_dropping_another_programs_graphs_overwrites_nothing(target):
    """Destroying a recorded graph frees the cuBLAS workspace of the stream it was recorded on:
    the graphs of other programs must not be using it."""
    torch.manual_seed(0)
    model, x = split_k_linear()
    other, _ = split_k_linear(512)
    with torch.no_grad():
        fn = compile_with_graphs(model, (x,), target)
        dropped = compile_with_graphs(other, (x,), "python")
        for _ in range(3):
            fn(x)
            dropped(x)
        streams = recording_streams(fn, dropped)
        del dropped
        assert_replays_overwrite_nothing(fn, model, x, streams)


class TwoRegions(torch.nn.Module):
    """Two split-K products with a host sync between them: two graph regions."""

    def __init__(self) -> None:
        super().__init__()
        self.first, _ = split_k_linear()
        self.second, _ = split_k_linear()

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        hidden = self.first(t)
        count = (hidden > 0).sum().item()
        return self.second(hidden.repeat(1, 4)) + count % 2


@pytest.mark.parametrize("target", TARGETS)
def test_a_region_recorded_again_leaves_the_others_workspace_alone(target):
    """A region recorded again (its parameter at a new address) drops its old graph; the other
    region, recorded before, goes on replaying without writing into freed memory."""
    torch.manual_seed(0)
    model, x = TwoRegions(), torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fn = compile_with_graphs(model, (x,), target)
        assert sum(isinstance(line, GraphBegin) for line in fn.program.lines) == 2, str(fn.program)
        for _ in range(3):
            fn(x)
        streams = recording_streams(fn)
        model.second.weight.data = model.second.weight.data.clone()  # a new address: recorded again
        torch.testing.assert_close(fn(x), model(x), rtol=2e-2, atol=2e-2)
        assert_replays_overwrite_nothing(fn, model, x, streams)


def _workspace_bytes() -> int:
    """The bytes cuBLAS's workspace for one stream takes (made on a fresh stream's first matmul)."""
    torch._C._cuda_clearCublasWorkspaces()
    a = torch.randn(64, 64, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.mm(a, a)
    torch.cuda.synchronize()
    made = torch.cuda.memory_allocated() - before
    torch._C._cuda_clearCublasWorkspaces()
    return made


def test_graph_programs_and_the_tuner_keep_at_most_one_cublas_workspace(tmp_path):
    """A python and a cpp program with graphs, and the GEMM tuner measuring their misaligned
    product (1001 columns of bfloat16), keep one cuBLAS workspace (32 MiB on Hopper) in use
    afterwards, not one per stream: the python program's lies in its graph pool, free between
    replays; the tuner's is freed; the cpp program keeps the one of the stream it records on."""
    model = torch.nn.Sequential(torch.nn.Linear(768, 1001), torch.nn.Tanh()).cuda().eval().bfloat16()
    x = torch.randn(8, 768, device="cuda", dtype=torch.bfloat16)
    workspace = _workspace_bytes()
    base = torch.cuda.memory_allocated()
    results = []
    with torch.no_grad(), wrapgen.config.patch(cuda_graphs=True, cache_dir=str(tmp_path)):
        compiled = [wrapgen.compile(model, (x,), target=target) for target in TARGETS]
        assert "autotune " in str(compiled[0].program)  # the tuner measured the product
        for fn in compiled:
            for _ in range(3):
                results.append(fn(x))
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base - sum(r.untyped_storage().nbytes() for r in results)
    assert held < 1.5 * workspace, f"{held / 2**20:.1f} MiB held, one workspace is {workspace / 2**20:.1f} MiB"
    with torch.no_grad():
        expected = model(x)
    for result in results:
        torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2)


def _pointwise_chain(t):
    return ((t.sin() * 2).cos() + 1).tanh()


def test_a_graph_of_generated_kernels_makes_no_cublas_workspace():
    """A region without library calls is recorded without making cuBLAS a workspace for the
    capture stream (32 MiB on Hopper: all of tiny_chain_50's peak with graphs, when it was made)."""
    workspace = _workspace_bytes()
    x = torch.randn(64, 64, device="cuda")
    base = torch.cuda.memory_allocated()
    with torch.no_grad(), wrapgen.config.patch(cuda_graphs=True):
        compiled = wrapgen.compile(_pointwise_chain, (x,), target="python")
    assert "library_calls=False" in compiled.source
    results = [compiled(x) for _ in range(3)]  # warm-up, record, replay
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    assert held < workspace / 2, f"{held / 2**20:.1f} MiB held, one workspace is {workspace / 2**20:.1f} MiB"
    for result in results:
        torch.testing.assert_close(result, _pointwise_chain(x))
