"""Channels-last convolutions (wrapgen/lowering/graph_passes/conv_layout.py) and memory-order loops
(wrapgen/lowering/loop_order.py).

The rewrite runs on every convolution on CUDA; on the CPU each convolution goes channels-last where
that measured faster (conv_choice.py). Most CPU tests here turn it on for every CPU convolution
through `conv_layout.DEVICES`, so what they check does not depend on a timing; the CUDA tests run
it as shipped.
"""

from __future__ import annotations

import copy

import pytest
import sympy
import torch
from torch import nn

import wrapgen
import wrapgen.dynamo
import wrapgen.lowering.graph_passes.conv_choice as conv_choice
import wrapgen.lowering.graph_passes.conv_layout as conv_layout
import wrapgen.lowering.loop_ops.norms as norms
from wrapgen.kernels.triton import compat
from wrapgen.loop_ir import Load, red_vars, row_vars
from wrapgen.lowering.capture import capture
from wrapgen.lowering.loop_order import memory_order, reduction_order
from wrapgen.wrapper_ir.lines import Allocate, ExternKernel, KernelCall, KernelDefinition, Output
from wrapgen.wrapper_ir.values import TensorRef

TARGETS = ["python", "cpp", "fx"]


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(conv_layout, "DEVICES", frozenset({"cpu", "cuda"}))


class Block(nn.Module):
    """conv3x3-bn-relu, conv1x1-bn + residual, relu; returns a pooled result and a conv output."""

    def __init__(self, c: int = 8, groups: int = 1) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, groups=groups), nn.BatchNorm2d(c)
        self.c3 = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        z = torch.relu(self.b2(self.c2(y)) + y)
        return z.mean((2, 3)), self.c3(z), torch.max_pool2d(z, 2)


def _eval(model: nn.Module) -> nn.Module:
    model.eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model


def _check(model: nn.Module, example: torch.Tensor, target: str, **tol) -> None:
    compiled = wrapgen.compile(model, (example,), target=target)
    for _ in range(2):
        x = torch.randn_like(example)
        with torch.no_grad():
            expected = model(x)
        got = compiled(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, **tol)
            assert g.stride() == e.stride(), (g.stride(), e.stride())


def _clone_kernels(program) -> list[str]:
    """What the kernel calls that only copy (clone) a tensor read, but for copies back to a
    returned result's layout: the program's inputs and constants (an image, a weight)."""
    copies = {line.name for line in program.lines
              if isinstance(line, KernelDefinition) and dict(line.metadata).get("ops") == "aten::clone.default"}
    returned = {v.name for line in program.lines if isinstance(line, Output) for v in line.values
                if isinstance(v, TensorRef)}
    return [line.args[0].name for line in program.lines
            if isinstance(line, KernelCall) and line.kernel in copies and not set(line.writes) & returned]


def _given(program) -> set[str]:
    return {i.name for i in program.inputs} | {c.name for c in program.constants}


def _conv_inputs_channels_last(program) -> bool:
    types = {name: t for line in program.lines for name, t in line.defined_types().items()}
    types.update({c.name: c.type for c in program.constants})
    types.update({i.name: i.type for i in program.inputs})
    for line in program.lines:
        if isinstance(line, ExternKernel) and line.op == "aten::convolution.default":
            for arg in line.args[:2]:
                t = types[arg.name]
                probe = torch.empty_strided([int(s) for s in t.sizes], [int(s) for s in t.strides], device="meta")
                if not probe.is_contiguous(memory_format=torch.channels_last):
                    return False
    return True


# -- the rewrite -------------------------------------------------------------------------------


def test_program_copies_only_the_image_and_spatial_weights(on_cpu):
    model, x = _eval(Block()), torch.randn(2, 3, 8, 8)
    program = wrapgen.lower(model, (x,))
    assert _conv_inputs_channels_last(program)
    # the image and the two 3x3 weights; the 1x1 weight is channels-last as it is; nothing
    # between one convolution's output and the next convolution's input
    copied = _clone_kernels(program)
    assert len(copied) == 3 and set(copied) <= _given(program), str(program)
    # the max pool walks the NHWC map in memory order: no separate kernel lays its values out
    ops = [dict(line.metadata).get("ops") for line in program.lines if isinstance(line, KernelDefinition)]
    assert any(o.startswith("max_pool2d") for o in ops) and "getitem" not in ops, ops
    with wrapgen.config.patch(layout_optimization=False):
        plain = wrapgen.lower(model, (x,))
    assert not _clone_kernels(plain)
    assert not _conv_inputs_channels_last(plain)


class Stem(nn.Module):
    """ResNet's stem: conv 7x7/2, batch norm, ReLU, max pool 3x3/2, then a 1x1 convolution."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1, self.c2 = nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.Conv2d(8, 16, 1)

    def forward(self, x):
        return torch.relu(self.c2(torch.max_pool2d(torch.relu(self.b1(self.c1(x))), 3, 2, 1))).mean((2, 3))


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_stem_pools_in_nhwc_without_copies(on_cpu, target):
    model, x = _eval(Stem()), torch.randn(2, 3, 16, 16)
    program = wrapgen.lower(model, (x,))
    assert _conv_inputs_channels_last(program)
    copied = _clone_kernels(program)
    assert len(copied) == 2 and set(copied) <= _given(program), str(program)  # the image, the 7x7 weight
    ops = [dict(line.metadata).get("ops") for line in program.lines if isinstance(line, KernelDefinition)]
    assert "max_pool2d,getitem" in ops, ops  # pooled and stored NHWC by one kernel
    _check(model, x, target)


def _first_inputs(program, op: str) -> list[torch.Tensor]:
    """Per library call of `op`, in order: a meta tensor laid out as its first input."""
    types = {name: t for line in program.lines for name, t in line.defined_types().items()}
    types.update({i.name: i.type for i in program.inputs})
    return [torch.empty_strided([int(s) for s in t.sizes], [int(s) for s in t.strides], device="meta")
            for t in (types[line.args[0].name] for line in program.lines
                      if isinstance(line, ExternKernel) and line.op == op)]


def _conv_layouts(program) -> list[bool]:
    """Per library convolution, in order: whether it reads a channels-last input."""
    return [probe.is_contiguous(memory_format=torch.channels_last) and not probe.is_contiguous()
            for probe in _first_inputs(program, "aten::convolution.default")]


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_cpu_convolutions_take_the_measured_layout_one_by_one(monkeypatch, target):
    """The first convolution measured faster NHWC, the others NCHW: the first reads NHWC, the
    second reads its input copied back to NCHW, results equal eager's at eager's strides."""
    first = []
    monkeypatch.setattr(conv_layout, "faster_channels_last", lambda node: not first and not first.append(node))
    model, x = _eval(Block()), torch.randn(2, 3, 8, 8)
    assert _conv_layouts(wrapgen.lower(model, (x,))) == [True, False, False]
    _check(model, x, target)


def test_cpu_convolutions_all_declined_leave_the_graph_alone(monkeypatch):
    monkeypatch.setattr(conv_layout, "faster_channels_last", lambda node: False)
    captured = capture(_eval(Block()), (torch.randn(2, 3, 8, 8),), dynamic=False)
    assert conv_layout.channels_last_convolutions(captured) is captured


def test_cpu_layout_measurement_runs_each_shape_once(monkeypatch):
    """The real measurement: a bool per convolution, each distinct one timed once per process."""
    monkeypatch.setattr(conv_choice, "_cache", {})
    timed = []
    measure = conv_choice._measure
    monkeypatch.setattr(conv_choice, "_measure", lambda *a: timed.append(a) or measure(*a))
    captured = capture(_eval(Block()), (torch.randn(2, 3, 8, 8),), dynamic=False)
    convs = [n for n in captured.graph_module.graph.nodes if conv_layout.is_conv2d(n, frozenset({"cpu"}))]
    assert all(isinstance(conv_choice.faster_channels_last(n), bool) for n in convs + convs)
    assert len(timed) == len(convs) == 3  # three distinct convolutions, each timed once


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_cpu_default_matches_eager(target):
    _check(_eval(Block()), torch.randn(2, 3, 8, 8), target)
    _check(_eval(Stem()), torch.randn(2, 3, 16, 16), target)


@pytest.mark.parametrize("target", TARGETS)
def test_matches_eager_with_eager_strides(on_cpu, target):
    _check(_eval(Block()), torch.randn(2, 3, 8, 8), target)


@pytest.mark.parametrize("model", ["block", "stem", "flatten"])
def test_reference_interpreter_under_the_sanitizer(on_cpu, model):
    """Every read, write, view and reuse of the rewritten programs checked (SanitizerError)."""
    built, shape = {"block": (Block, (2, 3, 8, 8)), "stem": (Stem, (2, 3, 16, 16)),
                    "flatten": (Flatten, (2, 3, 5, 5))}[model]
    with wrapgen.config.patch(sanitize=True):
        _check(_eval(built()), torch.randn(*shape), "interpret")


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise(on_cpu, target):
    _check(_eval(Block(groups=8)), torch.randn(2, 3, 8, 8), target)


def test_grouped_convolutions_stay_nchw(on_cpu):
    class Grouped(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(8, 8, 3, padding=1, groups=2)

        def forward(self, x):
            return torch.relu(self.c(x))

    model, x = Grouped().eval(), torch.randn(2, 8, 6, 6)
    captured = capture(model, (x,), dynamic=False)
    assert conv_layout.channels_last_convolutions(captured) is captured
    _check(model, x, "python")


@pytest.mark.parametrize("dims", [1, 3])
def test_conv1d_and_conv3d_left_alone(on_cpu, dims):
    conv = (nn.Conv1d if dims == 1 else nn.Conv3d)(3, 4, 3)
    model = nn.Sequential(conv, nn.ReLU()).eval()
    x = torch.randn(2, 3, *([6] * dims))
    captured = capture(model, (x,), dynamic=False)
    assert conv_layout.channels_last_convolutions(captured) is captured
    _check(model, x, "python")


class Flatten(nn.Module):
    """A flatten of an NHWC map (a view its strides cannot express) and an as_strided read, after
    two convolutions (the layout carries between them, so the rewrite runs)."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 3, 3, padding=1)
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 5 * 5, 6)

    def forward(self, x):
        y = torch.relu(self.c(torch.relu(self.c0(x))))
        return self.fc(y.flatten(1)), y.as_strided((2, 10), (1, 3))


@pytest.mark.parametrize("target", TARGETS)
def test_layout_dependent_views_read_the_original_layout(on_cpu, target):
    model, x = Flatten().eval(), torch.randn(2, 3, 5, 5)
    captured = capture(model, (x,), dynamic=False)
    assert conv_layout.channels_last_convolutions(captured) is not captured
    _check(model, x, target)


class PatchEmbedding(nn.Module):
    """A vision transformer's stem: one patchifying convolution, flattened into tokens, and a
    second, separate branch's convolution that no other convolution feeds or reads."""

    def __init__(self) -> None:
        super().__init__()
        self.patch, self.side = nn.Conv2d(3, 16, 4, stride=4), nn.Conv2d(3, 16, 8, stride=8)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.norm(tokens), self.side(x).mean((2, 3))


def test_convolutions_no_other_feeds_or_reads_stay_nchw(on_cpu):
    model, x = PatchEmbedding().eval(), torch.randn(2, 3, 16, 16)
    captured = capture(model, (x,), dynamic=False)
    assert conv_layout.channels_last_convolutions(captured) is captured
    program = wrapgen.lower(model, (x,))
    assert _clone_kernels(program) == []  # neither the image nor a weight is copied


def test_only_chained_convolutions_go_channels_last(on_cpu):
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = PatchEmbedding()
            self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return *self.stem(x), self.b(torch.relu(self.a(x))).sum((2, 3))

    model, x = Mixed().eval(), torch.randn(2, 3, 16, 16)
    graph = capture(model, (x,), dynamic=False).graph_module.graph
    convs = [n for n in graph.nodes if conv_layout.is_conv2d(n, frozenset({"cpu"}))]
    chained = conv_layout.chained_convolutions(graph, convs)
    assert [n.args[1].name for n in chained] == ["p_a_weight", "p_b_weight"], chained
    for target in TARGETS:
        _check(model, x, target)


class PoolFormer(nn.Module):
    """A PoolFormer stage: convolutions between group norms (one group), whose CUDA kernel takes
    only a contiguous input."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem, self.norm1, self.norm2 = nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(1, c), nn.GroupNorm(1, c)
        self.fc1, self.fc2 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, c, 1)

    def forward(self, x):
        x = self.stem(x)
        y = self.norm1(x)
        x = x + torch.nn.functional.avg_pool2d(y, 3, 1, 1) - y
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _group_norm_inputs_contiguous(program) -> list[bool]:
    return [probe.is_contiguous() for probe in _first_inputs(program, "aten::native_group_norm.default")]


@pytest.mark.parametrize("target", TARGETS)
def test_group_norm_reads_a_contiguous_input(on_cpu, monkeypatch, target):
    monkeypatch.setattr(conv_layout, "CONTIGUOUS_INPUT_OPS",
                        {torch.ops.aten.native_group_norm.default: frozenset({"cpu", "cuda"})})
    model, x = PoolFormer().eval(), torch.randn(2, 3, 8, 8)
    program = wrapgen.lower(model, (x,))
    contiguous = _group_norm_inputs_contiguous(program)
    assert contiguous and all(contiguous), str(program)
    _check(model, x, target, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_a_group_norm_a_kernel_computes_keeps_the_network_channels_last(on_cpu, monkeypatch, target):
    """Where a generated kernel computes the group norm (CUDA's library kernel wants a contiguous
    input, the loops read any layout), its result stays channels-last: the pool, the residual sums
    and the next convolutions read NHWC, and nothing but the image and the weights is copied."""
    monkeypatch.setattr(conv_layout, "CONTIGUOUS_INPUT_OPS",
                        {torch.ops.aten.native_group_norm.default: frozenset({"cpu", "cuda"})})
    monkeypatch.setattr(norms, "GROUP_NORM_DEVICES", frozenset({"cpu", "cuda"}))
    model, x = PoolFormer().eval(), torch.randn(2, 3, 8, 8)
    program = wrapgen.lower(model, (x,))
    assert "native_group_norm" not in str(program)  # computed by kernels
    assert _conv_inputs_channels_last(program), str(program)
    returned = {v.name for line in program.lines if isinstance(line, Output) for v in line.values}
    maps = [line for line in program.lines if isinstance(line, Allocate) and len(line.type.sizes) == 4
            and line.name not in returned]
    assert maps and all(_channels_last(line.type) for line in maps), str(program)  # the pool's result too
    _check(model, x, target, rtol=1e-4, atol=1e-4)


def _channels_last(t) -> bool:
    probe = torch.empty_strided([int(s) for s in t.sizes], [int(s) for s in t.strides], device="meta")
    return probe.is_contiguous(memory_format=torch.channels_last) and not probe.is_contiguous()


def test_option_off_from_the_environment(monkeypatch):
    monkeypatch.setenv("WRAPGEN_LAYOUT_OPTIMIZATION", "0")
    assert wrapgen.config.OPTIONS["layout_optimization"].parse_env() is False


def test_dynamic_sizes_left_alone(on_cpu):
    model, x = _eval(Block()), torch.randn(2, 3, 8, 8)
    captured = capture(model, (x,), dynamic=True)
    assert conv_layout.channels_last_convolutions(captured) is captured


class TrainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.b1(self.c1(x)))).sum((2, 3))


@pytest.mark.parametrize("always", [False, True], ids=["heuristic", "forced"])
def test_training_through_torch_compile(on_cpu, monkeypatch, always):
    """Forward and backward through aot_autograd: the forward's saved tensors keep the strides
    the backward was traced with (forced: the rewrite runs even where it would not pay)."""
    if always:
        monkeypatch.setattr(conv_layout, "pays", lambda convs, restores: True)
    eager = TrainNet().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="wrapgen", fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss_e, loss_c = eager(x_e).square().sum(), compiled(x_c).square().sum()
        loss_e.backward()
        loss_c.backward()
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x_c.grad, x_e.grad, rtol=1e-4, atol=1e-4)
        for p_c, p_e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-4)
        eager.zero_grad()
        model.zero_grad()


# -- memory-order loops --------------------------------------------------------------------------


def test_memory_order():
    assert memory_order((2, 8, 4, 4), (128, 1, 32, 8), {}) == (0, 2, 3, 1)
    assert memory_order((2, 8, 4, 4), (128, 16, 4, 1), {}) is None
    assert memory_order((2, 8, 1, 1), (8, 1, 8, 8), {}) is None  # size-1 dims stay in place


def test_reduction_order_follows_the_input():
    xs, rs = row_vars(4), red_vars(2)
    nhwc = Load("buf", 128 * xs[0] + xs[1] + 32 * xs[2] + 8 * xs[3], torch.float32)
    assert reduction_order(nhwc, (2, 8, 4, 4), [0, 1, 2], {}) == (0, 2, 1)  # kept n, c, h: c innermost
    nchw = Load("buf", 128 * xs[0] + 16 * xs[1] + 4 * xs[2] + xs[3], torch.float32)
    assert reduction_order(nchw, (2, 8, 4, 4), [0, 1, 2], {}) == (0, 1, 2)
    assert rs  # (reduced variables never enter the order)


def test_reduction_order_of_a_padded_window_over_nhwc():
    """A 3x3 stride-1 window with padding 1 over an NHWC 8x8 map (a PoolFormer pool): its row
    index clamps at the map's edge, so a step from the origin moves nothing; channels still walk
    innermost. A rolled (wrapped) index keeps its stride too."""
    n, c, h, w = row_vars(4)
    r, s = red_vars(2)

    def clamp(e):
        return sympy.Max(0, sympy.Min(7, e))

    window = Load("buf", 512 * n + c + 64 * clamp(h - 1 + r) + 8 * clamp(w - 1 + s), torch.float32)
    assert reduction_order(window, (2, 8, 8, 8, 3, 3), [0, 1, 2, 3], {}) == (0, 2, 3, 1)
    rolled = Load("buf", 512 * n + 64 * c + 8 * h + sympy.Mod(w + 3, 8), torch.float32)
    assert reduction_order(rolled, (2, 8, 8, 8, 3), [0, 1, 2, 3], {}) == (0, 1, 2, 3)


@pytest.mark.skipif(not (compat.available() and compat.interpreting()), reason="needs triton in interpreter mode")
@pytest.mark.parametrize("target", ["python", "fx"])
def test_triton_kernels_walk_nhwc_in_memory_order(on_cpu, target):
    model, x = _eval(Block()), torch.randn(2, 3, 8, 8)
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(model, (x,))
        sources = [line.source for line in program.lines if isinstance(line, KernelDefinition)]
        relu = [s for s in sources if "relu" in s and "tl.store" in s]
        assert relu and all("tl.store(out_ptr" in s for s in relu)
        # the stored NHWC result is indexed by the flat index itself: coalesced
        assert any("+ (xindex)" in s.split("tl.store")[-1] for s in relu), "\n\n".join(relu)
        _check(model, x, target)


# -- CUDA (the rewrite as shipped) ---------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_channels_last(target, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = _eval(Block()).cuda().to(dtype)
    x = torch.randn(2, 3, 16, 16, device="cuda", dtype=dtype)
    program = wrapgen.lower(model, (x,))
    assert _conv_inputs_channels_last(program)
    copied = _clone_kernels(program)
    assert len(copied) == 3 and set(copied) <= _given(program), str(program)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-3, "atol": 1e-3}
    _check(model, x, target, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_cuda_layout_dependent_views(target):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Flatten().eval().cuda()
    _check(model, torch.randn(2, 3, 5, 5, device="cuda"), target, rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_cuda_group_norm_after_channels_last_convolutions(target):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = PoolFormer().eval().cuda()
    _check(model, torch.randn(2, 3, 8, 8, device="cuda"), target, rtol=1e-3, atol=1e-3)
    wrapgen.dynamo.ensure_registered()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
def test_cuda_training():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    eager = TrainNet().train().cuda()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="wrapgen", fullgraph=True)
    x = torch.randn(4, 3, 8, 8, device="cuda")
    x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(x_e).square().sum().backward()
    compiled(x_c).square().sum().backward()
    torch.testing.assert_close(x_c.grad, x_e.grad, rtol=1e-3, atol=1e-3)
    for p_c, p_e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("target", TARGETS)
def test_sequential_whose_input_is_named_input(on_cpu, target):
    """nn.Sequential's argument is `input`: the rewritten graph's placeholder is renamed (fx
    will not shadow the builtin) and the lowering still finds the program's input."""
    model = _eval(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                nn.Flatten(), nn.Linear(8 * 4 * 4, 10)))
    _check(model, torch.randn(4, 3, 8, 8), target, rtol=1e-4, atol=1e-4)


# -- CPU training: saved activations stay channels-last -------------------------------------------


class PoolNet(nn.Module):
    """A ResNet stem and block in train mode: conv-bn-relu, max pool (saves its indices), conv-bn."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.pool(torch.relu(self.b1(self.c1(x))))
        return torch.relu(self.b2(self.c2(y)) + y).mean((2, 3))


def _train_steps(target: str, steps: int = 2) -> None:
    eager = PoolNet().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="wrapgen", options={"target": target}, fullgraph=True)
    for _ in range(steps):
        x = torch.randn(2, 3, 12, 12)
        x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss_e, loss_c = eager(x_e).square().sum(), compiled(x_c).square().sum()
        loss_e.backward()
        loss_c.backward()
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x_c.grad, x_e.grad, rtol=1e-4, atol=1e-4)
        for p_c, p_e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-4)
        for b_c, b_e in zip(model.buffers(), eager.buffers()):  # running statistics, batches tracked
            torch.testing.assert_close(b_c, b_e, rtol=1e-4, atol=1e-4)
        eager.zero_grad()
        model.zero_grad()


@pytest.mark.parametrize("target", TARGETS)
def test_cpu_training_keeps_saved_activations_channels_last(monkeypatch, target):
    """On by default for CPU training steps (not the on_cpu fixture): the forward reports its saved
    activations' NHWC strides to aot_autograd and the backward is re-traced at them, not copied back."""
    import wrapgen.dynamo

    reported: list[list] = []
    report = wrapgen.dynamo._report_output_strides
    monkeypatch.setattr(wrapgen.dynamo, "_report_output_strides", lambda s: (reported.append(list(s)), report(s)))

    def no_copies(graph):
        raise AssertionError("the backward copied its inputs back instead of re-tracing them")

    monkeypatch.setattr(conv_layout, "_inputs_copied_back", no_copies)
    torch._dynamo.reset()
    _train_steps(target)
    nhwc = [s for strides in reported for s in strides if s is not None and len(s) == 4 and s[1] == 1]
    assert reported and nhwc, reported


def test_cpu_training_backward_copies_its_inputs_back_where_it_cannot_retrace(monkeypatch):
    """Re-tracing the backward at the forward's strides fails: its marked inputs are copied back to
    the traced layout first, and the step is still eager's."""
    real = conv_layout._Rewriter

    class Failing(real):
        def run(self):
            if not self.convs:  # the backward's re-trace
                raise RuntimeError("planted")
            return super().run()

    copied = []
    copy_back = conv_layout._inputs_copied_back
    monkeypatch.setattr(conv_layout, "_Rewriter", Failing)
    monkeypatch.setattr(conv_layout, "_inputs_copied_back", lambda graph: copied.append(1) or copy_back(graph))
    torch._dynamo.reset()
    _train_steps("python", steps=1)
    assert copied
