"""Generated Triton kernels: on the GPU when there is one, else on CPU tensors in Triton's
interpreter (TRITON_INTERPRET=1, set by conftest.py on machines without CUDA), so CI covers
Triton codegen. The same cases as the C++ kernels, plus what only Triton has: contiguous
index detection, looped reductions, launch grids for dynamic sizes, unaligned inputs."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from benchmarks.workloads import WORKLOADS
from tests.test_kernels_cpp import (
    GATHER_CASES,
    GATHER_IDS,
    POINTWISE_CASES,
    POINTWISE_IDS,
    REDUCTION_CASES,
    REDUCTION_IDS,
    externs,
    kernel_calls,
)
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir.lines import KernelDefinition

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = [
    pytest.mark.skipif(not compat.available(), reason="needs triton"),
    pytest.mark.skipif(DEVICE == "cpu" and not compat.interpreting(), reason="Triton on CPU needs TRITON_INTERPRET=1"),
]


@pytest.fixture(autouse=True)
def triton_kernels():
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        yield


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, device=DEVICE)


def check(fn, *inputs, dynamic: bool = False, **tolerances):
    compiled = wrapgen.compile(fn, inputs, dynamic=dynamic)
    fresh = tuple(torch.randn_like(t) if t.is_floating_point() else t.clone() for t in inputs)
    torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tolerances)
    return compiled


def triton_sources(program) -> list[str]:
    return [line.source for line in program.lines if isinstance(line, KernelDefinition) and line.language == "triton"]


@pytest.mark.parametrize("fn, shapes", POINTWISE_CASES, ids=POINTWISE_IDS)
def test_pointwise_and_views(fn, shapes) -> None:
    compiled = check(fn, *(randn(*s) for s in shapes))
    assert triton_sources(compiled.program)


@pytest.mark.parametrize("fn", REDUCTION_CASES, ids=REDUCTION_IDS)
def test_reductions(fn) -> None:
    compiled = check(fn, randn(3, 5, 4), rtol=1e-5, atol=1e-5)
    assert triton_sources(compiled.program)


@pytest.mark.parametrize(
    "name, kernels",
    [("pointwise_chain", 1), ("layernorm_gelu", 1), ("softmax", 1), ("rmsnorm", 1)],
)
def test_workload_fusion_counts(name: str, kernels: int) -> None:
    model, inputs = WORKLOADS[name].build(DEVICE, "quick")
    compiled = wrapgen.compile(model, inputs)
    assert len(kernel_calls(compiled.program)) == kernels
    assert externs(compiled.program) == []
    fresh = tuple(torch.randn_like(t) for t in inputs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*fresh), model(*fresh))


def test_contiguous_reads_use_the_flat_index() -> None:
    """x[i, j] of a contiguous input is read at `xindex` (Triton then sees contiguity and vectorizes);
    a broadcast row vector at `xindex % n`."""
    compiled = check(lambda x, b: torch.relu(x + b), randn(6, 8), randn(8))
    source = triton_sources(compiled.program)[0]
    assert "+ (xindex)" in source and "(xindex % 8)" in source


def test_noncontiguous_and_unaligned_inputs() -> None:
    def fn(a, b):
        return (a * b).sum(1), a.exp() + 1

    base_a, base_b = randn(6, 4), randn(4, 13)
    x, y = base_a.t(), base_b[:, 1::2]  # y starts 4 bytes into its storage: not 16-byte aligned
    compiled = wrapgen.compile(fn, (x, y))
    x2, y2 = randn(6, 4).t(), randn(4, 13)[:, 1::2]
    torch.testing.assert_close(compiled(x2, y2), fn(x2, y2))


def test_long_rows_use_a_looped_reduction() -> None:
    def fn(x):
        return torch.softmax(x, -1), x.amax(-1), torch.nn.functional.layer_norm(x, (x.shape[-1],))

    compiled = check(fn, randn(3, 9000), rtol=1e-5, atol=1e-5)
    source = triton_sources(compiled.program)[0]
    assert "for roffset in range" in source


def test_max_propagates_nan() -> None:
    x = randn(4, 8)
    compiled = wrapgen.compile(lambda t: (t.amax(1), t.amin(1)), (x,))
    x[1, 3] = float("nan")
    torch.testing.assert_close(compiled(x), (x.amax(1), x.amin(1)), equal_nan=True)


@pytest.mark.parametrize("cols", [40, 9001], ids=["persistent", "looped"])
def test_argmax_takes_the_first_nan_and_the_first_tie(cols: int) -> None:
    x = randn(5, cols)
    compiled = wrapgen.compile(lambda t: (t.argmax(1), t.argmin(1), t.argmax()), (x,))
    x[1, 7], x[1, 30], x[3, :] = float("nan"), float("nan"), 2.0
    torch.testing.assert_close(compiled(x), (x.argmax(1), x.argmin(1), x.argmax()))
    assert not externs(compiled.program)


def test_int_and_bool_dtypes() -> None:
    def fn(a, b, m):
        s = a * 3 + b
        return s, (a > b) & m, torch.where(m, a, -b), s.sum(1), (a == b).any(1), m.logical_not(), m.all(1)

    def inputs():
        return (torch.randint(-5, 5, (4, 6), device=DEVICE), torch.randint(-5, 5, (4, 6), dtype=torch.int32, device=DEVICE),
                torch.rand(4, 6, device=DEVICE) > 0.5)

    compiled = wrapgen.compile(fn, inputs())
    fresh = inputs()
    torch.testing.assert_close(compiled(*fresh), fn(*fresh))
    assert triton_sources(compiled.program)


def test_casts_full_arange_and_zero_dim() -> None:
    def fn(x, s):
        i = torch.arange(x.shape[1], device=x.device)
        return x.to(torch.float64) * i + torch.full((x.shape[1],), 2.5, device=x.device), (x > 0).to(torch.int32), s * 2 + x.sum()

    check(fn, randn(3, 5), randn())


@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_dynamic_shapes_at_several_sizes(name: str) -> None:
    model, inputs = WORKLOADS[name].build(DEVICE, "quick")
    compiled = wrapgen.compile(model, inputs, dynamic=True)
    assert compiled.program.symbols
    cols = inputs[0].shape[1]
    for rows in (3, 17, 64):
        fresh = tuple(randn(rows, cols) for _ in inputs)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*fresh), model(*fresh))


def test_dynamic_reduced_size_and_views() -> None:
    def fn(x):
        return torch.softmax(x, -1), (x.reshape(-1) * 2).view(x.shape[1], x.shape[0]).relu()

    compiled = wrapgen.compile(fn, (randn(4, 6),), dynamic=True)
    for shape in [(3, 5), (7, 2), (2, 300)]:
        x = randn(*shape)
        torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("matmul_kernel_limit", [0, 32768])
def test_identical_layers_share_one_kernel(matmul_kernel_limit: int) -> None:
    """tiny_chain's layers: with library matmuls, one shared tanh kernel; with small matmuls
    generated, one matmul+tanh kernel per layer (shared from the second on), no library call."""
    model, inputs = WORKLOADS["tiny_chain_50"].build(DEVICE, "quick")
    layers = WORKLOADS["tiny_chain_50"].sizes["quick"]["n"]
    with wrapgen.config.patch(matmul_kernel_limit=matmul_kernel_limit):
        compiled = wrapgen.compile(model, inputs)
    assert len(externs(compiled.program)) == (layers if matmul_kernel_limit == 0 else 0)
    # the first matmul reads the caller's input, which may be unaligned: its kernel differs
    assert len(triton_sources(compiled.program)) == (1 if matmul_kernel_limit == 0 else 2)
    assert len(kernel_calls(compiled.program)) == layers
    fresh = tuple(torch.randn_like(t) for t in inputs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*fresh), model(*fresh))


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch) -> None:
    if DEVICE != "cpu":
        pytest.skip("CPU-only behaviour")
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        wrapgen.compile(lambda x: x * 2, (randn(4),))


def test_launch_is_bound_once_not_through_the_jit_grid() -> None:
    compiled = wrapgen.compile(lambda x: torch.tanh(x) * 2, (randn(64),))
    source = compiled.artifact.source
    assert "TritonKernels(" in source and "[grid]" not in source and "](" not in source.split("def call")[1]


def test_native_launch_takes_addresses_and_unaligned_pointers_take_their_variant(monkeypatch) -> None:
    """The launcher hands Triton's native launch the tensors' addresses (not the tensors), the
    scalars as given; an unaligned pointer (or one given as an address) takes the variant
    compiled without the alignment assumption, with the arguments as passed. Checked without a
    GPU: the compile and the native launch are stand-ins that record what they get."""
    from wrapgen.kernels.triton import runtime

    spec = runtime.KernelSpec("k", "", (("arg_names", ("a", "n", "b")), ("arg_types", ("ptr:float32", "int32", "ptr:float32")),
                                        ("unaligned", ("b",)), ("device", "cuda:0")))
    native_calls, slow_calls = [], []
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    monkeypatch.setattr(compat, "launch_parts", lambda compiled, constexprs, device: (
        lambda *args: native_calls.append(args), ("head",), ("tail",)))
    monkeypatch.setattr(compat, "bind_launcher", lambda compiled, fn, constexprs, device: (
        lambda *args: slow_calls.append((compiled, args))))
    kernels = runtime.TritonKernels.__new__(runtime.TritonKernels)
    kernels.functions = {"k": None}
    kernels._compile = lambda spec, aligned: "aligned" if aligned else "unaligned"
    launch = kernels._launcher(spec)
    a, b = torch.zeros(8), torch.zeros(9)
    launch(1, 1, 1, 0, a, 5, b)
    assert native_calls == [(1, 1, 1, 0, "head", a.data_ptr(), 5, b.data_ptr(), "tail")] and not slow_calls
    shifted = b[1:]  # 4 bytes in: not 16-byte aligned
    launch(1, 1, 1, 0, a, 5, shifted)
    assert len(native_calls) == 1 and slow_calls[0][0] == "unaligned"
    compiled_as, args = slow_calls[0]
    assert args[:4] == (1, 1, 1, 0) and args[4] is a and args[5] == 5 and args[6] is shifted  # as passed
    launch(1, 1, 1, 0, a, 5, b.data_ptr() + 4)  # an address already
    assert len(native_calls) == 1 and len(slow_calls) == 2


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn, make", GATHER_CASES, ids=GATHER_IDS)
def test_gathers(fn, make, dynamic: bool) -> None:
    inputs = make(DEVICE)
    compiled = wrapgen.compile(fn, inputs, dynamic=dynamic)
    assert externs(compiled.program) == [] and triton_sources(compiled.program)
    assert all("@triton.jit(debug=True)" in s for s in triton_sources(compiled.program) if "device_assert" in s)
    torch.testing.assert_close(compiled(*inputs), fn(*inputs))
