"""A library call's result at the strides the program was lowered for.

A library op chooses its result's layout itself. torch's meta function says which layout
that is, and the program is lowered for it: views of the result become `Reinterpret` lines
and kernels index it with constant strides. Where the real kernel may choose otherwise (an
attention op picks its backend at run time, and backends lay out their outputs differently),
`EnsureStrides` keeps the program correct: it leaves the tensor as it is when its strides
are the expected ones (the common case: a few integer compares), and otherwise replaces it
by a copy in the expected layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from wrapgen.wrapper_ir.lines import WrapperLine
from wrapgen.wrapper_ir.values import Shape, dtype_name, format_shape, shape_symbols


@dataclass(frozen=True)
class EnsureStrides(WrapperLine):
    """After this line `name` has `strides` in every dimension of size other than 1: the same
    tensor when it has them already, else a copy of it (a `dtype` tensor on `device`) laid
    out with them. The name is not redefined: its lifetime and its uses stay as they were."""

    name: str
    dtype: torch.dtype
    device: torch.device
    sizes: Shape
    strides: Shape

    def uses(self) -> tuple[str, ...]:
        return (self.name,)

    def symbols_used(self) -> set[sympy.Symbol]:
        return shape_symbols(self.sizes) | shape_symbols(self.strides)

    def checked_dims(self) -> tuple[int, ...]:
        """The dimensions whose stride is compared (a stride of a size-1 dim means nothing)."""
        return tuple(d for d, s in enumerate(self.sizes) if sympy.sympify(s) != 1)

    def check(self) -> None:
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.strides)} strides")

    def format(self) -> str:
        return (
            f"ensure_strides {self.name}: {dtype_name(self.dtype)}[{format_shape(self.sizes)}]"
            f" strides [{format_shape(self.strides)}] {self.device}"
        )
