"""Helpers that generated Python modules import: op lookup, input-check errors, benchmarking.

Only the slow paths live here (raising errors, making example data); the per-call fast
path stays inline in the generated code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

# Re-exported for generated modules (the explicit `as` marks the re-export).
from wrapgen.backends.huge_pages import advise_huge_pages as advise_huge_pages


class InputMismatchError(ValueError):
    """A compiled program was called with an input it was not compiled for."""


def resolve_op(qualified: str) -> torch._ops.OpOverload:
    """`"aten::addmm.out"` -> `torch.ops.aten.addmm.out`."""
    namespace, rest = qualified.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    return getattr(packet, overload or "default")


# Overloads whose torch.* Python binding takes exactly the overload's arguments (positions and
# keyword names alike): the binding calls the op unboxed, about 1.7 us less per call than the
# dispatcher's boxed entry, which adds up for programs of many small matrix products.
_PYTHON_BINDINGS: dict[str, Callable] = {
    "aten::mm.default": torch.mm,
    "aten::mm.out": torch.mm,
    "aten::bmm.default": torch.bmm,
    "aten::bmm.out": torch.bmm,
    "aten::addmm.default": torch.addmm,
    "aten::addmm.out": torch.addmm,
}


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


def check_arg_count(args: Sequence, expected: int) -> None:
    if len(args) != expected:
        raise InputMismatchError(f"expected {expected} inputs, got {len(args)}")


def input_mismatch(
    name: str,
    value: object,
    sizes: tuple,
    strides: tuple,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Raise an error naming the input and the first property that differs."""
    if not isinstance(value, torch.Tensor):
        raise InputMismatchError(f"input {name}: expected a tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise InputMismatchError(f"input {name}: expected dtype {dtype}, got {value.dtype}")
    if value.device != device:
        raise InputMismatchError(f"input {name}: expected device {device}, got {value.device}")
    if tuple(value.shape) != tuple(sizes):
        raise InputMismatchError(f"input {name}: expected shape {tuple(sizes)}, got {tuple(value.shape)}")
    actual = value.stride()
    for dim, want in enumerate(strides):
        if want is not None and actual[dim] != want:
            shown = tuple("*" if s is None else s for s in strides)
            raise InputMismatchError(f"input {name}: expected strides {shown}, got {actual}")
    raise InputMismatchError(f"input {name}: does not match the compiled program")


def scalar_mismatch(name: str, value: object, expected: object) -> None:
    raise InputMismatchError(f"input {name}: the program was compiled for the value {expected!r}, got {value!r}")


def symbol_out_of_range(symbol: str, value: int, low: int, high: int | None) -> None:
    upper = "inf" if high is None else high
    raise InputMismatchError(
        f"size symbol {symbol} = {value} is outside [{low}, {upper}], the range the program was compiled for"
    )


def assert_finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        raise FloatingPointError(f"output {name} contains NaN or Inf")


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
