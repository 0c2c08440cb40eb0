"""The end-to-end models of test_end_to_end.py again, with every generated kernel in Triton:
on the GPU's CPU-side twin, Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py on
machines without CUDA), so CI checks Triton codegen on whole models, static and dynamic.
The tests that exercise bad input and options only (no kernels) are not repeated."""

from __future__ import annotations

import pytest

import wrapgen
from tests.test_end_to_end import (  # noqa: F401  (pytest collects the imported tests)
    DYNAMIC_REDUCTIONS,
    check_dynamic_reductions,
    test_conv_bn_pool_net,
    test_dynamic_input_size_is_a_product_of_symbols,
    test_dynamic_input_size_is_an_expression,
    test_dynamic_torch_compile,
    test_dynamic_wrapgen_compile,
    test_inplace,
    test_inplace_buffer_update,
    test_int_bool_and_zero_dim,
    test_mlp,
    test_noncontiguous_input,
    test_noncontiguous_matmul_operands,
    test_topk_sort,
    test_training_step,
    test_transformer_block,
    test_view_outputs,
)
from wrapgen.kernels.triton import compat

pytestmark = pytest.mark.skipif(
    not (compat.available() and compat.interpreting()), reason="needs triton in interpreter mode (CPU machines)"
)


@pytest.fixture(autouse=True)
def triton_kernels():
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        yield


# The cpp target launches Triton kernels only on CUDA (their cubins); on CPU tensors they run
# in the interpreter, which only the Python-hosted targets can call.
@pytest.mark.parametrize("target", ["python", "fx"])
@pytest.mark.parametrize("case", list(DYNAMIC_REDUCTIONS))
def test_dynamic_reductions_over_batch_and_middle(case, target):
    check_dynamic_reductions(case, target)


@pytest.mark.parametrize("target", ["python", "fx"])
def test_min_max_against_a_constant_keep_nans(target):
    """logsigmoid is min(0, x) - log1p(exp(-|x|)): a minimum of a 0-d constant and a block,
    which Triton's interpreter could not `|` (the NaN test of the old helper); NaNs propagate."""
    import torch

    def fn(x):
        return torch.nn.functional.logsigmoid(x) * 2 + torch.clamp_max(x, 0.5) - torch.maximum(x, torch.zeros(()))

    x = torch.randn(64, 33)
    x[3, 4] = float("nan")
    compiled = wrapgen.compile(fn, (x,), target=target)
    fresh = torch.randn(64, 33)
    fresh[5, 6] = float("nan")
    torch.testing.assert_close(compiled(fresh), fn(fresh), equal_nan=True)
