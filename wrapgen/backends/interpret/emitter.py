"""InterpretEmitter, target "interpret": runs a program line by line instead of printing it, the
way `torch.fx.Interpreter` runs a graph. It is the reference semantics of the Wrapper IR.

Each call starts an environment holding the inputs and constants by name; every line reads and
updates it: size symbols (by their names) are bound and checked, buffers allocated, storage handed
on (reuse, pools), views taken, generated kernels launched (the launchers the python target's
modules use), library ops called, names freed; `Output` gives the results. With config.sanitize on
at compile time, the sanitizer (backends/sanitize) checks each line before and after it runs.

A subclass changes one behaviour by overriding one `emit_<line>` method.
"""

from __future__ import annotations

import functools
from collections import ChainMap
from typing import Any

import sympy
import torch

from wrapgen import config
from wrapgen.backends.emitter import CompiledArtifact, Emitter
from wrapgen.backends.interpret.kernels import ProgramKernels
from wrapgen.backends.interpret.multi_kernel import InterpretMultiKernelMixin
from wrapgen.backends.runtime import (
    assert_finite,
    check_arg_count,
    evaluate,
    input_mismatch,
    resolve_op,
    scalar_mismatch,
    symbol_out_of_range,
    with_strides,
)
from wrapgen.backends.sanitize import CallSanitizer, ProgramSanitizer
from wrapgen.errors import WrapgenError
from wrapgen.wrapper_ir.collectives import WAIT_OP, CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.graphs import GraphBegin, GraphEnd
from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
    AllocateFromPool,
    AssertFinite,
    AssertInput,
    AssertScalar,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import Arg, TensorRef, TensorType

_OBSERVE = {
    "size": lambda t, dim: t.size(dim),
    "stride": lambda t, dim: t.stride(dim),
    "offset": lambda t, dim: t.storage_offset(),
    "value": lambda v, dim: v,
    "item": lambda t, dim: t.item(),
}


@functools.cache
def _op(qualified: str) -> Any:
    return resolve_op(qualified)


def view_storage(base: torch.Tensor, type_: TensorType, sizes: list[int], strides: list[int], byte_offset: int) -> torch.Tensor:
    """A tensor of `type_`'s dtype over `base`'s storage, starting `byte_offset` bytes into it."""
    itemsize = type_.dtype.itemsize
    if byte_offset % itemsize:
        raise ValueError(f"byte offset {byte_offset} is not a multiple of the element size {itemsize}")
    empty = torch.empty(0, dtype=type_.dtype, device=base.device)
    return empty.set_(base.untyped_storage(), byte_offset // itemsize, sizes, strides)


class InterpretEmitter(InterpretMultiKernelMixin, Emitter):
    """`compile` builds the kernels once and returns `call(args)`, which runs the lines each call."""

    name = "interpret"

    def __init__(self, kernels: ProgramKernels | None = None, sanitizer: ProgramSanitizer | None = None) -> None:
        self.kernels = kernels
        self.sanitizer = sanitizer

    def compile(self, program: Program) -> CompiledArtifact:
        kernels = ProgramKernels(program, type(self).__name__)
        sanitizer = ProgramSanitizer(program) if config.sanitize else None
        interpreter = type(self)

        def call(args: list) -> tuple:
            return interpreter(kernels, sanitizer).run(program, args)

        return CompiledArtifact(call, str(program))

    # -- a run ----------------------------------------------------------------------------------
    def run(self, program: Program, args: list) -> tuple:
        """Run `program` on `args` (the boxed convention: the list is emptied) and return its outputs."""
        if len(args) != len(program.inputs):
            check_arg_count(args, len(program.inputs))
        if self.kernels is None:
            self.kernels = ProgramKernels(program, type(self).__name__)
        self.env: dict[str, object] = dict(program.constant_values())
        self.env.update(zip(program.input_names(), args))
        args.clear()
        self.checks: CallSanitizer | None = self.sanitizer.start(self.env) if self.sanitizer is not None else None
        return self.emit(program)

    def begin(self, program: Program) -> None:
        self.result: tuple = ()

    def finish(self, program: Program) -> tuple:
        return self.result

    def dispatch(self, line: WrapperLine) -> None:
        number = self.line_number
        if self.checks is not None:
            self.checks.before(number, self.env)
        try:
            super().dispatch(line)
        except WrapgenError:
            raise  # names the line already, or is an input mismatch the caller handles
        except Exception as error:
            if self.checks is not None and self.checks.pending is not None:
                raise self.checks.pending from error  # it read stale data, then failed
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"while {type(self).__name__} ran line {number} ({line.format()})")
            raise
        if self.checks is not None:
            self.checks.after(number, self.env)

    # -- values ----------------------------------------------------------------------------------
    def value(self, arg: Arg) -> Any:
        """A Python value for a line's argument: tensors by name, expressions evaluated."""
        if isinstance(arg, TensorRef):
            return self.env[arg.name]
        if isinstance(arg, tuple):
            return tuple(self.value(a) for a in arg)
        if isinstance(arg, sympy.Basic):
            return evaluate(arg, self.env)
        return arg

    def ints(self, exprs: tuple) -> list[int]:
        return [int(evaluate(sympy.sympify(e), self.env)) for e in exprs]  # type: ignore[call-overload]

    # -- inputs and symbols ----------------------------------------------------------------------
    def emit_bind_symbol(self, line: BindSymbol) -> None:
        observed = _OBSERVE[line.kind](self.env[line.source], line.dim)
        value = observed if line.expr == OBSERVED else evaluate(line.expr, ChainMap({str(OBSERVED): observed}, self.env))
        low, high = line.checked_bounds()
        if (low is not None and value < low) or (high is not None and value > high):  # type: ignore[operator]
            symbol_out_of_range(str(line.symbol), value, line.min, line.max)  # type: ignore[arg-type]
        self.env[str(line.symbol)] = value

    def emit_assert_input(self, line: AssertInput) -> None:
        value = self.env[line.name]
        sizes = tuple(self.ints(line.sizes))
        strides = tuple(None if s is None else int(evaluate(s, self.env)) for s in line.strides)  # type: ignore[call-overload]
        if (
            not isinstance(value, torch.Tensor)
            or (value.dtype, tuple(value.shape)) != (line.dtype, sizes)
            or line.device not in (None, value.device)
            or any(want is not None and got != want for got, want in zip(value.stride(), strides))
        ):
            input_mismatch(line.name, value, sizes, strides, line.dtype, line.device)

    def emit_assert_scalar(self, line: AssertScalar) -> None:
        if self.env[line.name] != line.expected:
            scalar_mismatch(line.name, self.env[line.name], line.expected)

    def emit_symbolic_call_arg(self, line: SymbolicCallArg) -> None:
        self.env[str(line.symbol)] = evaluate(line.expr, self.env)

    # -- buffers ---------------------------------------------------------------------------------
    def emit_allocate(self, line: Allocate) -> None:
        t = line.type
        self.env[line.name] = torch.empty_strided(self.ints(t.sizes), self.ints(t.strides or ()), dtype=t.dtype, device=t.device)

    def emit_reuse_buffer(self, line: ReuseBuffer) -> None:
        """The new layout starts at the first byte of the storage behind `source`."""
        t = line.type
        self.env[line.name] = view_storage(self.env[line.source], t, self.ints(t.sizes), self.ints(t.strides or ()), 0)  # type: ignore[arg-type]

    def emit_allocate_from_pool(self, line: AllocateFromPool) -> None:
        t, offset = line.type, int(evaluate(line.offset, self.env))  # type: ignore[call-overload]
        self.env[line.name] = view_storage(self.env[line.pool], t, self.ints(t.sizes), self.ints(t.strides or ()), offset)  # type: ignore[arg-type]

    def emit_free(self, line: Free) -> None:
        del self.env[line.name]

    def emit_reinterpret(self, line: Reinterpret) -> None:
        """Sizes, strides, and an offset relative to the source's own storage offset."""
        source: torch.Tensor = self.env[line.source]  # type: ignore[assignment]
        offset = source.storage_offset() + int(evaluate(line.offset, self.env))  # type: ignore[call-overload]
        self.env[line.name] = torch.as_strided(source, self.ints(line.sizes), self.ints(line.strides), offset)

    # -- calls -----------------------------------------------------------------------------------
    def emit_extern_kernel(self, line: ExternKernel) -> None:
        args = [self.value(a) for a in line.args]
        kwargs = {k: self.value(v) for k, v in line.kwargs}
        result = _op(line.op)(*args, **kwargs)
        if line.name is not None:
            self.env[line.name] = result

    def emit_collective_start(self, line: CollectiveStart) -> None:
        """Launched by the functional collective, which returns at once (the group looked up by name)."""
        self.env[line.name] = _op(line.op)(*(self.value(a) for a in line.op_args()))

    def emit_collective_wait(self, line: CollectiveWait) -> None:
        _op(WAIT_OP)(self.env[line.name])

    def emit_multi_output(self, line: MultiOutput) -> None:
        value = self.env[line.source]
        for index in line.index:
            value = value[index]  # type: ignore[index]
        self.env[line.name] = value

    def emit_kernel_definition(self, line: KernelDefinition) -> None:
        """Built by `compile` (ProgramKernels), which refuses a kernel no device here can launch."""

    def emit_kernel_call(self, line: KernelCall) -> None:
        assert self.kernels is not None
        self.kernels.launch(line.kernel, [self.value(a) for a in line.args], self.ints(line.grid))

    # -- the rest --------------------------------------------------------------------------------
    def emit_assert_finite(self, line: AssertFinite) -> None:
        assert_finite(line.name, self.env[line.name])  # type: ignore[arg-type]

    def emit_ensure_strides(self, line: EnsureStrides) -> None:
        self.env[line.name] = with_strides(self.env[line.name], self.ints(line.sizes), self.ints(line.strides))  # type: ignore[arg-type]

    def emit_comment(self, line: Comment) -> None:
        pass

    def emit_graph_begin(self, line: GraphBegin) -> None:
        pass  # the reference semantics: a region's lines run as they are (other targets may record them)

    def emit_graph_end(self, line: GraphEnd) -> None:
        pass

    def emit_output(self, line: Output) -> None:
        self.result = tuple(self.value(v) for v in line.values)
