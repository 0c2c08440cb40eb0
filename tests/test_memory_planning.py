"""Memory planning: buffer reuse, pools, the peak estimate and the picture — never aliasing
storage that is still in use."""

from __future__ import annotations

from pathlib import Path

import pytest
import sympy
import torch

import wrapgen
from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AllocateFromPool,
    AssertInput,
    BindSymbol,
    ExternKernel,
    Free,
    KernelCall,
    Output,
    Program,
    Reinterpret,
    ReuseBuffer,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    verify,
)
from wrapgen.wrapper_ir.passes import peak_memory, plan_memory, pool_buffers, reuse_buffers

CPU, F32 = torch.device("cpu"), torch.float32
s0 = sympy.Symbol("s0", integer=True, positive=True)
MODES = ["none", "reuse", "pooled"]


def f32(*sizes) -> TensorType:
    sizes = tuple(sympy.sympify(s) for s in sizes)
    strides = tuple(sympy.Mul(*sizes[i + 1 :]) for i in range(len(sizes)))
    return TensorType(F32, CPU, sizes, strides)


def relu_into(src: str, dst: str) -> ExternKernel:
    return ExternKernel(None, "aten::relu.out", (TensorRef(src),), (("out", TensorRef(dst)),), None, (dst,))


def cumsum_into(src: str, dst: str) -> ExternKernel:
    """A library call that is not elementwise: never computed in place."""
    return ExternKernel(None, "aten::cumsum.out", (TensorRef(src), 0), (("out", TensorRef(dst)),), None, (dst,))


def program(lines, dynamic: bool = False) -> Program:
    x = f32(s0, 8) if dynamic else f32(4, 8)
    header = [BindSymbol(s0, "x", "size", 0, OBSERVED, 1, None)] if dynamic else []
    header.append(AssertInput("x", F32, CPU, x.sizes, x.strides))
    symbols = (SymbolInfo(s0, 4, 1),) if dynamic else ()
    return verify(Program("p", (TensorInput("x", x),), symbols, (), tuple(header + lines)))


def reuses(p: Program) -> list[ReuseBuffer]:
    return [line for line in p.lines if isinstance(line, ReuseBuffer)]


def test_dead_buffer_is_reused() -> None:
    p = program(
        [
            Allocate("buf0", f32(4, 8)),
            relu_into("x", "buf0"),
            Allocate("buf1", f32(4, 8)),
            cumsum_into("buf0", "buf1"),
            Free("buf0"),
            Allocate("buf2", f32(8, 4)),
            cumsum_into("buf1", "buf2"),
            Free("buf1"),
            Output((TensorRef("buf2"),)),
        ]
    )
    planned = verify(reuse_buffers(p))
    assert [(r.name, r.source) for r in reuses(planned)] == [("buf2", "buf0")]
    index = planned.lines.index(reuses(planned)[0])
    assert planned.lines[index + 1] == Free("buf0")  # the old name ends as the storage passes on
    assert peak_memory(planned) == peak_memory(p) == 2 * 4 * 8 * 4


def test_reuse_views_storage_from_its_start_whatever_the_source() -> None:
    """A reuse re-views storage from offset 0: by the C fast path where the source is known to
    start its storage (an allocation), by as_strided where it may not (an extern's result, here
    a slice at offset 8)."""
    from wrapgen.backends import PythonEmitter

    x = f32(4, 8)
    lines = [
        Allocate("buf0", f32(4, 8)),
        relu_into("x", "buf0"),
        ReuseBuffer("buf1", "buf0", f32(8, 4)),
        Free("buf0"),
        ExternKernel("buf2", "aten::slice.Tensor", (TensorRef("buf1"), 0, 2, 8), (), "buf1"),
        ExternKernel("buf3", "aten::clone", (TensorRef("buf2"),), ()),
        ExternKernel("buf4", "aten::slice.Tensor", (TensorRef("buf3"), 0, 1, 6), (), "buf3"),
        ReuseBuffer("buf5", "buf4", f32(2, 4)),
        Free("buf4"),
        Output((TensorRef("buf1"), TensorRef("buf5"))),
    ]
    p = verify(Program("p", (TensorInput("x", x),), (), (), (AssertInput("x", F32, CPU, x.sizes, x.strides), *lines)))
    compiled = PythonEmitter().compile(p)
    assert "buf1 = _reinterpret(buf0, (8, 4), (4, 1), 0)" in compiled.source
    assert "buf5 = _as_strided(buf4" in compiled.source
    arg = torch.randn(4, 8)
    viewed, reused = compiled.call([arg.clone()])
    torch.testing.assert_close(viewed, arg.relu().view(8, 4))
    clone_storage = arg.relu().view(8, 4)[2:8].clone().flatten()
    torch.testing.assert_close(reused, clone_storage[:8].view(2, 4))  # from the storage's start, not buf4's


def test_elementwise_call_writes_over_an_input_that_dies_there() -> None:
    def chain(second_op) -> Program:
        return program(
            [
                Allocate("buf0", f32(4, 8)),
                relu_into("x", "buf0"),  # x is the caller's: never overwritten
                Allocate("buf1", f32(4, 8)),
                second_op("buf0", "buf1"),  # buf0 dies here
                Free("buf0"),
                Output((TensorRef("buf1"),)),
            ]
        )

    elementwise, p = verify(reuse_buffers(chain(relu_into))), chain(relu_into)
    assert [(r.name, r.source) for r in reuses(elementwise)] == [("buf1", "buf0")]
    assert peak_memory(elementwise) == 4 * 8 * 4 < peak_memory(p) == 2 * 4 * 8 * 4
    assert reuses(verify(reuse_buffers(chain(cumsum_into)))) == []  # not elementwise: own storage
    x = torch.randn(4, 8)
    from wrapgen.backends import PythonEmitter

    torch.testing.assert_close(PythonEmitter().compile(elementwise).call([x.clone()]), (x.relu(),))


def test_refuses_storage_a_live_view_still_uses() -> None:
    p = program(
        [
            Allocate("buf0", f32(4, 8)),
            relu_into("x", "buf0"),
            Reinterpret("view", "buf0", F32, CPU, (8, 4), (1, 8)),
            Free("buf0"),  # the name goes, the storage lives on in `view`
            Allocate("buf1", f32(4, 8)),
            relu_into("view", "buf1"),
            Free("view"),
            Output((TensorRef("buf1"),)),
        ]
    )
    assert reuses(verify(reuse_buffers(p))) == []
    pooled = verify(pool_buffers(p))
    pooled_lines = {line.name: line for line in pooled.lines if isinstance(line, AllocateFromPool)}
    assert "buf1" not in pooled_lines  # an output keeps its own allocation


def test_refuses_storage_an_output_view_refers_to() -> None:
    p = program(
        [
            Allocate("buf0", f32(4, 8)),
            relu_into("x", "buf0"),
            Reinterpret("out", "buf0", F32, CPU, (4, 4), (8, 1), sympy.Integer(4)),
            Free("buf0"),
            Allocate("buf1", f32(4, 8)),
            relu_into("x", "buf1"),
            Free("buf1"),
            Allocate("buf2", f32(4, 8)),
            relu_into("x", "buf2"),
            Output((TensorRef("out"), TensorRef("buf2"))),
        ]
    )
    planned = verify(reuse_buffers(p))
    assert all(r.source not in ("buf0", "out") for r in reuses(planned))
    assert [(r.name, r.source) for r in reuses(planned)] == [("buf2", "buf1")]
    pooled = verify(pool_buffers(p))
    assert not any(isinstance(line, AllocateFromPool) and line.name == "buf0" for line in pooled.lines)


def test_refuses_input_storage_and_other_devices_or_sizes() -> None:
    p = program(
        [
            Allocate("buf0", f32(4, 8)),
            relu_into("x", "buf0"),
            Free("x"),  # the input's name is dropped: its storage is the caller's
            Allocate("buf1", TensorType(F32, torch.device("meta"), (sympy.Integer(4), sympy.Integer(8)), (sympy.Integer(8), sympy.Integer(1)))),
            Free("buf0"),
            Allocate("buf2", f32(64, 8)),  # far larger than buf0: no fit
            Allocate("buf3", f32(1, 8)),  # far smaller: outside the tolerance
            Output((TensorRef("buf1"), TensorRef("buf2"), TensorRef("buf3"))),
        ]
    )
    assert reuses(verify(reuse_buffers(p))) == []


def test_symbolic_sizes_are_compared_with_sympy() -> None:
    p = program(
        [
            Allocate("buf0", f32(s0, 8)),
            relu_into("x", "buf0"),
            Allocate("buf1", f32(s0, 8)),
            cumsum_into("buf0", "buf1"),
            Free("buf0"),
            Allocate("buf2", f32(8, s0)),  # same bytes for every s0
            cumsum_into("buf1", "buf2"),
            Free("buf1"),
            Allocate("buf3", f32(s0 + 1, 8)),  # may not fit in s0*8 floats: refused
            Output((TensorRef("buf2"), TensorRef("buf3"))),
        ],
        dynamic=True,
    )
    planned = verify(reuse_buffers(p))
    assert [(r.name, r.source) for r in reuses(planned)] == [("buf2", "buf0")]
    # buf0/buf2 (32*s0 bytes) stays live with buf3 (32*(s0 + 1)); buf1 died before buf3.
    assert sympy.expand(peak_memory(planned) - (64 * s0 + 32)) == 0


def test_pool_offsets_never_overlap_live_buffers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    pooled = plan_memory(wrapgen.lower(model.eval(), (torch.randn(3, 16),), dynamic=True), "pooled")
    lines = pooled.lines
    placed = [(i, line) for i, line in enumerate(lines) if isinstance(line, AllocateFromPool)]
    assert placed, str(pooled)
    free_at = {line.name: i for i, line in enumerate(lines) if isinstance(line, Free)}
    for n in (1, 2, 7, 1000):
        values = {info.symbol: n for info in pooled.symbols}
        spans = []
        for start, line in placed:
            offset = int(sympy.sympify(line.offset).xreplace(values))
            nbytes = int((line.type.sizes[0] * line.type.strides[0] * 4).xreplace(values))
            spans.append((start, free_at[line.name], offset, offset + nbytes))
        for a in spans:
            for b in spans:
                if a is not b and a[0] <= b[1] and b[0] <= a[1]:
                    assert a[3] <= b[2] or b[3] <= a[2], (n, a, b)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# where kernels run: C++ kernels on the CPU, Triton kernels on the CPU (Triton's interpreter,
# which tests/conftest.py switches on without a GPU), Triton kernels on CUDA
PLACES = [
    pytest.param("cpu", "cpp", id="cpu-cpp-kernels"),
    pytest.param("cpu", "triton", id="cpu-triton-kernels", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="the Triton interpreter runs where there is no GPU")),
    pytest.param("cuda", "triton", id="cuda", marks=[pytest.mark.cuda, _CUDA]),
]


def _planning_models() -> list[tuple[torch.nn.Module, tuple[int, ...]]]:
    return [
        (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16)), (4, 16)),
        (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten()), (2, 3, 10, 10)),
        (torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True), (2, 8, 32)),
    ]


@pytest.mark.parametrize("device, kernels", PLACES)
@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_models_match_eager_in_every_mode(device: str, kernels: str, target: str, mode: str, dynamic: bool) -> None:
    """Every planning mode keeps every target right, with either kind of generated kernel."""
    if kernels == "triton" and device == "cpu" and (target != "python" or dynamic):
        pytest.skip("the interpreter is slow: Triton kernels under each mode on the python target, static shapes")
    torch.manual_seed(0)
    for model, shape in _planning_models():
        model = model.eval().to(device)
        with wrapgen.config.patch(memory_planning=mode, cpu_kernels=kernels):
            compiled = wrapgen.compile(model, (torch.randn(shape, device=device),), dynamic=dynamic, target=target)
        assert dict(compiled.program.metadata)["memory planning"] == mode
        for batch in (shape[0], 3) if dynamic else (shape[0],):
            x = torch.randn(batch, *shape[1:], device=device)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_peak_estimate_is_printed_with_the_ir() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    static = wrapgen.compile(model, (torch.randn(4, 8),))
    assert "peak memory (bytes): 256" in str(static.program)  # relu writes over the addmm result: 4x16 f32
    dynamic = wrapgen.compile(model, (torch.randn(4, 8),), dynamic=True)
    peak = dict(dynamic.program.metadata)["peak memory (bytes)"]
    assert isinstance(peak, sympy.Expr) and {str(s) for s in peak.free_symbols} == {"s0"}
    assert f"peak memory (bytes): {peak}" in str(dynamic.program)


def test_debug_dir_draws_the_memory_plan(tmp_path: Path) -> None:
    with wrapgen.config.patch(debug_dir=str(tmp_path), memory_planning="pooled"):
        wrapgen.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval(), (torch.randn(4, 8),))
    (folder,) = tmp_path.iterdir()
    picture = folder / "memory.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_planning_option_is_validated() -> None:
    with pytest.raises(ValueError, match="one of none, reuse, pooled"):
        with wrapgen.config.patch(memory_planning="greedy"):
            pass


def test_no_in_place_write_while_a_view_of_the_input_is_read() -> None:
    add = ExternKernel(
        None, "aten::add.out", (TensorRef("buf0"), TensorRef("view")), (("out", TensorRef("buf1")),), None, ("buf1",)
    )
    p = program(
        [
            Allocate("buf0", f32(8, 8)),
            ExternKernel(None, "aten::fill.Scalar_out", (TensorRef("buf0"), 1.0), (("out", TensorRef("buf0")),), None, ("buf0",)),
            Reinterpret("view", "buf0", F32, CPU, (8, 8), (1, 8)),
            Allocate("buf1", f32(8, 8)),
            add,
            Free("buf0"),
            Free("view"),
            Output((TensorRef("buf1"),)),
        ]
    )
    assert reuses(verify(reuse_buffers(p))) == []


def test_generated_kernel_writes_in_place_only_where_it_declares_so() -> None:
    """A pointwise kernel declares (output, input) pairs it may compute in place; reuse honours
    exactly those, and the compiled result stays right (C++ kernels, and Triton where it runs)."""
    with wrapgen.config.patch(matmul_kernel_limit=0):  # the matmul's result is what gets overwritten
        program_ = wrapgen.lower(lambda x, w: torch.nn.functional.gelu(x @ w) * 2 + 1, (torch.randn(8, 16), torch.randn(16, 32)))
    calls = [line for line in program_.lines if isinstance(line, KernelCall)]
    assert calls and calls[-1].may_alias  # gelu(mm) * 2 + 1 may overwrite the matmul's result
    planned = verify(reuse_buffers(program_))
    out, source = calls[-1].may_alias[0]
    assert [(r.name, r.source) for r in reuses(planned)] == [(out, source)]
    # Reductions never declare pairs: a row is read again after some of it may be written.
    softmax = wrapgen.lower(lambda x: torch.softmax(x @ x.t(), -1), (torch.randn(8, 8),))
    assert all(not line.may_alias for line in softmax.lines if isinstance(line, KernelCall))
    compiled = wrapgen.compile(lambda x, w: torch.nn.functional.gelu(x @ w) * 2 + 1, (torch.randn(8, 16), torch.randn(16, 32)))
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    torch.testing.assert_close(compiled(x, w), torch.nn.functional.gelu(x @ w) * 2 + 1)


def test_may_alias_must_name_a_written_buffer_and_an_argument() -> None:
    with pytest.raises(ValueError, match="may_alias pair"):
        KernelCall("k", (TensorRef("a"), TensorRef("b")), writes=("b",), may_alias=(("a", "b"),)).check()


def test_peak_of_many_large_symbolic_sizes_keeps_every_candidate() -> None:
    """Past a size, the peak is a Max of all candidates (proving an order between large
    expressions can take sympy minutes); it still bounds every candidate."""
    from wrapgen.wrapper_ir.passes.peak_memory import MAX_PRUNED_CANDIDATES, _maximum

    s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
    candidates = [sympy.floor((s0 * 17 + k) / 10) * sympy.floor((s1 * 17 + k) / 10) * (s2 + k) * 4
                  for k in range(MAX_PRUNED_CANDIDATES + 1)] + [sympy.Integer(100)]
    peak = _maximum(candidates)
    for values in ({s0: 1, s1: 1, s2: 1}, {s0: 7, s1: 3, s2: 40}):
        at = int(peak.xreplace(values))  # how planning evaluates it (subs would re-prove the Max)
        assert all(at >= int(c.xreplace(values)) for c in candidates)
    assert _maximum([s0 * 4, s0 * 8, sympy.Integer(0)]) == 8 * s0  # small cases still prune
