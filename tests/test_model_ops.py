"""The ops real models use, as generated kernels (issue 18, item 2).

Each of the five benchmark models (small configs: GPT-2, a Llama-style GQA decoder, BERT,
ResNet-50, ViT) lowers in bf16 with no pointwise, normalization, cast, copy, concat, view or
constant op left as a library call: only the ops in `ALLOWED_LIBRARY_CALLS`, each with its
reason, stay. The compiled models match eager on the python and cpp targets in bf16 and
fp32. Then each new lowering on its own, on every target: inference batch norm, cat, cumsum,
index.Tensor, max pooling, and library results taken at their meta strides (`EnsureStrides`),
including a library result laid out otherwise than its meta function says.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir import EnsureStrides, ExternKernel, KernelCall, KernelDefinition, TensorRef, verify
from wrapgen.wrapper_ir.program import Program

transformers = pytest.importorskip("transformers")
from benchmarks import models  # noqa: E402  (needs transformers)

MODELS = ["gpt2", "llama", "bert", "resnet50", "vit_b16"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# What may stay a library call in a model, and why (by op name, `aten::addmm.out` -> addmm).
ALLOWED_LIBRARY_CALLS = {
    "mm": "matrix product: a BLAS / cuBLAS GEMM (generated GEMM templates are max_autotune's, item 3)",
    "addmm": "matrix product with bias: a BLAS / cuBLAS GEMM with the bias in its epilogue",
    "bmm": "batched matrix product: a BLAS / cuBLAS GEMM",
    "convolution": "oneDNN / cuDNN convolution: algorithms (Winograd, implicit GEMM) no loop body matches",
    "scaled_dot_product_attention": "fused attention (flash / memory-efficient): one kernel, no S x S matrix in memory",
    "_scaled_dot_product_flash_attention_for_cpu": "the CPU's fused attention kernel",
    "_scaled_dot_product_flash_attention": "CUDA flash attention",
    "_scaled_dot_product_efficient_attention": "CUDA memory-efficient attention",
    "_scaled_dot_product_cudnn_attention": "cuDNN attention",
}

needs_triton = pytest.mark.skipif(
    not compat.available() or not compat.interpreting(), reason="needs triton in interpreter mode (CPU machines)"
)


def op_name(qualified: str) -> str:
    return qualified.split("::", 1)[1].split(".")[0]


def library_ops(program: Program) -> set[str]:
    return {op_name(line.op) for line in program.lines if isinstance(line, ExternKernel)}


@functools.cache
def lowered(name: str, dtype_name: str) -> tuple:
    """One model (random weights, eval mode), its inputs and its lowered program, per dtype."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    model, inputs = models.FAMILIES[name].build("cpu", "small", DTYPES[dtype_name])
    with torch.no_grad():
        return model, inputs, wrapgen.lower(model, inputs)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", MODELS)
def test_models_leave_only_allowlisted_library_calls(name: str, dtype_name: str) -> None:
    _, _, program = lowered(name, dtype_name)
    unexpected = library_ops(program) - ALLOWED_LIBRARY_CALLS.keys()
    assert not unexpected, f"{name} ({dtype_name}) keeps library calls {sorted(unexpected)}:\n{program}"


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean((a.double() - b.double()) ** 2)).item()


@functools.cache
def float64_reference(name: str) -> torch.Tensor:
    model, inputs, _ = lowered(name, "fp32")
    with torch.no_grad():
        return copy.deepcopy(model).double()(*(i.double() if i.is_floating_point() else i for i in inputs))


@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", MODELS)
def test_models_match_eager(name: str, dtype_name: str, target: str) -> None:
    """fp32: assert_close's float32 tolerances against eager. bf16: PyTorch's own accuracy
    rule for low-precision models (torch._dynamo.utils.same, as its benchmarks use it): the
    compiled result's RMS error against a float64 run is at most 3x eager's plus tol / 10,
    tol = 1e-2."""
    model, inputs, program = lowered(name, dtype_name)
    artifact = wrapgen.api.build(program, target)
    with torch.no_grad():
        got = artifact.call(list(inputs))[0]
        expected = model(*inputs)
    if dtype_name == "fp32":
        torch.testing.assert_close(got, expected)
        return
    assert got.dtype == expected.dtype == torch.bfloat16 and got.shape == expected.shape
    reference = float64_reference(name)
    eager_error, error = rmse(expected, reference), rmse(got, reference)
    assert error <= 3.0 * eager_error + 1e-3, (error, eager_error)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("name", MODELS)
def test_models_on_cuda_in_bf16(name: str, target: str) -> None:
    """The same on the GPU (Triton kernels): attention picks its backend at run time there, so
    its result's layout is checked against the meta function's by the ensure_strides line."""
    model, inputs = models.FAMILIES[name].build("cuda", "small", torch.bfloat16)
    with torch.no_grad():
        program = wrapgen.lower(model, inputs)
        unexpected = library_ops(program) - ALLOWED_LIBRARY_CALLS.keys()
        assert not unexpected, f"{name} keeps library calls {sorted(unexpected)}:\n{program}"
        got = wrapgen.api.build(program, target).call(list(inputs))[0]
        expected = model(*inputs)
        reference = copy.deepcopy(model).double()(*(i.double() if i.is_floating_point() else i for i in inputs))
    assert rmse(got, reference) <= 3.0 * rmse(expected, reference) + 1e-3


# -- the lowerings one by one -------------------------------------------------------------------

TARGETS = ["python", "cpp", "fx", "triton"]


def compile_for(fn, inputs: tuple, target: str, dynamic: bool = False):
    if target == "triton":
        if not (compat.available() and compat.interpreting()):
            pytest.skip("needs triton in interpreter mode (CPU machines)")
        with wrapgen.config.patch(cpu_kernels="triton"):
            program = wrapgen.lower(fn, inputs, dynamic=dynamic)
            assert all(k.language == "triton" for k in program.lines if isinstance(k, KernelDefinition))
            return program, wrapgen.compile(fn, inputs, target="python", dynamic=dynamic)
    return wrapgen.lower(fn, inputs, dynamic=dynamic), wrapgen.compile(fn, inputs, target=target, dynamic=dynamic)


def check(fn, inputs: tuple, target: str, dtype: torch.dtype, dynamic: bool = False, library: set[str] = frozenset()):
    """Compile `fn`, require that it calls no library op but `library`, and compare with eager
    on fresh inputs of the same kind (half dtypes: within a few ulps of their rounding)."""
    with torch.no_grad():
        program, compiled = compile_for(fn, inputs, target, dynamic)
        assert library_ops(program) <= library, str(program)
        fresh = tuple(torch.randn_like(x) if x.is_floating_point() else x for x in inputs)
        got, expected = compiled(*fresh), fn(*fresh)
    half = dtype in (torch.bfloat16, torch.float16)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if half else {}
    torch.testing.assert_close(got, expected, **tolerance)
    return program


# every target in float32 and bfloat16; float16 (the same code paths as bfloat16 but for the
# conversions) on the python target
TARGET_DTYPES = [pytest.param(t, d, id=f"{t}-{n}") for t in TARGETS for n, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))]
TARGET_DTYPES.append(pytest.param("python", torch.float16, id="python-fp16"))


def conv_bn_relu_residual(dtype: torch.dtype) -> torch.nn.Module:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.bn = torch.nn.BatchNorm2d(4)
            self.bn_plain = torch.nn.BatchNorm2d(4, affine=False)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)) + self.bn_plain(x))

    block = Block()
    for bn in (block.bn, block.bn_plain):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    return block.eval().to(dtype)


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_inference_batch_norm_is_a_fused_affine(target: str, dtype: torch.dtype) -> None:
    block = conv_bn_relu_residual(dtype)
    with wrapgen.config.patch(layout_optimization=False):  # NCHW throughout: no layout copies to count
        program = check(block, (torch.randn(2, 4, 6, 6, dtype=dtype),), target, dtype, library={"convolution"})
    assert len([k for k in program.lines if isinstance(k, KernelDefinition)]) == 1  # bn, bn, add, relu: one kernel


@pytest.mark.parametrize("target", ["python", "fx", "triton"])
def test_batch_norm_with_dynamic_sizes(target: str) -> None:
    block = conv_bn_relu_residual(torch.float32)
    check(block, (torch.randn(3, 4, 6, 6),), target, torch.float32, dynamic=True, library={"convolution"})


def test_batch_norm_saved_statistics_are_empty_as_in_eager() -> None:
    def fn(x, mean, var):
        return torch.ops.aten._native_batch_norm_legit_no_training(x, None, None, mean, var, 0.1, 1e-5)

    inputs = (torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5)
    program, compiled = compile_for(fn, inputs, "python")
    assert library_ops(program) == set()
    for got, expected in zip(compiled(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, expected)


def rotate_half(x, cos, sin):
    """Llama's rotary embedding: cat of a negated half and the other half."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def class_token(x, token):
    """ViT's class token: cat along the sequence, then a pointwise consumer."""
    return torch.cat([token.expand(x.shape[0], -1, -1), x], dim=1) * 2.0


def mixed_cat(a, b):
    """Type promotion (int with float) and a legacy empty 1-d input."""
    return torch.cat([a, (b * 3).to(torch.int64).to(a.dtype), torch.empty(0, dtype=a.dtype)], dim=0) + 1


def cats(x, cos, sin, patches, token, a, b):
    return rotate_half(x, cos, sin), class_token(patches, token), mixed_cat(a, b)


def cat_inputs(dtype: torch.dtype, batch: int = 2) -> tuple:
    shapes = [(batch, 3, 5, 8), (5, 8), (5, 8), (batch, 4, 8), (1, 1, 8), (3, 4), (2, 4)]
    return tuple(torch.randn(shape, dtype=dtype) for shape in shapes)


def test_rotate_half_is_one_kernel() -> None:
    x, cos, sin = cat_inputs(torch.bfloat16)[:3]
    program = wrapgen.lower(rotate_half, (x, cos, sin))
    assert library_ops(program) == set()
    assert len([k for k in program.lines if isinstance(k, KernelDefinition)]) == 1


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_cat_is_indexing_fused_with_its_neighbours(target: str, dtype: torch.dtype) -> None:
    check(cats, cat_inputs(dtype), target, dtype)


@pytest.mark.parametrize("target", ["python", "fx", "triton"])
def test_cat_with_dynamic_sizes(target: str) -> None:
    check(cats, cat_inputs(torch.float32, batch=3), target, torch.float32, dynamic=True)


def cumsums(x):
    """Position ids as models build them (cumsum of a mask, in int64) and a float scan."""
    return torch.cumsum(x > 0, dim=-1) * (x > 0), torch.cumsum(x * 2, dim=0)


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_cumsum_is_a_kernel(target: str, dtype: torch.dtype) -> None:
    check(cumsums, (torch.randn(5, 33, dtype=dtype),), target, dtype)


def test_long_or_dynamic_cumsum_stays_a_library_call() -> None:
    """A masked sum costs n*n per row: past CUMSUM_KERNEL_LIMIT, or with a scanned length
    known only at run time, the library's scan is used."""
    from wrapgen.lowering.loop_ops.indexing import CUMSUM_KERNEL_LIMIT

    long = torch.randn(2, CUMSUM_KERNEL_LIMIT + 1)
    check(lambda x: torch.cumsum(x, -1) + 1, (long,), "python", torch.float32, library={"cumsum"})
    check(lambda x: torch.cumsum(x, -1) + 1, (torch.randn(3, 9),), "python", torch.float32, dynamic=True, library={"cumsum"})


def copies(x, y):
    """Copies as functionalization leaves them: copy (from copy_), slice_scatter and
    select_scatter (from slice / index assignment), clone, and casts."""
    z = torch.zeros(3, 4, dtype=torch.bfloat16)
    z.copy_(y)  # broadcast and cast
    w = x.clone()
    w[1] = y
    w[:, -2:] = 5.0
    w[..., 0:1] = y[:1].to(torch.float64)
    return z + 1, w * 2


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_copies_are_kernels(target: str, dtype: torch.dtype) -> None:
    check(copies, (torch.randn(3, 4, dtype=dtype), torch.randn(4, dtype=dtype)), target, dtype)


def strided_copies(x, y):
    """Assignments to strided slices (functionalized to slice_scatter with a step): every other
    column from 1, every third row of a length three does not divide, and a negative start."""
    w = x.clone()
    w[:, 1::2] = y[:, :3]
    w[::3] = 7.0
    w[-5::2, 0] = y[:3, 0]
    return w * 2


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_strided_slice_copies_are_kernels(target: str, dtype: torch.dtype) -> None:
    check(strided_copies, (torch.randn(7, 6, dtype=dtype), torch.randn(7, 4, dtype=dtype)), target, dtype)


def gathers(x, rows, cols):
    """x[rows, cols] with broadcasting index tensors, negative indices, and x[:, rows]."""
    return x[rows[:, None], cols[None, :]] * 2, x[:, rows] + 1


def attention_mask(position_ids):
    """The mask construction transformers traces to index.Tensor (GPT-2, Llama)."""
    batch, length = position_ids.shape
    b = torch.arange(batch)[:, None, None, None]
    q = torch.arange(length)[None, None, :, None]
    k = torch.arange(length)[None, None, None, :]
    return position_ids[b, q] >= position_ids[b, k]


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_index_tensor_is_a_gather(target: str, dtype: torch.dtype) -> None:
    def both(x, rows, cols, position_ids):
        return (*gathers(x, rows, cols), attention_mask(position_ids))

    rows, cols = torch.tensor([0, -1, 2]), torch.tensor([4, -5, 1, 0])
    check(both, (torch.randn(4, 5, 3, dtype=dtype), rows, cols, torch.arange(12).reshape(2, 6) % 4), target, dtype)


@pytest.mark.parametrize("target", ["python", "cpp", "fx"])
def test_index_out_of_range_raises(target: str) -> None:
    x, rows, cols = torch.randn(4, 5, 3), torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    with torch.no_grad():
        _, compiled = compile_for(gathers, (x, rows, cols), target)
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([0, 4, 2]), cols)


@pytest.mark.parametrize("target", ["python", "fx", "triton"])
def test_index_tensor_with_dynamic_sizes(target: str) -> None:
    check(gathers, (torch.randn(6, 5, 3), torch.tensor([0, -1, 2]), torch.tensor([4, 1])), target, torch.float32,
          dynamic=True)


def stem(x):
    """ResNet's stem after the convolution: ReLU, then a 3x3 stride-2 max pool with padding."""
    return F.max_pool2d(torch.relu(x), kernel_size=3, stride=2, padding=1)


def odd_pool(x):
    return F.max_pool2d(x, kernel_size=(2, 3), stride=(2, 1), padding=(1, 1), dilation=(1, 2), ceil_mode=True) - 1


@pytest.mark.parametrize("target, dtype", TARGET_DTYPES)
def test_max_pool_is_a_window_reduction(target: str, dtype: torch.dtype) -> None:
    def pools(x, y):
        return stem(x), odd_pool(y)

    check(pools, (torch.randn(2, 3, 9, 9, dtype=dtype), torch.randn(2, 7, 8, dtype=dtype)), target, dtype)


def test_max_pool_with_read_indices_stays_a_library_call() -> None:
    def fn(x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return values + 1, indices

    check(fn, (torch.randn(1, 2, 4, 4),), "python", torch.float32, library={"max_pool2d_with_indices"})


def test_max_pool_propagates_nan_as_eager() -> None:
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 1] = math.nan
    with torch.no_grad():
        torch.testing.assert_close(wrapgen.compile(stem, (x,))(x), stem(x), equal_nan=True)


# -- library results at their meta strides ------------------------------------------------------


@torch.library.custom_op("wrapgen_model_ops::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    """Returns a contiguous result while its fake says column-major: a library op whose real
    layout differs from its meta function's, as an attention backend's may."""
    return x * 2


@doubled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype, device=x.device)


def transposed_view_of_library_result(x):
    return doubled(x).t().reshape(-1) + 1


@pytest.mark.parametrize("target", ["python", "cpp", "fx", "interpret"])
def test_library_result_in_another_layout_than_its_meta_is_copied(target: str) -> None:
    x = torch.randn(3, 5)
    with torch.no_grad():
        program = wrapgen.lower(transposed_view_of_library_result, (x,))
        assert any(isinstance(line, EnsureStrides) for line in program.lines)
        assert library_ops(program) == {"doubled"}  # .t() and .reshape() are reinterpretations
        compiled = wrapgen.compile(transposed_view_of_library_result, (x,), target=target)
        torch.testing.assert_close(compiled(x), transposed_view_of_library_result(x))


def test_attention_output_views_are_reinterpretations() -> None:
    def attention(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) * 2

    q, k, v = (torch.randn(2, 4, 8, 16).transpose(1, 2).contiguous().transpose(1, 2) for _ in range(3))
    program = check(attention, (q, k, v), "python", torch.float32, library={"scaled_dot_product_attention"})
    ensured = [line for line in program.lines if isinstance(line, EnsureStrides)]
    assert len(ensured) == 1 and "ensure_strides" in str(program)
    # the transpose and reshape are index arithmetic in the kernel that reads the result
    assert any(isinstance(line, KernelCall) and TensorRef(ensured[0].name) in line.args for line in program.lines)


def test_with_strides_copies_only_when_the_layout_differs() -> None:
    from wrapgen.backends.runtime import with_strides

    x = torch.randn(4, 3)
    assert with_strides(x, (4, 3), (3, 1)) is x
    row = x[:1]
    assert with_strides(row, (1, 3), (99, 1)) is row  # a size-1 dim's stride is not compared
    column_major = with_strides(x, (4, 3), (1, 4))
    assert column_major.stride() == (1, 4)
    torch.testing.assert_close(column_major, x)


def test_verifier_checks_ensure_strides() -> None:
    x = torch.randn(3, 5)
    with torch.no_grad():
        program = wrapgen.lower(transposed_view_of_library_result, (x,))
    index = next(i for i, line in enumerate(program.lines) if isinstance(line, EnsureStrides))
    line = program.lines[index]
    wrong = EnsureStrides(line.name, torch.float64, line.device, line.sizes, line.strides)
    lines = program.lines[:index] + (wrong,) + program.lines[index + 1:]
    bad = Program(program.name, program.inputs, program.symbols, program.constants, lines)
    with pytest.raises(ValueError, match=f"line {index + 1} .*ensure_strides"):
        verify(bad)
