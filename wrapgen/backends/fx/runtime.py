"""Functions that FX graphs of the "fx" target call for what has no ATen op: input checks,
range checks and explicit frees.

Each is registered as side-effectful, so `Graph.eliminate_dead_code()` keeps it: a check
returns nothing yet must run, and a free marks where the memory plan releases a buffer.
They raise the same errors, with the same messages, as the Python target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.fx.node

from wrapgen.backends import huge_pages
from wrapgen.backends import runtime as shared_runtime

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
    device: torch.device,
) -> None:
    """Raise InputMismatchError naming input `name` unless it has this dtype, device, shape and
    strides (a None stride is not checked)."""
    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != dtype
        or value.device != device
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


@_side_effectful
def advise_huge_pages(buffer: torch.Tensor) -> None:
    """Back the fresh CPU `buffer` with transparent huge pages before it is first written
    (wrapgen/backends/huge_pages.py); advice only, the buffer's contents are untouched."""
    huge_pages.advise_huge_pages(buffer)
