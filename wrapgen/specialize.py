"""Serving sizes 0 and 1 from a dynamic program: programs specialized for them, compiled on first use.

torch.export gives every dynamic size the range [2, inf]: sizes 0 and 1 change what an op
means (a size-1 dim broadcasts, `squeeze` drops it, `if x.shape[0] == 1:` takes the other
branch), so torch only proves the traced graph right for sizes >= 2. Size-oblivious tracing
(`backed_size_oblivious`) widens the range to [0, inf], but silently: it keeps the graph it
traced at the example's size even where eager would run differently at 1, and it cannot tell
us when it did. So the dynamic program keeps its proven range, and a call it refuses because
some dynamic dim is 0 or 1 is served by a program traced from that call's own inputs, where
torch sees the real 0/1 sizes and decides as eager does. Those programs are cached by which
dims are 0 or 1 (their other dims stay dynamic), so batch 1 costs one extra compile, once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from wrapgen.errors import InputMismatchError, LoweringError
from wrapgen.wrapper_ir.lines import AssertScalar
from wrapgen.wrapper_ir.program import Program, TensorInput

# One entry per input: for a tensor, per dim its size where that is 0 or 1, else None.
SizePattern = tuple[tuple[int | None, ...] | None, ...]
Build = Callable[[tuple], Callable[..., Any]]

MAX_SPECIALIZATIONS = 8  # patterns kept; the least recently used one is dropped beyond that


class SizeSpecializations:
    """The programs a dynamic program hands its 0/1-sized calls to, keyed by size pattern.

    `build(args)` traces and compiles the model for one call's positional arguments (under
    the options the dynamic program was compiled with); a trace that fails is remembered, so
    a size the model cannot take fails fast on later calls too.
    """

    def __init__(self, program: Program, build: Build, limit: int = MAX_SPECIALIZATIONS) -> None:
        self.program = program
        self._build = build
        self._limit = limit
        self._own_pattern = _program_pattern(program)
        self._programs: OrderedDict[SizePattern, Callable[..., Any]] = OrderedDict()
        # Failed traces, by exact shapes (a pattern may still work at other sizes).
        self._failures: OrderedDict[tuple, InputMismatchError] = OrderedDict()
        self._lock = threading.Lock()

    def compiled(self) -> dict[SizePattern, Callable[..., Any]]:
        """The specialized programs compiled so far, by pattern (for inspection and tests)."""
        with self._lock:
            return dict(self._programs)

    def lookup(self, flat: Sequence[object]) -> Callable[..., Any] | None:
        """The program compiled before for this call's 0/1 sizes, else None (the dynamic program's
        turn). Cheap when no input has a 0/1 size: one `min` per tensor."""
        if not self._programs:
            return None
        for value in flat:
            if isinstance(value, torch.Tensor) and value.dim() and min(value.shape) < 2:
                break
        else:
            return None
        pattern = _call_pattern(flat)
        with self._lock:
            program = self._programs.get(pattern)
            if program is not None:
                self._programs.move_to_end(pattern)
            return program

    def serve(self, args: tuple, flat: Sequence[object], refusal: InputMismatchError) -> Callable[..., Any]:
        """The program for this call's 0/1 sizes, compiled now if it is the first such call.

        Raises `refusal` (the dynamic program's own error) when the call has the 0/1 sizes the
        dynamic program was compiled for, so they are not what it objects to; raises an
        InputMismatchError naming the input when the call differs in more than 0/1 sizes, or
        when the model cannot be traced at the call's sizes.
        """
        pattern = _call_pattern(flat)
        if pattern == self._own_pattern:
            raise refusal
        problem = _mismatch(self.program, flat)
        if problem is not None:
            raise InputMismatchError(problem)
        shapes = tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in flat)
        with self._lock:
            program = self._programs.get(pattern)  # compiled meanwhile (another thread), or a direct call
            if program is not None:
                self._programs.move_to_end(pattern)
                return program
            failure = self._failures.get(shapes)
            if failure is None:
                built = self._compile(args, pattern, refusal)
                if not isinstance(built, InputMismatchError):
                    return _remember(self._programs, pattern, built, self._limit)
                failure = _remember(self._failures, shapes, built, self._limit)
        raise InputMismatchError(str(failure)) from failure.__cause__

    def _compile(
        self, args: tuple, pattern: SizePattern, refusal: InputMismatchError
    ) -> Callable[..., Any] | InputMismatchError:
        try:
            return self._build(args)
        except LoweringError as err:  # torch (or wrapgen) cannot take the model at these sizes
            failure = InputMismatchError(
                f"{refusal}; a program specialized for {describe(self.program, pattern)} could not be"
                f" compiled either: {err}"
            )
            failure.__cause__ = err
            return failure


def _remember(cache: OrderedDict, key: object, value: Any, limit: int) -> Any:
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)  # the least recently used
    return value


def describe(program: Program, pattern: SizePattern) -> str:
    """`x.size(0) = 1, x.size(1) = 1`: the 0/1 sizes of a pattern, by input name."""
    parts = [
        f"{spec.name}.size({dim}) = {size}"
        for spec, dims in zip(program.inputs, pattern)
        for dim, size in enumerate(dims or ())
        if size is not None
    ]
    return ", ".join(parts) or "these sizes"


def _call_pattern(flat: Sequence[object]) -> SizePattern:
    return tuple(
        tuple(s if s < 2 else None for s in value.shape) if isinstance(value, torch.Tensor) else None for value in flat
    )


def _program_pattern(program: Program) -> SizePattern:
    """The pattern of the calls `program` serves itself: its static 0/1 sizes."""
    pattern = []
    for spec in program.inputs:
        if not isinstance(spec, TensorInput):
            pattern.append(None)
            continue
        sizes = (sympy.sympify(s) for s in spec.type.sizes)
        pattern.append(tuple(int(s) if s.is_Integer and int(s) < 2 else None for s in sizes))
    return tuple(pattern)


def _mismatch(program: Program, flat: Sequence[object]) -> str | None:
    """What makes this call more than a 0/1-size variant of the program's inputs, or None.

    Static sizes >= 2 were fixed by the model (a Linear's features, a guard), not by the
    example, so they must match; sizes the program left symbolic, or fixed at 0/1, may vary.
    """
    if len(flat) != len(program.inputs):
        return f"expected {len(program.inputs)} inputs, got {len(flat)}"
    for spec, value in zip(program.inputs, flat):
        if not isinstance(spec, TensorInput):
            continue
        want = spec.type
        if not isinstance(value, torch.Tensor):
            return f"input {spec.name}: expected a tensor, got {type(value).__name__}"
        if value.dtype != want.dtype:
            return f"input {spec.name}: expected dtype {want.dtype}, got {value.dtype}"
        if value.device != want.device:
            return f"input {spec.name}: expected device {want.device}, got {value.device}"
        sizes = tuple(sympy.sympify(s) for s in want.sizes)
        fixed = [s.is_Integer and int(s) >= 2 for s in sizes]
        if value.dim() != len(sizes) or any(f and int(s) != n for f, s, n in zip(fixed, sizes, value.shape)):
            return f"input {spec.name}: expected shape {sizes}, got {tuple(value.shape)}"
    position = {spec.name: i for i, spec in enumerate(program.inputs)}
    for line in program.lines:
        if isinstance(line, AssertScalar) and line.name in position:
            value = flat[position[line.name]]
            if value != line.expected:
                return f"input {line.name}: the program was compiled for the value {line.expected!r}, got {value!r}"
    return None
