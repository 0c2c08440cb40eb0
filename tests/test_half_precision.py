"""bfloat16 and float16 in generated kernels (C++ and Triton): loads upcast to float32, the
arithmetic between them stays float32, stores and explicit casts round to nearest even, and
reductions accumulate in float32.

The oracle is PyTorch's own for low-precision compiled code (Inductor's tests run the model on
float32 copies of the inputs and cast the result down): a fused kernel rounds once, so it
matches that reference to assert_close's default half tolerances. Eager rounds every
intermediate to the half dtype, so it is checked with a tolerance of a few half ulps instead,
and a reduction's error is shown to be no larger than eager's.
"""

from __future__ import annotations

import copy
import platform
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import wrapgen
from wrapgen.kernels.cpp import build
from wrapgen.kernels.cpp.prelude import PRELUDE
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir.lines import ExternKernel, KernelCall, KernelDefinition

HALF = [torch.bfloat16, torch.float16]
HALF_IDS = ["bf16", "fp16"]
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not compat.available() or (TRITON_DEVICE == "cpu" and not compat.interpreting()),
    reason="needs triton (on CPU: in interpreter mode)",
)


# -- the graphs ---------------------------------------------------------------------------------


def pointwise_chain(x, w, b):
    return torch.sigmoid(x) * w + torch.tanh(x * 0.5) - torch.exp(b * 0.1)


def softmax(x, w, b):
    return torch.softmax(x * 0.125 + b, -1)


def layernorm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def cast_in_the_middle(x, w, b):
    """An RMS norm as LLMs write it: float32 statistics, cast back before the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return h.to(x.dtype) * w + b


def reductions(x, w, b):
    y = x * w + b
    return y.sum(-1), y.mean(-1), y.amax(-1)


class MLPBlock(nn.Module):
    """A transformer block's MLP half: norm, Linear (a library call), GELU, Linear, residual."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, w, b):
        return x + self.down(F.gelu(self.up(self.norm(x)))) * w + b


# graph, and whether it rounds where a float32 reference cannot (an explicit cast to the half
# dtype, a half Linear in the library): then it matches that reference only to ~1 half ulp
CASES = [
    (pointwise_chain, False), (softmax, False), (layernorm_gelu, False), (cast_in_the_middle, True),
    (reductions, False), (MLPBlock, True),
]
CASE_IDS = ["pointwise_chain", "softmax", "layernorm_gelu", "cast_in_the_middle", "reductions", "mlp_block"]


def instantiate(case, dtype: torch.dtype):
    return case().to(dtype).eval() if isinstance(case, type) else case


def make_inputs(dtype: torch.dtype, device: str = "cpu", width: int = 32) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(*shape, dtype=dtype, device=device) for shape in ((4, 8, width), (width,), (width,)))


def float32_reference(fn, inputs: tuple, dtype: torch.dtype):
    """`fn` run on float32 copies of its inputs and parameters, the result cast to `dtype`
    (Inductor's `reference_in_float`)."""
    fn32 = copy.deepcopy(fn).float() if isinstance(fn, nn.Module) else fn
    with torch.no_grad():
        out = fn32(*(t.float() for t in inputs))
    return tuple(o.to(dtype) for o in out) if isinstance(out, tuple) else out.to(dtype)


def check_against_eager_and_reference(fn, compiled, dtype: torch.dtype, device: str, loose: bool) -> None:
    inputs = make_inputs(dtype, device)  # fresh: the compiler never saw them
    with torch.no_grad():
        actual, eager = compiled(*inputs), fn(*inputs)
    eps = torch.finfo(dtype).eps
    reference = float32_reference(fn, inputs, dtype)
    torch.testing.assert_close(actual, reference, **({"atol": 2 * eps, "rtol": 2 * eps} if loose else {}))
    # eager rounds each intermediate (a sum: each of its terms) to the half dtype
    torch.testing.assert_close(actual, eager, atol=8 * eps, rtol=8 * eps)


def kernel_sources(program, language: str) -> list[str]:
    return [line.source for line in program.lines if isinstance(line, KernelDefinition) and line.language == language]


# -- C++ kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["python", "fx", "cpp"])
@pytest.mark.parametrize("case, loose", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_cpp_kernels(dtype: torch.dtype, case, loose: bool, target: str) -> None:
    fn = instantiate(case, dtype)
    compiled = wrapgen.compile(fn, make_inputs(dtype), target=target)
    assert kernel_sources(compiled.program, "cpp")
    check_against_eager_and_reference(fn, compiled, dtype, "cpu", loose)


def test_bf16_program_fuses_what_were_library_calls() -> None:
    """Before half precision had loop lowerings every op of a bf16 program was a library call,
    as it still is with kernels off; now only the Linears (addmm) are."""
    fn, inputs = instantiate(MLPBlock, torch.bfloat16), make_inputs(torch.bfloat16)
    with wrapgen.config.patch(kernels=False):
        library = wrapgen.lower(fn, inputs)
    fused = wrapgen.lower(fn, inputs)
    library_externs = [line.op for line in library.lines if isinstance(line, ExternKernel)]
    fused_externs = [line.op for line in fused.lines if isinstance(line, ExternKernel)]
    assert not any(isinstance(line, KernelCall) for line in library.lines)
    assert "aten::native_layer_norm.out" in library_externs or "aten::native_layer_norm.default" in library_externs
    assert sum(isinstance(line, KernelCall) for line in fused.lines) >= 2
    assert fused_externs == ["aten::addmm.out", "aten::addmm.out"], fused_externs
    assert len(fused_externs) < len(library_externs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_casts_inside_a_fusion_fuse(dtype: torch.dtype) -> None:
    """`x.float()` ... `.to(dtype)`: one kernel, though torch.export checks each cast's input
    with an `_assert_tensor_metadata` call (its metadata is known when compiling)."""
    program = wrapgen.lower(cast_in_the_middle, make_inputs(dtype))
    assert sum(isinstance(line, KernelCall) for line in program.lines) == 1, str(program)
    assert not any(isinstance(line, ExternKernel) for line in program.lines), str(program)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_reductions_accumulate_in_float32_at_least_as_accurately_as_eager(dtype: torch.dtype) -> None:
    """Rows of 1024: eager rounds each term of the sum to the half dtype, the kernel keeps
    them (and its accumulator) in float32 and rounds the result once, so its error against a
    float32 computation is no larger than eager's."""
    x, w, b = make_inputs(dtype, width=1024)
    compiled = wrapgen.compile(reductions, (x, w, b))
    source = "\n".join(kernel_sources(compiled.program, "cpp"))
    assert "double" not in source  # float32 accumulators (float32 data accumulates in double)
    actual, eager = compiled(x, w, b), reductions(x, w, b)
    exact = reductions(x.double(), w.double(), b.double())
    for name, a, e, r in zip(("sum", "mean", "amax"), actual, eager, exact):
        ours, theirs = (a.double() - r).abs().mean().item(), (e.double() - r).abs().mean().item()
        assert ours <= theirs, f"{name}: mean error {ours} against float64, eager's {theirs}"
        if name == "sum":  # eager's rounded terms add up to more than the result's own rounding
            assert ours < 0.8 * theirs, f"sum: mean error {ours} against float64, eager's {theirs}"


def _special_floats() -> torch.Tensor:
    """Ties, overflow, subnormals (of float32 and of the half types), NaN, infinities, and a
    wide random spread of exponents."""
    ties = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-8), 2049.0, 2051.0]
    edges = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.4e38, -3.4e38, 65504.0, 65519.0, 65520.0,
             1e-40, -1e-40, 6e-8, 3e-8, 2.9e-8, 6.1e-5, 1e-45]
    spread = torch.randn(20000) * torch.pow(2.0, torch.randint(-30, 30, (20000,)).float())
    return torch.cat([torch.tensor(ties + edges), spread])


def _all_half_values(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit for bit, except that any NaN matches any NaN (eager's NaN bits depend on its path)."""
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    bits = torch.int16 if actual.element_size() == 2 else torch.int32
    assert torch.equal(actual[~nan].view(bits), expected[~nan].view(bits))


def _kernels_patch(kernels: str):
    return wrapgen.config.patch(cpu_kernels=kernels, kernels=True)


def _conversion_device(kernels: str) -> str:
    return TRITON_DEVICE if kernels == "triton" else "cpu"


CONVERSION_KERNELS = ["cpp", pytest.param("triton", marks=needs_triton)]


@pytest.mark.parametrize("kernels", CONVERSION_KERNELS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_conversions_are_eagers_bit_for_bit(dtype: torch.dtype, kernels: str) -> None:
    """float32 -> half rounds to nearest even (ties, overflow to inf, subnormals, NaN kept);
    half -> float32 is exact for every one of the 65536 values; an explicit cast in the middle
    of a float32 computation rounds there, as in eager."""
    device = _conversion_device(kernels)
    floats, halves = _special_floats().to(device), _all_half_values(dtype).to(device)

    def explicit_round(x):
        return (x * 1.001).to(dtype).float() - x

    with _kernels_patch(kernels):
        down = wrapgen.compile(lambda x: x.to(dtype), (floats,))
        up = wrapgen.compile(lambda h: h.float(), (halves,))
        rounded = wrapgen.compile(explicit_round, (floats,))
    assert all(kernel_sources(c.program, kernels) for c in (down, up, rounded))
    assert_same_bits(down(floats), floats.to(dtype))
    assert_same_bits(up(halves), halves.float())
    assert_same_bits(rounded(floats), explicit_round(floats))


def _gcc_on_x86() -> bool:
    version = subprocess.run([build.CXX, "--version"], capture_output=True, text=True).stdout
    return platform.machine() == "x86_64" and "clang" not in version.lower()


@pytest.mark.skipif(not _gcc_on_x86(), reason="reads g++'s vectorizer report (x86-64)")
@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=["fp32", *HALF_IDS])
def test_half_loops_vectorize_like_float_ones(dtype: torch.dtype, tmp_path) -> None:
    """The conversions are plain integer and float arithmetic, so every simd loop of a half
    softmax (loads, exp, the row cache, the rounding store) vectorizes as it does for float32."""
    compiled = wrapgen.compile(softmax, make_inputs(dtype, width=512))
    text = PRELUDE + "\n" + "\n".join(kernel_sources(compiled.program, "cpp"))
    source = tmp_path / "kernels.cpp"
    source.write_text(text)
    report = subprocess.run([build.CXX, *build.compile_flags(), "-fopt-info-vec-optimized", "-c", str(source),
                             "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True, check=True).stderr
    vectorized = {int(m.group(1)) for m in re.finditer(r"kernels\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    loops = _simd_loops(text.splitlines())
    assert len(loops) >= 3
    # g++ reports a loop at its pragma or at a statement inside it
    scalar = [(first, last) for first, last in loops if not any(first <= n <= last for n in vectorized)]
    assert not scalar, (scalar, text, report)


def _simd_loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line numbers of each `omp simd` loop of a kernel: its pragma to its brace."""
    loops = []
    for i, line in enumerate(lines):
        if line.strip().startswith("#pragma omp") and "simd" in line and "declare" not in line:
            depth, end = 0, i + 1
            for end in range(i + 1, len(lines)):
                depth += lines[end].count("{") - lines[end].count("}")
                if depth == 0:
                    break
            loops.append((i + 1, end + 1))
    return loops


# -- Triton kernels -----------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("target", ["python", "fx"])
@pytest.mark.parametrize("case, loose", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_triton_kernels(dtype: torch.dtype, case, loose: bool, target: str) -> None:
    fn = instantiate(case, dtype)
    if isinstance(fn, nn.Module):
        fn = fn.to(TRITON_DEVICE)
    with _kernels_patch("triton"):
        compiled = wrapgen.compile(fn, make_inputs(dtype, TRITON_DEVICE), target=target)
    sources = kernel_sources(compiled.program, "triton")
    assert sources and all("tl.float32" in s for s in sources)
    check_against_eager_and_reference(fn, compiled, dtype, TRITON_DEVICE, loose)


def _batch_norm(x, weight, bias, running_mean, running_var):
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.5)


def _batch_norm_with_update(x, weight, bias, running_mean, running_var):
    return torch.ops.aten._batch_norm_with_update(x, weight, bias, running_mean, running_var, 0.5, 1e-5)[0]


@pytest.mark.parametrize("fn", [_batch_norm, _batch_norm_with_update], ids=["batch_norm", "batch_norm_with_update"])
@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_training_batch_norm_updates_half_running_stats(dtype: torch.dtype, target: str, fn) -> None:
    """Training-mode batch norm writes its new running stats into the half inputs. torch's meta
    functions type them float32 where the CPU kernels return the input's dtype, so as a library
    call the program read half data as float32; decomposed (lowering/decompositions.py) it
    computes them in float32 and rounds where it copies them back, as eager does."""

    def inputs():
        torch.manual_seed(1)
        return [torch.randn(4, 5, 6, dtype=dtype)] + [torch.randn(5, dtype=dtype) for _ in range(3)] + [
            torch.rand(5, dtype=dtype) + 0.5]

    compiled = wrapgen.compile(fn, inputs(), target=target)
    ours, theirs = inputs(), inputs()
    with torch.no_grad():
        actual, eager = compiled(*ours), fn(*theirs)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(actual, eager, atol=8 * eps, rtol=8 * eps)
    torch.testing.assert_close(ours[3:], theirs[3:], atol=8 * eps, rtol=8 * eps)  # the running stats
