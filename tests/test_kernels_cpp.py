"""Generated C++ kernels: fusion counts, golden IR, correctness against eager on fresh inputs
(broadcasts, non-contiguous inputs, reductions, int/bool dtypes, dynamic shapes), the kernel
cache, and safe embedding of kernel source in the emitted Python module."""

from __future__ import annotations

import ctypes

import pytest
import torch

import wrapgen
from benchmarks.workloads import WORKLOADS
from wrapgen.kernels.cpp import build
from wrapgen.lowering.loop_ops.matmul import SMALL_MATMUL_K
from wrapgen.wrapper_ir.lines import ExternKernel, KernelCall, KernelDefinition


def kernel_calls(program) -> list[KernelCall]:
    return [line for line in program.lines if isinstance(line, KernelCall)]


def externs(program) -> list[str]:
    return [line.op for line in program.lines if isinstance(line, ExternKernel)]


def check(fn, *inputs, dynamic: bool = False, **tolerances):
    compiled = wrapgen.compile(fn, inputs, dynamic=dynamic)
    fresh = tuple(torch.randn_like(t) if t.is_floating_point() else t.clone() for t in inputs)
    torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tolerances)
    return compiled


# -- fusion counts on the benchmark workloads -------------------------------------------------


@pytest.mark.parametrize(
    "name, kernels",
    [("pointwise_chain", 1), ("layernorm_gelu", 1), ("softmax", 1), ("rmsnorm", 1)],
)
def test_workload_fusion_counts(name: str, kernels: int) -> None:
    model, inputs = WORKLOADS[name].build("cpu", "quick")
    compiled = wrapgen.compile(model, inputs)
    assert len(kernel_calls(compiled.program)) == kernels
    assert externs(compiled.program) == []
    fresh = tuple(torch.randn_like(t) for t in inputs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*fresh), model(*fresh))


def relu_mul_add(x, y):
    return torch.relu(x * y + 1.0)


def test_golden_ir_of_a_fused_program() -> None:
    program = wrapgen.lower(relu_mul_add, (torch.randn(4, 8), torch.randn(8)))
    text = str(program).split("lines:\n", 1)[1]
    assert text == (
        "  1  assert_input args_0: f32[4, 8] strides [8, 1] cpu\n"
        "  2  assert_input args_1: f32[8] strides [1] cpu\n"
        "  3  kernel cpp_fused_relu_0 [cpp] (13 lines) device='cpu', ops='aten::relu.default'\n"
        "  4  buf0 = allocate f32[4, 8] strides [8, 1] cpu\n"
        "  5  call cpp_fused_relu_0(args_0, args_1, buf0)  writes buf0  may alias buf0<-args_0\n"
        "  6  free args_0\n"
        "  7  free args_1\n"
        "  8  return (buf0,)\n"
    )
    source = next(line for line in program.lines if isinstance(line, KernelDefinition)).source
    assert "#pragma omp simd" in source and "in_ptr1[x1]" in source  # y broadcast over rows


def test_library_calls_stay_and_pointwise_around_them_fuses() -> None:
    w = torch.randn(8, 16)
    with wrapgen.config.patch(matmul_kernel_limit=0):
        compiled = check(lambda x: torch.tanh(x @ w) * 2 + 1, torch.randn(4, 8), rtol=1e-4, atol=1e-5)
    assert externs(compiled.program) == ["aten::mm.out"]
    assert len(kernel_calls(compiled.program)) == 1


def test_small_matmul_is_a_reduction_fused_with_its_epilogue() -> None:
    """A tiny static matmul (and addmm) is a generated reduction over k with the pointwise work
    after it in the same kernel; a long reduced dim, a large or a dynamic one stays a library call."""
    w, b = torch.randn(8, 16), torch.randn(16)
    compiled = check(lambda x: torch.tanh(x @ w) * 2 + 1, torch.randn(4, 8), rtol=1e-4, atol=1e-5)
    assert externs(compiled.program) == [] and len(kernel_calls(compiled.program)) == 1
    compiled = check(lambda x: torch.relu(torch.addmm(b, x.t(), w)), torch.randn(8, 5), rtol=1e-4, atol=1e-5)
    assert externs(compiled.program) == [] and len(kernel_calls(compiled.program)) == 1
    # an operand computed by pointwise work is computed once, not once per read
    compiled = check(lambda x: torch.exp(x) @ w, torch.randn(4, 8), rtol=1e-4, atol=1e-5)
    assert len(kernel_calls(compiled.program)) == 2
    long_k = torch.randn(SMALL_MATMUL_K + 1, 4)
    assert externs(check(lambda x: x @ long_k, torch.randn(2, SMALL_MATMUL_K + 1), rtol=1e-4, atol=1e-5).program) == ["aten::mm.out"]
    big = torch.randn(64, 64)
    assert externs(check(lambda x: x @ big, torch.randn(64, 64), rtol=1e-4, atol=1e-4).program) == ["aten::mm.out"]
    assert externs(check(lambda x: x @ w, torch.randn(4, 8), dynamic=True, rtol=1e-4, atol=1e-5).program) == ["aten::mm.out"]


def test_kernels_off_gives_library_calls_only() -> None:
    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(lambda x: torch.relu(x + 1), (torch.randn(4),))
    assert kernel_calls(program) == [] and externs(program)


# -- correctness ------------------------------------------------------------------------------


POINTWISE_CASES = [
    (lambda x, y: x + y, [(4, 1), (1, 6)]),
    (lambda x, y: torch.where(x > 0, x, y * 0.5).exp(), [(3, 5), (5,)]),
    (lambda x: x.t() * 2 + x.t().sigmoid(), [(5, 3)]),
    (lambda x: x.permute(2, 0, 1).clamp(-0.5, 0.5) - 1, [(2, 3, 4)]),
    (lambda x: x[:, 1:5:2].erf() + x[:, 0:1].expand(3, 2), [(3, 8)]),
    (lambda x: x.view(6, 4).abs().rsqrt(), [(2, 3, 4)]),
    (lambda x: x.reshape(4, 6).pow(3).tanh() / 2, [(2, 12)]),
    (lambda x: torch.nn.functional.gelu(x, approximate="tanh") + torch.nn.functional.gelu(x), [(4, 7)]),
]
POINTWISE_IDS = ["broadcast", "where", "transpose", "permute_clamp", "slices", "view", "reshape", "gelu"]


@pytest.mark.parametrize("fn, shapes", POINTWISE_CASES, ids=POINTWISE_IDS)
def test_pointwise_and_views(fn, shapes) -> None:
    check(fn, *(torch.randn(s) for s in shapes))


def test_noncontiguous_inputs() -> None:
    x = torch.randn(6, 4).t()  # strides (1, 4)
    y = torch.randn(4, 12)[:, ::2]  # strides (12, 2)
    compiled = wrapgen.compile(lambda a, b: (a * b).sum(1), (x, y))
    x2, y2 = torch.randn(6, 4).t(), torch.randn(4, 12)[:, ::2]
    torch.testing.assert_close(compiled(x2, y2), (x2 * y2).sum(1))


REDUCTION_CASES = [
    lambda x: x.sum(0),
    lambda x: x.amax(1, keepdim=True) - x,
    lambda x: x.mean((0, 2)),
    lambda x: x.amin(-1),
    lambda x: torch.var(x, dim=1, keepdim=True),
    lambda x: torch.var(x, dim=(0, 2), correction=0),
    lambda x: x.prod(1),
    lambda x: x.sum(),
    lambda x: torch.log_softmax(x, dim=1),
    lambda x: torch.softmax(x, dim=0),
    lambda x: torch.nn.functional.layer_norm(x, (4,)) * 2,
    lambda x: (x.argmax(1), x.argmin(-1, keepdim=True), x.argmax()),
]
REDUCTION_IDS = ["sum0", "amax_keepdim", "mean02", "amin", "var_keepdim", "var_multi", "prod", "sum_all",
                 "log_softmax", "softmax_dim0", "layer_norm", "argmax_argmin"]


@pytest.mark.parametrize("fn", REDUCTION_CASES, ids=REDUCTION_IDS)
def test_reductions(fn) -> None:
    compiled = check(fn, torch.randn(3, 5, 4), rtol=1e-5, atol=1e-5)
    assert kernel_calls(compiled.program)


def _kernel_source(program) -> str:
    return next(line for line in program.lines if isinstance(line, KernelDefinition)).source


@pytest.mark.parametrize("dynamic", [False, True])
def test_softmax_row_cache_computes_exp_once_per_element(dynamic: bool) -> None:
    """A static row that fits the row cache: the sum pass keeps exp(x - max) and the output pass
    reads it back (one exp per element). Rows of dynamic length, or too long to cache,
    recompute it, and every variant matches eager."""
    fn = lambda x: torch.softmax(x * 0.5, dim=-1) + torch.sigmoid(x).sum(-1, keepdim=True)  # noqa: E731
    cached = check(fn, torch.randn(6, 300), dynamic=dynamic, rtol=1e-5, atol=1e-5)
    source = _kernel_source(cached.program)
    if dynamic:
        assert "wg_row" not in source and source.count("expf(") == 3
    else:
        # exp(x*0.5 - max) is kept by the sum pass; the output pass computes no exp
        assert source.count("wg_row0[r0] = ") == 1 and source.count("expf(") == 2, source
    too_long = check(fn, torch.randn(2, 20000), rtol=1e-5, atol=1e-5)
    assert "wg_row" not in _kernel_source(too_long.program)


def test_exp_of_every_range_matches_eager() -> None:
    """Arguments beyond +-87 (a masked softmax's -FLT_MAX, a sigmoid of a large input) take the
    prelude's shifted path around libmvec's scalar fallback: 0, subnormals, overflow to inf, NaN."""
    x = torch.tensor([float("-inf"), -3.4e38, -200.0, -110.5, -104.0, -100.0, -95.5, -90.0, -87.5, -87.0, -1.0, 0.0,
                      1.0, 87.0, 87.5, 88.5, 88.75, 100.0, 3.4e38, float("inf"), float("nan")] + [0.5] * 11)
    compiled = wrapgen.compile(lambda t: (torch.exp(t), torch.sigmoid(-t)), (x,))
    got_exp, got_sigmoid = compiled(x)
    torch.testing.assert_close(got_exp, torch.exp(x), rtol=2e-6, atol=0, equal_nan=True)
    torch.testing.assert_close(got_sigmoid, torch.sigmoid(-x), rtol=2e-6, atol=0, equal_nan=True)
    assert "wg_expf(" in _kernel_source(compiled.program)


def test_a_masked_softmax_reads_its_boolean_mask_as_bytes() -> None:
    """g++ vectorizes no loop that loads a `bool`: a causal mask's byte is read instead, so the
    softmax's loops (and libmvec's expf) vectorize; the result is eager's."""
    def masked(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores.masked_fill(mask, torch.finfo(scores.dtype).min), dim=-1)

    mask = torch.ones(32, 32, dtype=torch.bool).triu(1)
    scores = torch.randn(2, 4, 32, 32)
    compiled = check(masked, scores, mask, rtol=1e-6, atol=1e-7)
    source = _kernel_source(compiled.program)
    assert "reinterpret_cast<const uint8_t&>" in source and "const bool v" in source, source


def test_max_propagates_nan() -> None:
    x = torch.randn(4, 8)
    compiled = wrapgen.compile(lambda t: t.amax(1), (x,))
    x[1, 3] = float("nan")
    torch.testing.assert_close(compiled(x), x.amax(1), equal_nan=True)


def test_argmax_takes_the_first_nan_and_the_first_tie() -> None:
    x = torch.randn(5, 40)
    compiled = wrapgen.compile(lambda t: (t.argmax(1), t.argmin(1)), (x,))
    x[1, 7], x[1, 30], x[3, :] = float("nan"), float("nan"), 2.0
    torch.testing.assert_close(compiled(x), (x.argmax(1), x.argmin(1)))
    assert not externs(compiled.program)


def test_int_and_bool_dtypes() -> None:
    def fn(a, b, m):
        s = (a * 3 + b) // 1 if False else a * 3 + b
        return s, (a > b) & m, torch.where(m, a, -b), s.sum(1), (a == b).any(1), m.logical_not()

    a = torch.randint(-5, 5, (4, 6))
    b = torch.randint(-5, 5, (4, 6), dtype=torch.int32)
    m = torch.rand(4, 6) > 0.5
    compiled = wrapgen.compile(fn, (a, b, m))
    a2, b2, m2 = torch.randint(-5, 5, (4, 6)), torch.randint(-5, 5, (4, 6), dtype=torch.int32), torch.rand(4, 6) > 0.5
    torch.testing.assert_close(compiled(a2, b2, m2), fn(a2, b2, m2))
    assert kernel_calls(compiled.program)


def test_arange_with_bool_bounds_falls_back() -> None:
    def fn():
        return torch.arange(False, True, True, dtype=torch.float32)

    torch.testing.assert_close(wrapgen.compile(fn, [])(), fn())


def test_casts_full_and_arange() -> None:
    def fn(x):
        i = torch.arange(x.shape[1])
        return x.to(torch.float64) * i + torch.full((x.shape[1],), 2.5), (x > 0).to(torch.int32)

    check(fn, torch.randn(3, 5))


@pytest.mark.parametrize("name", ["softmax", "layernorm_gelu"])
def test_dynamic_shapes(name: str) -> None:
    model, inputs = WORKLOADS[name].build("cpu", "quick")
    compiled = wrapgen.compile(model, inputs, dynamic=True)
    assert compiled.program.symbols
    for rows, cols in [(3, 17), (8, 64), (5, 33)]:
        fresh = tuple(torch.randn(rows, cols) for _ in inputs) if name == "softmax" else None
        if name == "layernorm_gelu":
            continue  # LayerNorm's weight fixes cols; vary the rows only
        with torch.no_grad():
            torch.testing.assert_close(compiled(*fresh), model(*fresh))
    if name == "layernorm_gelu":
        for rows in (3, 9, 16):
            fresh = tuple(torch.randn(rows, inputs[0].shape[1]) for _ in inputs)
            with torch.no_grad():
                torch.testing.assert_close(compiled(*fresh), model(*fresh))


def test_dynamic_view_uses_floor_div() -> None:
    def fn(x):
        return (x.reshape(-1) * 2).view(x.shape[1], x.shape[0]).relu()

    compiled = wrapgen.compile(fn, (torch.randn(4, 6),), dynamic=True)
    for shape in [(3, 5), (7, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), fn(x))


# -- build, cache, embedding ----------------------------------------------------------------------


def test_second_compile_hits_the_kernel_cache() -> None:
    def fn(x):
        return torch.sigmoid(x) * 3.25 - 1

    wrapgen.compile(fn, (torch.randn(5, 7),))
    compiled_before, hits_before = build.stats["compiled"], build.stats["cache_hits"]
    wrapgen.compile(fn, (torch.randn(5, 7),))
    assert build.stats["compiled"] == compiled_before
    assert build.stats["cache_hits"] > hits_before


def test_index_helpers_are_correct_for_negative_operands() -> None:
    source = (
        'extern "C" int64_t probe(int64_t a, int64_t b, int64_t which) '
        "{ return which ? wg_mod(a, b) : wg_floordiv(a, b); }\n"
    )
    library = build.load_library([source])
    probe = library.probe
    probe.argtypes = [ctypes.c_int64] * 3
    probe.restype = ctypes.c_int64
    for a in (-7, -6, -1, 0, 5, 7):
        for b in (-3, 2, 3):
            assert probe(a, b, 0) == a // b and probe(a, b, 1) == a % b


def test_kernel_source_is_embedded_safely() -> None:
    program = wrapgen.lower(lambda x: x * 2 + 1, (torch.randn(3),))
    tricky = '// quotes """ and \'\'\' and a backslash \\ and \\n and \\"\n'
    lines = tuple(
        KernelDefinition(line.name, line.language, tricky + line.source, line.metadata)
        if isinstance(line, KernelDefinition) else line
        for line in program.lines
    )
    artifact = wrapgen.api.build(program.with_lines(lines), "python")
    embedded = next(line for line in lines if isinstance(line, KernelDefinition)).source
    assert embedded.startswith(tricky) and repr(embedded) in artifact.source
    x = torch.randn(3)
    torch.testing.assert_close(artifact.call([x])[0], x * 2 + 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_identical_layers_share_one_kernel(dynamic: bool) -> None:
    """Kernel parameters are named by position, so a chain of identical layers on different
    weights generates one kernel, compiled once and called per layer."""
    weights = [torch.randn(8, 8) for _ in range(6)]

    def chain(x):
        for w in weights:
            x = torch.tanh(x @ w)
        return x

    compiled = check(chain, torch.randn(8, 8), dynamic=dynamic, rtol=1e-4, atol=1e-5)
    lines = compiled.program.lines
    definitions = [line for line in lines if isinstance(line, KernelDefinition)]
    calls = [line for line in lines if isinstance(line, KernelCall)]
    # static: mm + tanh fused into one kernel per layer; dynamic: a library mm, then tanh
    assert len(calls) == 6 and len(definitions) == 1, compiled.program


# -- gathers: indices read from tensor data ----------------------------------------------------

def _embedding_relu(idx, x, table):
    return torch.relu(torch.nn.functional.embedding(idx, table)) * x


def _index_select_sin(src, idx):
    return torch.index_select(src, 1, idx).sin() + 1


def _index_select_sum(src, idx):  # a gather inside a reduction
    return torch.index_select(src, 0, idx).sum(-1)


def _gather_exp(src, idx):
    return torch.gather(src.exp(), 1, idx) * 2  # the gathered tensor is computed first


GATHER_CASES = [
    (_embedding_relu, lambda d: (torch.randint(0, 50, (4, 7), device=d), torch.randn(4, 7, 16, device=d),
                                 torch.randn(50, 16, device=d))),
    (_index_select_sin, lambda d: (torch.randn(5, 9, 3, device=d), torch.tensor([8, 0, 8, 3], device=d))),
    (_index_select_sum, lambda d: (torch.randn(9, 33, device=d), torch.tensor([8, 0, 8, 3], device=d))),
    (_gather_exp, lambda d: (torch.randn(6, 10, device=d), torch.randint(0, 10, (6, 4), device=d))),
]
GATHER_IDS = ["embedding", "index_select", "index_select_sum", "gather"]


@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn, make", GATHER_CASES, ids=GATHER_IDS)
def test_gathers_fuse_into_kernels(fn, make, dynamic: bool, target: str) -> None:
    inputs = make("cpu")
    compiled = wrapgen.compile(fn, inputs, dynamic=dynamic, target=target)
    assert externs(compiled.program) == [], compiled.program
    torch.testing.assert_close(compiled(*inputs), fn(*inputs))
    if dynamic and fn is _embedding_relu:
        other = (torch.randint(0, 50, (2, 3)), torch.randn(2, 3, 16), inputs[2])
        torch.testing.assert_close(compiled(*other), fn(*other))


@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
@pytest.mark.parametrize("bad", [50, -1])
def test_gather_index_out_of_range_raises(target: str, bad: int) -> None:
    """Eager raises IndexError for an index outside [0, rows); so does every target, having read
    nothing outside the table."""
    model = torch.nn.Embedding(50, 16).eval()
    idx = torch.randint(0, 50, (4, 7))
    compiled = wrapgen.compile(model, (idx,), target=target)
    assert externs(compiled.program) == []
    idx[2, 3] = bad
    with pytest.raises(IndexError, match="out of range"):
        compiled(idx)
    idx[2, 3] = 0
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), model(idx))  # still usable
