"""Helpers that generated Python modules import: fast op calls and allocation, benchmarking.

Only the slow paths live here (raising errors, making example data); the per-call fast
path stays inline in the generated code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

# Re-exported for generated modules (the explicit `as` marks the re-export).
from wrapgen.backends.huge_pages import advise_huge_pages as advise_huge_pages
from wrapgen.backends.runtime import assert_finite as assert_finite
from wrapgen.backends.runtime import check_arg_count as check_arg_count
from wrapgen.backends.runtime import input_mismatch as input_mismatch
from wrapgen.backends.runtime import resolve_op
from wrapgen.backends.runtime import scalar_mismatch as scalar_mismatch
from wrapgen.backends.runtime import symbol_out_of_range as symbol_out_of_range

# Overloads whose torch.* Python binding takes exactly the overload's arguments (positions and
# keyword names alike; out overloads with one `out` argument only): the binding calls the op
# unboxed, which costs less than the dispatcher's boxed entry: about 1.7 us per matrix product
# and 13 us per convolution (whose int lists the boxed entry converts one by one), which adds up
# over ResNet-50's 53 convolutions or a decoder's many small products.
_BOUND_OPS: dict[str, tuple[str, ...]] = {
    "mm": ("default", "out"),
    "bmm": ("default", "out"),
    "addmm": ("default", "out"),
    "baddbmm": ("default", "out"),
    "convolution": ("default",),  # its binding takes no out=
    "cat": ("default", "out"),
    "embedding": ("default",),
    "native_layer_norm": ("default",),
    "_native_batch_norm_legit_no_training": ("default",),
    "_softmax": ("default", "out"),
    "_log_softmax": ("default", "out"),
    "max_pool2d_with_indices": ("default",),
    "scaled_dot_product_attention": ("default",),
    "_scaled_dot_product_flash_attention": ("default",),
    "_scaled_dot_product_efficient_attention": ("default",),
    "_scaled_dot_product_cudnn_attention": ("default",),
    "_scaled_dot_product_flash_attention_for_cpu": ("default",),
}


def _python_bindings() -> dict[str, Callable]:
    """The bindings of `_BOUND_OPS` this torch has (in torch._C._VariableFunctions, or torch._C._nn
    for ops of the `nn` module), by qualified overload name."""
    bindings: dict[str, Callable] = {}
    for name, overloads in _BOUND_OPS.items():
        binding = getattr(torch._C._VariableFunctions, name, None) or getattr(torch._C._nn, name, None)
        if binding is not None:
            bindings.update({f"aten::{name}.{overload}": binding for overload in overloads})
    return bindings


_PYTHON_BINDINGS: dict[str, Callable] = _python_bindings()


def op_callable(qualified: str) -> Callable:
    """The fastest way to call an operator from generated code: its torch.* binding where that is
    the same call, else the dispatcher entry without OpOverload's Python-level `__call__` frame."""
    if qualified in _PYTHON_BINDINGS:
        return _PYTHON_BINDINGS[qualified]
    op = resolve_op(qualified)
    return getattr(op, "_op", op)


def _python_empty_strided_cpu(sizes: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(sizes, strides, dtype=dtype, device="cpu")


# torch's allocation fast path (what torch.compile's own wrappers use), where this torch has it.
empty_strided_cpu = getattr(torch._C._dynamo.guards, "_empty_strided_cpu", _python_empty_strided_cpu)


def _python_empty_strided_cuda(sizes: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(sizes, strides, dtype=dtype, device="cuda")


# On the current CUDA device (generated code makes the program's device current first).
empty_strided_cuda = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", _python_empty_strided_cuda)
current_cuda_device = getattr(torch._C, "_cuda_getDevice", lambda: 0)


def _python_reinterpret(t: torch.Tensor, sizes: tuple, strides: tuple, offset: int) -> torch.Tensor:
    return torch.as_strided(t, sizes, strides, t.storage_offset() + offset)


# A view at an offset relative to the source's (torch.compile's own wrappers use the C fast
# path: about half as_strided's host time, and no autograd record, which `call` never needs).
reinterpret_tensor = getattr(torch._C._dynamo.guards, "_reinterpret_tensor", _python_reinterpret)


def example_tensor(sizes: tuple, strides: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Random data with the given layout (for benchmark_compiled_module)."""
    out = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        return out.normal_()
    if dtype == torch.bool:
        return out.copy_(torch.randint(0, 2, out.shape, device=device).bool())
    return out.copy_(torch.randint(0, 8, out.shape, device=device))


def benchmark(call: Callable[[list], object], args: list, synchronize: Callable[[], None], times: int = 20, repeat: int = 5) -> float:
    """Median seconds per call over `repeat` rounds of `times` calls, after a warm-up."""
    call(list(args))
    synchronize()
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(times):
            call(list(args))
        synchronize()
        rounds.append((time.perf_counter() - start) / times)
    rounds.sort()
    return rounds[len(rounds) // 2]


INF = math.inf
NAN = math.nan


BATCHED_INPUT_CHECKS = 8  # inputs from which a program checks them all in one C++ call


def input_guard(tensors: tuple, sizes: tuple, strides: tuple) -> object:
    """One check of many inputs in C++ (dynamo's `TensorGuards`): dtype, device, sizes and
    strides equal to those of `tensors`, which the program's own checks have just accepted.
    A compiled optimizer step takes 740 tensors: checked one by one in Python (about 1.5 us
    each) they were a third of its host time; this takes 0.1 us each. It also compares
    requires_grad and dispatch keys, so it may refuse inputs the program accepts: those go
    through the one-by-one checks again, and a guard is made from them."""
    from torch._C._dynamo.guards import TensorGuards

    return TensorGuards(*tensors, dynamic_dims_sizes=[list(s) for s in sizes],
                        dynamic_dims_strides=[list(s) for s in strides])
