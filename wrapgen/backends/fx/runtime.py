"""Functions that FX graphs of the "fx" target call for what has no ATen op: input checks,
range checks, explicit frees, and run-time kernel choices (MultiKernelCall, fx/multi_kernel.py).

Each is registered as side-effectful, so `Graph.eliminate_dead_code()` keeps it: a check
returns nothing yet must run, and a free marks where the memory plan releases a buffer.
They raise the same errors, with the same messages, as the Python target.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.fx.node

from wrapgen.backends import huge_pages
from wrapgen.backends import runtime as shared_runtime
from wrapgen.kernels.choice import KernelChoice, bucket

_F = TypeVar("_F", bound=Callable[..., Any])


def _side_effectful(fn: _F) -> _F:
    """torch.fx.node.has_side_effect where this torch has it, else the set it adds to."""
    register = getattr(torch.fx.node, "has_side_effect", None)
    if register is not None:
        register(fn)
    else:  # pragma: no cover - older torch
        torch.fx.node._side_effectful_functions.add(fn)
    return fn


@_side_effectful
def check_input(
    value: object,
    name: str,
    sizes: tuple,
    strides: tuple,
    dtype: torch.dtype,
    device: torch.device | None,
) -> None:
    """Raise InputMismatchError naming input `name` unless it has this dtype, device, shape and
    strides (a None stride or device is not checked)."""
    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != dtype
        or (device is not None and value.device != device)
        or value.shape != sizes
        or any(want is not None and got != want for got, want in zip(value.stride(), strides))
    ):
        shared_runtime.input_mismatch(name, value, sizes, strides, dtype, device)


@_side_effectful
def check_scalar(value: object, name: str, expected: object) -> None:
    """Raise InputMismatchError unless number input `name` has the value the program was specialized for."""
    if value != expected:
        shared_runtime.scalar_mismatch(name, value, expected)


@_side_effectful
def check_symbol(value: int, symbol: str, low: int | None, high: int | None, min: int | None, max: int | None) -> None:
    """Raise InputMismatchError naming the range [min, max] unless symbol `symbol` passes the
    checked bounds `low` / `high` (None: not checked)."""
    if (low is not None and value < low) or (high is not None and value > high):
        shared_runtime.symbol_out_of_range(symbol, value, min, max)


@_side_effectful
def assert_finite(value: torch.Tensor, name: str) -> None:
    """Raise FloatingPointError if `value` holds NaN or Inf (config.check_finite)."""
    shared_runtime.assert_finite(name, value)


@_side_effectful
def free(*values: object) -> None:
    """The memory plan releases these values here.

    The node is their last user, so the graph's code drops its references right after it
    (GraphModule code sets a value to None after its last use); a consumer that schedules
    the graph itself sees the release point as this node.
    """


def with_strides(value: torch.Tensor, sizes: tuple, strides: tuple) -> torch.Tensor:
    """`value`, or a copy of it laid out with `strides` where a library result's layout is not
    the one its meta function promised (wrapper_ir/layout.py, EnsureStrides)."""
    return shared_runtime.with_strides(value, sizes, strides)


@_side_effectful
def advise_huge_pages(buffer: torch.Tensor) -> None:
    """Back the fresh CPU `buffer` with transparent huge pages before it is first written
    (wrapgen/backends/huge_pages.py); advice only, the buffer's contents are untouched."""
    huge_pages.advise_huge_pages(buffer)


# token -> (the choice, per candidate (kernel_idx, constant_args_idx, parameter names, grid index),
# whether keys are bucketed, the bucket each candidate serves)
MULTI_KERNEL_CHOICES: dict[int, tuple[KernelChoice, tuple[tuple[int, int, tuple[str, ...], int], ...], bool, tuple]] = {}
MULTI_KERNEL_TOKENS = itertools.count()


@_side_effectful
def multi_kernel_call(token: int, key: tuple, args: tuple, grids: tuple, writes: tuple) -> None:
    """Launch the chosen candidate of the choice `token` names (choosing first on a new key)."""
    choice, candidates, bucketed, serves = MULTI_KERNEL_CHOICES[token]

    def launch(index: int) -> None:
        from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

        kernel_idx, constants_idx, names, grid = candidates[index]
        triton_kernel_wrapper_mutation(
            kernel_idx=kernel_idx,
            constant_args_idx=constants_idx,
            grid=[tuple(grids[grid])],
            tma_descriptor_metadata={},
            kwargs=dict(zip(names, args[index])),
        )

    key = tuple(bucket(int(k)) if bucketed else int(k) for k in key)
    chosen = choice.chosen.get(key)
    if chosen is None:
        chosen = choice.choose(key, [lambda i=i: launch(i) for i in range(len(candidates))], writes, serves)
    launch(chosen)
