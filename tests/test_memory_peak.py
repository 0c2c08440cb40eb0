"""Peak memory (issue 18, item 3): in-place computation by generated kernels over an input of
another shape and over library results held at a checked layout, the reuse planner measuring
against the peak that in-place computation leaves, the CPU peak-memory measurement, and planned
peaks of small real models against eager's."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import sympy
import torch

import wrapgen
from wrapgen.wrapper_ir import (
    Allocate,
    AssertInput,
    ExternKernel,
    Free,
    KernelCall,
    KernelDefinition,
    Output,
    Program,
    Reinterpret,
    ReuseBuffer,
    TensorInput,
    TensorRef,
    TensorType,
    verify,
)
from wrapgen.wrapper_ir.passes import peak_memory, reuse_buffers

CPU = torch.device("cpu")


def dense(dtype: torch.dtype, *sizes: int) -> TensorType:
    strides = tuple(sympy.Integer(int(torch.Size(sizes[i + 1 :]).numel())) for i in range(len(sizes)))
    return TensorType(dtype, CPU, tuple(sympy.Integer(s) for s in sizes), strides)


def f32(*sizes: int) -> TensorType:
    return dense(torch.float32, *sizes)


def cumsum_into(src: str, dst: str) -> ExternKernel:
    """A library call that is not elementwise: never computed in place."""
    return ExternKernel(None, "aten::cumsum.out", (TensorRef(src), 0), (("out", TensorRef(dst)),), None, (dst,))


def kernel(src: str, dst: str) -> KernelCall:
    """A generated pointwise kernel that declares it may write `dst` over `src`."""
    return KernelCall("k", (TensorRef(src), TensorRef(dst)), (), (dst,), ((dst, src),))


def program(lines: list) -> Program:
    x = f32(4, 8)
    header = [AssertInput("x", x.dtype, CPU, x.sizes, x.strides), KernelDefinition("k", "cpp", "/* pointwise */")]
    return verify(Program("p", (TensorInput("x", x),), (), (), tuple(header + lines)))


def reuses(p: Program) -> list[tuple[str, str]]:
    return [(line.name, line.source) for line in p.lines if isinstance(line, ReuseBuffer)]


UNIT = 4 * 8 * 4  # bytes of an f32[4, 8]


def test_kernel_writes_in_place_over_an_input_of_another_shape() -> None:
    """A [4, 8] matmul-like result feeding a [2, 2, 8] pointwise kernel that declares the pair:
    same element type, same bytes, so the kernel's output takes the input's storage."""
    p = program([
        Allocate("buf0", f32(4, 8)),
        cumsum_into("x", "buf0"),
        Allocate("buf1", f32(2, 2, 8)),
        kernel("buf0", "buf1"),
        Free("buf0"),
        Output((TensorRef("buf1"),)),
    ])
    planned = verify(reuse_buffers(p))
    assert reuses(planned) == [("buf1", "buf0")]
    assert peak_memory(planned) == UNIT < peak_memory(p) == 2 * UNIT


@pytest.mark.parametrize("source", [f32(2, 8), dense(torch.float16, 4, 16), dense(torch.int32, 4, 8)])
def test_kernel_in_place_needs_room_and_the_same_element_type(source: TensorType) -> None:
    """Too small, or another element type (even of the same bytes): its own storage."""
    p = program([
        Allocate("buf0", source),
        cumsum_into("x", "buf0"),
        Allocate("buf1", f32(2, 2, 8)),
        kernel("buf0", "buf1"),
        Free("buf0"),
        Output((TensorRef("buf1"),)),
    ])
    assert reuses(verify(reuse_buffers(p))) == []


def test_library_call_in_place_still_needs_the_same_layout() -> None:
    """An elementwise library call checks shapes itself: a reshaped input is not overwritten."""
    relu = ExternKernel(None, "aten::relu.out", (TensorRef("buf0"),), (("out", TensorRef("buf1")),), None, ("buf1",))
    p = program([
        Allocate("buf0", f32(4, 8)),
        cumsum_into("x", "buf0"),
        Allocate("buf1", f32(2, 2, 8)),
        relu,
        Free("buf0"),
        Output((TensorRef("buf1"),)),
    ])
    assert reuses(verify(reuse_buffers(p))) == []


def test_dead_buffer_is_not_held_above_the_peak_in_place_computation_leaves() -> None:
    """In place, `b` no longer doubles the peak at the kernel: the peak left is 5 units (at `e`).
    Holding the dead `h` from its death to `g` would lift `e`'s line to 6 units — under the peak
    of the program before planning, so a planner measuring against that kept it (peak 6)."""
    f64_2units = dense(torch.float64, 4, 8)
    p = program([
        Allocate("a", f32(12, 8)),
        cumsum_into("x", "a"),
        Allocate("b", f32(12, 8)),
        kernel("a", "b"),  # in place: 6 units -> 3
        Free("a"),
        Allocate("h", f32(4, 8)),
        cumsum_into("b", "h"),
        Free("h"),  # h dies: 1 unit, f32
        Allocate("e", f64_2units),  # 2 units of another element size: cannot take h
        cumsum_into("b", "e"),
        Free("b"),
        Allocate("g", f32(4, 8)),  # could take h, if h were held across e's line
        cumsum_into("e", "g"),
        Free("e"),
        Output((TensorRef("g"),)),
    ])
    planned = verify(reuse_buffers(p))
    assert ("b", "a") in reuses(planned)
    assert ("g", "h") not in reuses(planned)
    assert peak_memory(planned) == 5 * UNIT < peak_memory(p) == 6 * UNIT


def test_reshaped_in_place_result_is_right_on_every_target() -> None:
    """A real generated kernel (gelu(x @ w) * 2 + 1 declares it may overwrite the matmul's
    result) whose output is declared as [2, 4, 32] over the [8, 32] matmul result: planned in
    place, the program returns the right values on the python and cpp targets."""
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    with wrapgen.config.patch(matmul_kernel_limit=0):
        lowered = wrapgen.lower(lambda x, w: torch.nn.functional.gelu(x @ w) * 2 + 1, (x, w))
    call = [line for line in lowered.lines if isinstance(line, KernelCall)][-1]
    out, source = call.may_alias[0]
    reshaped = f32(2, 4, 32)
    lines = [dataclasses.replace(line, type=reshaped) if isinstance(line, Allocate) and line.name == out else line
             for line in lowered.lines]
    program_ = verify(lowered.with_lines(lines))
    planned = verify(reuse_buffers(program_))
    assert (out, source) in reuses(planned)
    from wrapgen.backends.registry import get_backend

    expected = (torch.nn.functional.gelu(x @ w) * 2 + 1).view(2, 4, 32)
    for target in ("python", "cpp"):
        result = get_backend(target)().compile(planned).call([x.clone(), w.clone()])
        torch.testing.assert_close(result[0], expected)


# -- measurement and real models ----------------------------------------------------------------

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[models]'; `make test` installs it)",
)


def test_cpu_measurement_counts_each_storage_of_the_call() -> None:
    """Two 4 MB tensors alive at once, one returned: peak 8 MB, 4 MB without the output."""
    from benchmarks.cpu_memory import measure_call

    x = torch.randn(1000, 1000)

    def fn() -> torch.Tensor:
        a = x * 2
        b = a + 1
        del a
        return b

    measured = measure_call(fn)
    assert measured.output == 4_000_000
    # (a few bytes more: the scalars the ops wrap as tensors)
    assert measured.peak == pytest.approx(8_000_000, abs=4096)
    assert measured.temporaries == pytest.approx(4_000_000, abs=4096)


@pytest.mark.parametrize("target", [
    "python",
    "cpp",
    pytest.param("fx", marks=pytest.mark.skipif(not hasattr(torch.fx.graph, "_BoxedCodeGen"), reason="no boxed FX codegen")),
])
def test_boxed_call_frees_an_input_at_its_last_use(target: str) -> None:
    """Called boxed (aot_autograd's convention: a backward's saved activations come in a list
    the call empties), an input dies at its last use inside the call, not when the call returns."""
    from benchmarks.cpu_memory import measure_call

    w = torch.randn(500, 500)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x @ w) @ w  # x's last use is the first product

    compiled = wrapgen.compile(f, (torch.randn(500, 500),), target=target)
    unit = 500 * 500 * 4
    # x is made inside the measured call (the profiler sees no free of storage older than it):
    # +x, +product 1, -x, +product 2, -product 1: two units at most (three if x lived to the end)
    measured = measure_call(lambda: compiled.artifact.call([torch.randn(500, 500)]))
    assert measured.peak == pytest.approx(2 * unit, abs=4096)
    x = torch.randn(500, 500)
    torch.testing.assert_close(compiled.artifact.call([x])[0], f(x))


# Tiny configurations: seconds to lower and run, the same architectures as the benchmark's.
TINY = {
    "gpt2": {"layers": 3, "hidden": 64, "heads": 2, "vocab": 128, "batch": 2, "tokens": 64},
    "bert": {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 256, "vocab": 128, "batch": 2, "tokens": 64},
    "resnet50": {"depths": [1, 1, 1, 1], "batch": 2, "image": 32},
}


@needs_transformers
@pytest.mark.parametrize("family", sorted(TINY))
def test_planned_peak_is_at_most_eagers_measured_peak(family: str) -> None:
    """The plan wrapgen runs (default buffer reuse) holds no more storage at once than eager
    allocates on the CPU for the same call."""
    from benchmarks import models
    from benchmarks.cpu_memory import measure_call
    from wrapgen.api import optimize

    torch.manual_seed(0)
    model, inputs = models.FAMILIES[family].instantiate("cpu", torch.float32, "auto", **TINY[family])
    with torch.no_grad():
        eager = measure_call(lambda: model(*inputs))
        planned = optimize(wrapgen.lower(model, inputs))
    peak = int(dict(planned.metadata)["peak memory (bytes)"])
    assert peak <= eager.peak, f"{family}: planned {peak} bytes, eager measured {eager.peak}"


class ConvBlock(torch.nn.Module):
    """A bottleneck's tail: two convolutions whose results a fused BatchNorm + add + ReLU reads."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.shortcut = torch.nn.Conv2d(4, 8, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + self.bn2(self.shortcut(x))) * 2


@pytest.mark.parametrize("target", ["python", "cpp", "fx", "interpret"])
def test_kernel_writes_in_place_over_a_library_result(target: str) -> None:
    """The kernel after the convolutions writes over one of their results (the program holds
    it at a checked layout): one activation fewer at the peak, and the same values as eager
    (the interpret target runs under the sanitizer, which checks every overlap)."""
    torch.manual_seed(0)
    model = ConvBlock().eval()
    for bn in (model.bn, model.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 4, 8, 8)
    # NCHW throughout (on the CPU the convolutions may measure faster NHWC, and a kernel writing
    # the NCHW result cannot write over an NHWC input it reads elsewhere)
    with torch.no_grad(), wrapgen.config.patch(layout_optimization=False):
        lowered = wrapgen.lower(model, (x,))
        planned = verify(reuse_buffers(lowered))
        library = {line.name for line in lowered.lines if isinstance(line, ExternKernel) and line.name}
        over_library = [line for line in planned.lines if isinstance(line, Reinterpret) and line.source in library
                        and any(isinstance(c, KernelCall) and (line.name, line.source) in c.may_alias for c in planned.lines)]
        assert over_library, "no kernel writes over a convolution's result"
        assert peak_memory(planned) < peak_memory(lowered)
        options = {"sanitize": True} if target == "interpret" else {}
        with wrapgen.config.patch(**options):
            compiled = wrapgen.compile(model, (x,), target=target)
        fresh = torch.randn(2, 4, 8, 8)
        torch.testing.assert_close(compiled(fresh), model(fresh))


@pytest.mark.parametrize("where", ["before", "none", "after"])
def test_kernel_writes_over_a_library_result_only_at_a_checked_layout(where: str) -> None:
    """A library result (layout chosen by the library) is overwritten only where an
    `EnsureStrides` line checks its layout before the kernel runs; the output is then a
    `Reinterpret` of it (relative to its storage offset), not a `ReuseBuffer` (offset 0)."""
    from wrapgen.wrapper_ir import layout
    t = f32(4, 8)
    ensure = layout.EnsureStrides("buf0", t.dtype, CPU, t.sizes, t.strides)
    result = TensorType(t.dtype, CPU, t.sizes, None)
    lines = [ExternKernel("buf0", "aten::cumsum.default", (TensorRef("x"), 0), (), result)]
    lines += [ensure] if where == "before" else []
    lines += [Allocate("buf1", t), kernel("buf0", "buf1")]
    lines += [ensure] if where == "after" else []
    lines += [Free("buf0"), Output((TensorRef("buf1"),))]
    p = program(lines)
    planned = verify(reuse_buffers(p))
    views = [(line.name, line.source) for line in planned.lines if isinstance(line, Reinterpret)]
    if where == "before":
        assert views == [("buf1", "buf0")] and reuses(planned) == []
        assert peak_memory(planned) == UNIT < peak_memory(p) == 2 * UNIT
    else:
        assert views == [] and reuses(planned) == []
