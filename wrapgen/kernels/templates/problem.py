"""What a GEMM template instance computes, as plain data the lowering fills in.

`out[b, i, j] = alpha * sum_k a[b, i, k] * b[b, k, j] + beta * bias[b, i, j]` over static
sizes and strides (broadcast operands carry stride 0), then an optional epilogue: the
pointwise fusion group that consumed the product, generated inside the template so the
product never goes through memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wrapgen.loop_ir import FusionGroup


@dataclass(frozen=True)
class Operand:
    """One tensor the template reads or writes: its buffer name, element type and the strides
    of its (batch, row, column) dimensions (0 where it is broadcast)."""

    name: str
    dtype: torch.dtype
    strides: tuple[int, int, int]


@dataclass(frozen=True)
class Epilogue:
    """The pointwise group that reads the product (buffer `result`) at the very element the
    template computes, and the members whose results something else needs (stored)."""

    group: FusionGroup
    needed: frozenset[str]
    dtypes: dict = field(hash=False, compare=False)

    def row_dims(self) -> tuple[int, ...]:
        """The group's leading dimensions, whose flattening is the product's row (one for a
        plain mm; [b, t] for a linear layer on [b, t, k] input)."""
        return tuple(int(s) for s in self.group.rows[:-1])

    def row_splits(self) -> list[tuple[int, int]]:
        """(divisor, extent) of each leading dimension: its index is `row // divisor % extent`
        of the product's flat row (the first needs no `% extent`, a divisor of 1 no division)."""
        dims = self.row_dims()
        splits = []
        for d, extent in enumerate(dims):
            divisor = 1
            for inner in dims[d + 1:]:
                divisor *= inner
            splits.append((divisor, extent))
        return splits


@dataclass(frozen=True)
class GemmProblem:
    op: str  # "mm" | "addmm" | "bmm"
    batch: int
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    out: Operand  # the product's buffer (written only when there is no epilogue)
    bias: Operand | None = None
    alpha: float = 1.0
    beta: float = 1.0
    device: str = "cpu"
    epilogue: Epilogue | None = None
    # every buffer the instance touches -> (sizes, strides, dtype), static: benchmarking
    # allocates stand-ins of exactly these layouts
    layouts: dict = field(default_factory=dict, hash=False, compare=False)
    # read-only operands that are views of the program's weights, as real tensors: measured in
    # place (no stand-in copy of a large weight at compile time)
    weights: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def rows(self) -> tuple[int, ...]:
        """The product's shape, as the fusion group iterates it."""
        return (self.batch, self.m, self.n) if self.op == "bmm" else (self.m, self.n)

    def describe(self) -> str:
        batch = f"{self.batch}x" if self.op == "bmm" else ""
        return f"{self.op} {batch}{self.m}x{self.k} @ {self.k}x{self.n} {str(self.a.dtype).removeprefix('torch.')}"

    def key(self) -> str:
        """What the measured winner depends on (the device and compiler versions are added by the tuner)."""
        ops = (self.a, self.b, self.out) + ((self.bias,) if self.bias else ())
        layout = ";".join(f"{str(o.dtype).removeprefix('torch.')}{o.strides}" for o in ops)
        return f"{self.op}|{self.batch},{self.m},{self.n},{self.k}|{layout}|{self.alpha},{self.beta}|{self.device}"


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for s in reversed(shape):
        strides.append(running)
        running *= s
    return tuple(reversed(strides))
