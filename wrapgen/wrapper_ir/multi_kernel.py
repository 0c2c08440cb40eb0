"""A run-time choice between kernels that compute the same thing, as a Wrapper IR line.

Two things need it: a user's `@triton.autotune` kernel (one candidate per config) and
multi-kernel reductions (a persistent and a looped variant of one reduction, whose better
choice depends on a size symbol). Either way the program holds every candidate as data, and
a target times each candidate once per value of `key`, caches the fastest, and launches it
from then on. Because the choice is a line, each target implements choosing itself (the
Python and FX targets through `kernels/triton/choice.py`, the C++ target in C++), and the
verifier and passes see every kernel a choice may launch and every buffer it may write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy

from wrapgen.wrapper_ir.lines import KernelCall, WrapperLine
from wrapgen.wrapper_ir.values import Arg, arg_symbols, format_arg


@dataclass(frozen=True)
class MultiKernelCall(WrapperLine):
    """Launch the fastest of `candidates` (KernelCalls of kernels defined earlier, same
    arguments' meaning, same results). The choice is made per value of `key` (size
    expressions and constants) and shared by every line with the same `choice` name: the
    first call with a new key times each candidate (restoring the buffers they write between
    candidates), later calls launch the cached winner."""

    choice: str
    candidates: tuple[KernelCall, ...]
    key: tuple[Arg, ...] = ()
    purpose: Literal["autotune", "multi_kernel"] = "autotune"
    # Key values round up to powers of two (size buckets), and candidate i runs only where the
    # first key value's bucket is serves[i] (None: any bucket; empty tuple: every candidate
    # everywhere). A persistent reduction with RBLOCK = R serves the bucket R.
    bucketed: bool = False
    serves: tuple[int | None, ...] = ()

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w for c in self.candidates for w in c.writes))

    def called_kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.kernel for c in self.candidates))

    def uses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for c in self.candidates for name in c.uses()))

    def symbols_used(self) -> set[sympy.Symbol]:
        used = arg_symbols(self.key)
        for candidate in self.candidates:
            used |= candidate.symbols_used()
        return used

    def grids(self) -> tuple[tuple[sympy.Expr, ...], ...]:
        """The distinct launch grids, in first-use order: candidates that share a grid (configs
        whose grid function gives the same result) share one computation of it."""
        return tuple(dict.fromkeys(tuple(c.grid) for c in self.candidates))

    def check(self) -> None:
        if not self.candidates:
            raise ValueError(f"choice {self.choice} has no candidates")
        if not self.choice.isidentifier():
            raise ValueError(f"choice name {self.choice!r} is not an identifier")
        if self.serves and len(self.serves) != len(self.candidates):
            raise ValueError(f"{len(self.serves)} buckets for {len(self.candidates)} candidates")
        if self.serves and not self.key:
            raise ValueError("candidates that serve buckets need a key to bucket")
        if self.serves and all(s is not None for s in self.serves):
            raise ValueError("no candidate serves every bucket")
        for candidate in self.candidates:
            candidate.check()
            if candidate.may_alias:
                raise ValueError(f"candidate {candidate.kernel} of {self.choice} may alias; a timed candidate must not")

    def format(self) -> str:
        grids = self.grids()
        parts = []
        for i, c in enumerate(self.candidates):
            args = ", ".join(format_arg(a) for a in c.args)
            serves = f" if bucket=={self.serves[i]}" if self.serves and self.serves[i] is not None else ""
            parts.append(f"{c.kernel}({args}) grid#{grids.index(tuple(c.grid))}{serves}")
        grid_text = "; ".join(f"grid#{i} [{', '.join(str(g) for g in grid)}]" for i, grid in enumerate(grids))
        key = ", ".join(format_arg(k) for k in self.key)
        key = f"bucket({key})" if self.bucketed else key
        text = f"choose {self.purpose} {self.choice} per ({key}) among {{{' | '.join(parts)}}}  {grid_text}"
        return text + (f"  writes {', '.join(self.writes)}" if self.writes else "")


def bucket(value: int) -> int:
    """The power-of-two size bucket of a key value (what `bucketed` keys round to)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


def eligible(line: MultiKernelCall, key: tuple[int, ...]) -> list[int]:
    """The candidates that may run for a (bucketed) key."""
    if not line.serves:
        return list(range(len(line.candidates)))
    return [i for i, s in enumerate(line.serves) if s is None or s == key[0]]


def calls_of(program) -> list[KernelCall]:
    """Every kernel launch a program may make: its KernelCalls and its choices' candidates."""
    calls: list[KernelCall] = []
    for line in program.lines:
        if isinstance(line, KernelCall):
            calls.append(line)
        elif isinstance(line, MultiKernelCall):
            calls.extend(line.candidates)
    return calls


__all__ = ["MultiKernelCall", "bucket", "calls_of", "eligible"]
