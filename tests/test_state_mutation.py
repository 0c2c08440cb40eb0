"""Programs that write state in place (buffers, optimizer state, inputs) keep their generated
kernels: the write is stored by the kernel computing the new value, reads of the old value are
ordered before it, and results and state equal eager's on every target."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir import KernelCall, KernelDefinition

TARGETS = ["python", "cpp", "fx", "interpret"]
KERNELS = ["cpp"] + (["triton"] if compat.available() and compat.interpreting() else [])


class RunningState(torch.nn.Module):
    """A buffer read before and after its in-place update, and through a view."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = x * 2 + self.state
        self.state.mul_(0.5).add_(x)
        return before.sum(1) + self.state[:, 0]


@pytest.mark.parametrize("target", TARGETS)
def test_buffer_update_through_torch_compile(target, kernels):
    torch._dynamo.reset()
    model, reference = RunningState(), RunningState()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    for _ in range(3):
        x = torch.randn(8, 16)
        torch.testing.assert_close(compiled(x), reference(x))
        torch.testing.assert_close(model.state, reference.state)


def test_buffer_update_is_a_kernel_write():
    """The new value is computed straight into the buffer by a generated kernel, once: no library
    copy_ and no second write remain."""
    program = wrapgen.lower(RunningState(), (torch.randn(8, 16),))
    text = str(program)
    assert "aten::copy_" not in text and "extern" not in text, text
    writers = [line for line in program.lines if isinstance(line, KernelCall) and "b_state" in line.writes]
    assert len(writers) == 1, text


@pytest.mark.parametrize("target", TARGETS)
def test_read_before_write_sees_the_old_value(target, kernels):
    """A value computed from x before x is updated (and only read after the update) is the old
    x's: the deferred read is computed before the write."""

    def fn(x, y):
        old = x * 2
        x.add_(y)
        return old + x

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    xe = x.clone()
    expected = fn(xe, y)
    compiled = wrapgen.compile(fn, (x.clone(), y), target=target)
    got = compiled(x, y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, xe)


@pytest.mark.parametrize("target", TARGETS)
def test_write_reading_other_elements_of_its_destination(target, kernels):
    """x[1:] = x[:-1] + 1 reads elements the same write overwrites: computed into a buffer first."""

    def fn(x):
        x[1:] = x[:-1] + 1
        return x.sum()

    x = torch.randn(9, 5)
    xe = x.clone()
    expected = fn(xe)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="wrapgen", options={"target": target})
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(x, xe)


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8,), (32, 16), (16,), (3, 5, 7)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, foreach=True),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step(name, target, kernels):
    """Ten compiled steps leave parameters and state equal to ten eager steps."""
    torch._dynamo.reset()
    eager_params, compiled_params = _params(), _params()
    eager, compiled = OPTIMIZERS[name](eager_params), OPTIMIZERS[name](compiled_params)
    step = torch.compile(compiled.step, backend="wrapgen", options={"target": target})
    for _ in range(10):
        eager.step()
        step()
    for a, b in zip(eager_params, compiled_params):
        torch.testing.assert_close(b, a)
    for a, b in zip(eager.state.values(), compiled.state.values()):
        for key in a:
            torch.testing.assert_close(b[key], a[key])


def _lowered_aten_graph(fn, args: tuple, calls: int, name: str):
    """The program wrapgen lowers from the last ATen graph aot_autograd makes of `fn` (mutations
    kept as copy_ epilogues, as wrapgen's backend asks), after `calls` calls."""
    from torch._dynamo.backends.common import aot_autograd

    from wrapgen.lowering.capture import capture_aten_graph
    from wrapgen.lowering.decompositions import aot_autograd_table
    from wrapgen.lowering.lower import lower_captured

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return gm

    backend = aot_autograd(fw_compiler=keep, inference_compiler=keep, decompositions=aot_autograd_table(),
                           keep_inference_input_mutations=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    for _ in range(calls):
        compiled(*args)
    return lower_captured(capture_aten_graph(graphs[-1]), name)


def test_adamw_step_is_one_kernel_per_parameter():
    """Each parameter's whole update (p, exp_avg, exp_avg_sq) is one kernel that writes all three
    in place; nothing is left to library calls."""
    params = _params()
    opt = torch.optim.AdamW(params, lr=0.01, foreach=True)
    program = _lowered_aten_graph(opt.step, (), calls=2, name="step")  # the second step's: the state exists
    text = str(program)
    assert "extern" not in text, text
    inputs = {i.name for i in program.inputs}
    in_place = [call.writes for call in program.lines if isinstance(call, KernelCall) and set(call.writes) <= inputs]
    # one kernel per parameter writes it with its two moments; one more counts the steps
    assert sorted(len(w) for w in in_place) == sorted([len(params)] + [3] * len(params)), text


@pytest.mark.skipif("triton" not in KERNELS, reason="needs the Triton interpreter")
def test_adamw_step_on_triton_writes_each_parameter_with_its_moments(monkeypatch):
    """As lowered for a GPU (pow, which the interpreter lacks, as a loop op; not run): the bias
    corrections stay scalars inside the update kernels (recompute.py), and the step counters'
    write-backs go after the moments' (graph_passes/state_write_order.py), so the kernel that
    writes a parameter writes its two moments too: each is read and written once."""
    import wrapgen.kernels.triton.ops as ops

    monkeypatch.setattr(ops, "INTERPRETER_UNSUPPORTED", frozenset())
    params = _params()
    opt = torch.optim.AdamW(params, lr=0.01, foreach=True)
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = _lowered_aten_graph(opt.step, (), calls=2, name="step")
    text = str(program)
    assert "extern" not in text, text
    types = {i.name: i.type for i in program.inputs}
    writes = [call.writes for call in program.lines if isinstance(call, KernelCall) and set(call.writes) <= set(types)]
    written = [name for w in writes for name in w]
    assert len(written) == len(set(written)) == 4 * len(params), text  # p, exp_avg, exp_avg_sq, step: once each
    for w in writes:
        tensors = [n for n in w if len(types[n].sizes) > 0]
        assert len(tensors) % 3 == 0 and (not tensors or len(tensors) == len(w)), text
    assert len(writes) <= len(params) + 1, text  # same-shaped parameters may share a kernel


def test_inplace_ops_in_an_aten_graph(kernels):
    """An ATen graph with in-place ops (not functionalized) lowers them to loops + in-place stores."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    a = graph.call_function(torch.ops.aten.mul_.Tensor, (x, y))
    b = graph.call_function(torch.ops.aten.add_.Tensor, (a, 1.0))
    s = graph.call_function(torch.ops.aten.sum.default, (b,))
    graph.output((s,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    xv, yv = torch.randn(6, 3), torch.randn(6, 3)
    expected_x = xv * yv + 1
    compiled = wrapgen.compile(gm, (xv.clone(), yv))
    out = compiled(xv, yv)
    torch.testing.assert_close(xv, expected_x)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, expected_x.sum())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("name", ["adamw", "adam", "sgd_momentum"])
def test_compiled_optimizer_step_cuda(name, target, graphs):
    """On the GPU, capturable Adam(W) (step counts on the device) also runs in a CUDA graph."""
    torch._dynamo.reset()
    make = OPTIMIZERS[name]

    def build():
        params = [torch.nn.Parameter(p.detach().cuda()) for p in _params()]
        for p, q in zip(params, _params()):
            p.grad = q.grad.cuda()
        kwargs = {"capturable": True} if name.startswith("adam") and graphs else {}
        opt = make(params)
        for group in opt.param_groups:
            group.update(kwargs)
        return params, opt

    (eager_params, eager), (compiled_params, compiled) = build(), build()
    step = torch.compile(compiled.step, backend="wrapgen", options={"target": target, "cuda_graphs": graphs})
    for _ in range(10):
        eager.step()
        step()
    for a, b in zip(eager_params, compiled_params):
        torch.testing.assert_close(b, a)
    for a, b in zip(eager.state.values(), compiled.state.values()):
        for key in a:
            # dynamo moves a compiled optimizer's CPU step counters to the parameters' device
            torch.testing.assert_close(b[key].cpu(), a[key].cpu())


class KeyCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 16, 8))

    def forward(self, q: torch.Tensor, key: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(2, position, key)
        return torch.nn.functional.scaled_dot_product_attention(q, self.keys, self.keys)


@pytest.mark.parametrize("target", TARGETS)
def test_cache_update_writes_only_the_new_rows(target, kernels):
    """A KV-cache update through torch.compile is the library's in-place scatter into the cache:
    no copy of the cache is made, and the write-back is gone."""
    torch._dynamo.reset()
    model, reference = KeyCache(), KeyCache()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    for step in range(4):
        q, key, position = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.tensor([step])
        torch.testing.assert_close(compiled(q, key, position), reference(q, key, position))
        torch.testing.assert_close(model.keys, reference.keys)


def test_cache_update_program_has_no_cache_copy():
    args = (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.tensor([3]))
    program = _lowered_aten_graph(KeyCache(), args, calls=1, name="decode")
    text = str(program)
    cache = program.inputs[0].name
    writers = [line for line in program.lines if cache in getattr(line, "writes", ())]
    assert len(writers) == 1 and "index_put_" in str(writers[0]), text
    assert "aten::copy_" not in text, text


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_static_cache_decode_tokens_equal_eager(target, tmp_path):
    """A small Llama-style model decoding greedily through transformers' StaticCache, its forward
    compiled by wrapgen: every token equal to eager's, and no program copies a cache."""
    pytest.importorskip("transformers")
    from benchmarks import decode

    model = decode.build_model("small", "cpu", torch.float32)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(3))

    def generate(forward) -> list[int]:
        generation = decode.Generation(model, forward, prompt, 6, "cpu", torch.float32)
        out: list[torch.Tensor] = []
        generation.decode(generation.prefill(), out)
        return decode.tokens_of(out)

    torch._dynamo.reset()
    with torch.no_grad():
        expected = generate(model.forward)
        compiled = torch.compile(model.forward, backend="wrapgen", options={"target": target, "debug_dir": str(tmp_path)})
        assert generate(compiled) == expected
    programs = [p.read_text() for p in tmp_path.glob("*/program.txt")]
    assert programs
    for text in programs:
        assert "aten::copy_" not in text and "index_put_" in text, text
        assert "extern aten::index_put" not in text, text  # the cache is written by a generated kernel


def test_state_versions_are_shown_and_a_planted_reordering_is_refused():
    """Each call declares the version of the state it sees; moving the write of a buffer before
    a read of its old value fails verification naming the moved-past line."""
    import dataclasses

    from wrapgen.wrapper_ir import verify
    from wrapgen.wrapper_ir.verify import VerificationError

    program = wrapgen.lower(RunningState(), (torch.randn(8, 16),))
    text = str(program)
    assert "state b_state@v0" in text, text
    lines = list(program.lines)
    writer = next(i for i, line in enumerate(lines) if isinstance(line, KernelCall) and "b_state" in line.writes)
    reader = next(i for i, line in enumerate(lines) if isinstance(line, KernelCall) and "b_state" in line.uses()
                  and "b_state" not in line.writes)
    first, later = sorted((reader, writer))
    moved = lines[:first] + [lines[later]] + [line for i, line in enumerate(lines[first:], first) if i != later]
    with pytest.raises(VerificationError, match=r"line \d+ \(call .*must see b_state at version \d but runs"):
        verify(dataclasses.replace(program, lines=tuple(moved)))


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("target", TARGETS)
def test_batch_norm_training_step(target, kernels):
    """Train-mode batch norm through torch.compile: its statistics are generated reductions, its
    normalization fuses with the ReLU after it, and the running statistics (updated in place),
    the loss and the gradients equal eager's after three steps."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = ConvBlock().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    for _ in range(3):
        x = torch.randn(4, 3, 8, 8)
        expected, got = eager(x).square().mean(), compiled(x).square().mean()
        torch.testing.assert_close(got, expected)
        expected.backward()
        got.backward()
    for (name, a), b in zip(eager.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, msg=lambda m, name=name: f"{name}: {m}")
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=lambda m, name=name: f"{name}.grad: {m}")


def test_batch_norm_training_statistics_are_kernels():
    program = wrapgen.lower(ConvBlock().train(), (torch.randn(4, 3, 8, 8),))
    text = str(program)
    assert "batch_norm" not in text and "var_mean" not in text, text


def test_static_cache_generate_example():
    """examples/static_cache_generate.py: `model.generate(cache_implementation="static")` with the
    forward compiled by wrapgen through transformers' CompileConfig gives eager's tokens."""
    pytest.importorskip("transformers")
    import runpy
    from pathlib import Path

    torch._dynamo.reset()
    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "static_cache_generate.py"))
    example["main"]()


def test_cpu_kernels_take_in_unrelated_updates_up_to_a_stream_limit():
    """Ten equal-shaped SGD updates share no buffer: a C++ kernel takes in such nodes only while it
    touches at most CPU_UNRELATED_STREAMS buffers (one loop of 30 streams ran at half bandwidth)."""
    from wrapgen.lowering.kernel_lowering import CPU_UNRELATED_STREAMS

    def step(params, bufs, grads):
        torch._foreach_mul_(bufs, 0.9)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-0.01)

    args = tuple([torch.randn(64, 64) for _ in range(10)] for _ in range(3))
    program = wrapgen.lower(step, args)
    calls = [line for line in program.lines if isinstance(line, KernelCall)]
    assert len(calls) > 1 and all(len(call.uses()) <= CPU_UNRELATED_STREAMS for call in calls), str(program)
    expected = tuple([t.clone() for t in group] for group in args)
    step(*expected)
    wrapgen.compile(step, tuple([t.clone() for t in group] for group in args))(*args)
    for got, want in zip(args, expected):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_independent_updates_run_on_blocks_of_their_own_on_triton():
    """A Triton kernel fusing equal-shaped updates that share no buffer runs each on its own blocks
    (grid axis 1, one part per parameter), each part's writes right after its reads; the results
    equal eager's."""
    def step(params, bufs, grads):
        torch._foreach_mul_(bufs, 0.9)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-0.01)

    args = tuple([torch.randn(33, 7) for _ in range(6)] for _ in range(3))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(step, args)
        compiled = wrapgen.compile(step, tuple([t.clone() for t in group] for group in args))
    calls = [line for line in program.lines if isinstance(line, KernelCall)]
    assert calls and all(len(call.grid) == 2 and int(call.grid[1]) == 6 for call in calls), str(program)
    for source in (line.source for line in program.lines if isinstance(line, KernelDefinition)):
        branches = source.split("if part == ")[1:]
        assert len(branches) == 6 and all("tl.load" in b and "tl.store" in b for b in branches), source
    expected = tuple([t.clone() for t in group] for group in args)
    step(*expected)
    compiled(*args)
    for got, want in zip(args, expected):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_independent_parts_that_share_a_read_keep_one_block_on_triton():
    """Parts that read a common input (a rotary table applied to queries and keys) stay in one
    block, which loads it once: no grid axis of parts."""
    def rotate(q, k, table):
        return q * table, k * table

    args = (torch.randn(4, 33), torch.randn(4, 33), torch.randn(4, 33))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(rotate, args)
        compiled = wrapgen.compile(rotate, args)
    calls = [line for line in program.lines if isinstance(line, KernelCall)]
    assert len(calls) == 1 and len(calls[0].grid) == 1, str(program)
    for got, want in zip(compiled(*args), rotate(*args)):
        torch.testing.assert_close(got, want)
