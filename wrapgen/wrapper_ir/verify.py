"""The verifier: every program passes it before an emitter sees it.

It walks the lines once, tracking which names are live, freed, and which size symbols are
bound, which collectives are in flight (their results are not read, nor their storage written
or reused, before their waits), and checks each line's own invariants. Every error names the
line (1-based, as in `str(program)`) and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from wrapgen.wrapper_ir.collectives import CollectiveStart, InFlight
from wrapgen.wrapper_ir.graphs import CaptureContext, GraphBegin, GraphEnd, GraphScope
from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.lines import (
    AllocateFromPool,
    AssertFinite,
    AssertInput,
    ExternKernel,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    WrapperLine,
)
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall
from wrapgen.wrapper_ir.passes.state_versions import StateVersions, state_storages
from wrapgen.wrapper_ir.program import Constant, Program, TensorInput
from wrapgen.wrapper_ir.values import ResultTypeLike, TensorType, contiguous_strides, dtype_name


class VerificationError(ValueError):
    """A malformed program; `line_number` is 1-based (0 for the program header)."""

    def __init__(self, line_number: int, line: WrapperLine | None, reason: str):
        self.line_number = line_number
        self.line = line
        self.reason = reason
        where = f"line {line_number} ({line.format()})" if line is not None else "program header"
        super().__init__(f"{where}: {reason}")


@dataclass
class _State:
    live: dict[str, ResultTypeLike]
    defined_at: dict[str, int]
    freed_at: dict[str, int]
    bound: set[sympy.Symbol]
    kernels: set[str]
    constants: set[str]
    in_flight: InFlight


def _check_permuted(const: Constant) -> None:
    """A constant made by permuting its origin (Constant.permutation) is contiguous, its
    permutation one of its dimensions, and its value (where it has one) of its sizes."""
    perm = const.permutation
    if perm is None:
        return
    sizes = const.type.sizes
    where = f"constant {const.name}"
    if sorted(perm) != list(range(len(sizes))):
        raise VerificationError(0, None, f"{where}: permutation {list(perm)} is not one of its {len(sizes)} dimensions")
    if const.type.strides is not None and tuple(const.type.strides) != tuple(contiguous_strides(sizes)):
        raise VerificationError(0, None, f"{where}: a permuted constant is contiguous, not strides {const.type.strides}")
    if const.value is not None and (tuple(const.value.shape) != tuple(sizes) or not const.value.is_contiguous()):
        raise VerificationError(0, None, f"{where}: its value is {tuple(const.value.shape)}, not contiguous {sizes}")


def verify(program: Program) -> Program:
    """Raise VerificationError for the first malformed line; return the program unchanged."""
    state = _State(live={}, defined_at={}, freed_at={}, bound=set(), kernels=set(), constants=set(), in_flight=InFlight())
    for spec in program.inputs:
        _define_header(state, spec.name, spec.type if isinstance(spec, TensorInput) else None)
    for const in program.constants:
        _define_header(state, const.name, const.type)
        state.constants.add(const.name)
        _check_permuted(const)
    input_types = {i.name: i.type for i in program.inputs if isinstance(i, TensorInput)}
    later_definitions = {name: n for n, line in enumerate(program.lines, 1) for name in line.defines()}

    # CUDA-graph regions (graphs.py): checked only where the program has them.
    graphs = GraphScope(CaptureContext.of(program)) if any(isinstance(line, (GraphBegin, GraphEnd)) for line in program.lines) else None

    outputs = [n for n, line in enumerate(program.lines, 1) if isinstance(line, Output)]
    if len(outputs) != 1 or outputs[0] != len(program.lines):
        raise VerificationError(0, None, "a program ends with exactly one Output line")

    # state written in place: every call sees the version of it that the lowering recorded
    header = {i.name for i in program.inputs} | {c.name for c in program.constants}
    versions = StateVersions(state_storages(header, list(program.lines)))

    for number, line in enumerate(program.lines, 1):
        try:
            line.check()
            versions.check(line)
            versions.apply(line)
            state.in_flight.check(line)
            if graphs is not None:
                graphs.check(line)
            _check_uses(state, line, number, later_definitions)
            _check_symbols(state, line)
            _check_types(state, line, input_types)
            _apply(state, line, number)
            if graphs is not None:
                graphs.apply(line, number)
        except ValueError as err:
            if isinstance(err, VerificationError):
                raise
            raise VerificationError(number, line, str(err)) from None
    return program


def _define_header(state: _State, name: str, type_: ResultTypeLike) -> None:
    if name in state.live:
        raise VerificationError(0, None, f"name {name!r} is declared twice")
    state.live[name] = type_
    state.defined_at[name] = 0


def _check_uses(state: _State, line: WrapperLine, number: int, later: dict[str, int]) -> None:
    for name in line.uses():
        if name in state.live:
            continue
        if name in state.freed_at:
            raise ValueError(f"uses {name} after it was freed at line {state.freed_at[name]}")
        if name in later and later[name] >= number:
            raise ValueError(f"uses {name} before its definition at line {later[name]}")
        raise ValueError(f"uses undefined name {name}")


def _check_symbols(state: _State, line: WrapperLine) -> None:
    unbound = sorted(str(s) for s in line.symbols_used() if s not in state.bound)
    if unbound:
        raise ValueError(f"uses undefined size symbol {', '.join(unbound)}")
    for symbol in line.binds():
        if symbol in state.bound:
            raise ValueError(f"binds size symbol {symbol} a second time")


def _tensor_type(state: _State, name: str) -> TensorType | None:
    type_ = state.live.get(name)
    return type_ if isinstance(type_, TensorType) else None


def _check_types(state: _State, line: WrapperLine, input_types: dict[str, TensorType]) -> None:
    if isinstance(line, Reinterpret):
        source = _tensor_type(state, line.source)
        if source is not None and (source.dtype, source.device) != (line.dtype, line.device):
            raise ValueError(
                f"reinterprets {line.source} ({dtype_name(source.dtype)} {source.device}) "
                f"as {dtype_name(line.dtype)} {line.device}: dtype/device mismatch"
            )
    elif isinstance(line, MultiOutput):
        result = state.live.get(line.source)
        entry: object = result
        for i in line.index:
            if not isinstance(entry, tuple) or not 0 <= i < len(entry):
                raise ValueError(f"{line.source} has no element at index {list(line.index)}")
            entry = entry[i]
        if isinstance(entry, TensorType) and (entry.dtype, entry.device) != (line.type.dtype, line.type.device):
            raise ValueError(
                f"element is {dtype_name(entry.dtype)} {entry.device} but the line says "
                f"{dtype_name(line.type.dtype)} {line.type.device}: dtype/device mismatch"
            )
    elif isinstance(line, AssertInput):
        expected = input_types.get(line.name)
        if expected is None:
            raise ValueError(f"{line.name} is not a tensor input of the program")
        if expected.dtype != line.dtype or line.device not in (None, expected.device):
            raise ValueError(f"checks {line.name} for a dtype/device other than its declaration")
    elif isinstance(line, ReuseBuffer):
        source = _tensor_type(state, line.source)
        if source is not None and (source.dtype.itemsize, source.device) != (line.type.dtype.itemsize, line.type.device):
            raise ValueError(
                f"reuses {line.source} ({dtype_name(source.dtype)} {source.device}) for "
                f"{dtype_name(line.type.dtype)} {line.type.device}: element size/device mismatch"
            )
    elif isinstance(line, AllocateFromPool):
        pool = _tensor_type(state, line.pool)
        if pool is not None and (pool.dtype, pool.device) != (torch.uint8, line.type.device):
            raise ValueError(f"pool {line.pool} must be a u8 buffer on {line.type.device}")
    elif isinstance(line, EnsureStrides):
        known = _tensor_type(state, line.name)
        if known is not None and ((known.dtype, known.device) != (line.dtype, line.device) or len(known.sizes) != len(line.sizes)):
            raise ValueError(f"{line.name} is {known}, not a {dtype_name(line.dtype)} {line.device} tensor of rank {len(line.sizes)}")
    elif isinstance(line, AssertFinite):
        known = _tensor_type(state, line.name)
        if known is not None and known.dtype != line.dtype:
            raise ValueError(f"{line.name} is {dtype_name(known.dtype)}, not {dtype_name(line.dtype)}")
    elif isinstance(line, CollectiveStart):
        source = _tensor_type(state, line.input)
        if source is not None and (source.dtype, source.device) != (line.type.dtype, line.type.device):
            raise ValueError(
                f"{line.collective} of {line.input} ({dtype_name(source.dtype)} {source.device}) cannot give "
                f"{dtype_name(line.type.dtype)} {line.type.device}: dtype/device mismatch"
            )
    elif isinstance(line, KernelCall) and line.kernel not in state.kernels:
        raise ValueError(f"calls kernel {line.kernel}, which no earlier KernelDefinition defines")
    elif isinstance(line, MultiKernelCall):
        for kernel in line.called_kernels():
            if kernel not in state.kernels:
                raise ValueError(f"may call kernel {kernel}, which no earlier KernelDefinition defines")


def _apply(state: _State, line: WrapperLine, number: int) -> None:
    for symbol in line.binds():
        state.bound.add(symbol)
    if isinstance(line, KernelDefinition):
        if line.name in state.kernels:
            raise ValueError(f"kernel {line.name} is defined twice")
        state.kernels.add(line.name)
    state.in_flight.apply(line, number, _alias_source(line))
    for name in line.defines():
        if name in state.live:
            raise ValueError(f"redefines {name}, still live since line {state.defined_at[name]}")
        if sympy.Symbol(name) in state.bound or any(str(s) == name for s in state.bound):
            raise ValueError(f"name {name} clashes with a size symbol")
        state.live[name] = line.defined_types().get(name)
        state.defined_at[name] = number
        state.freed_at.pop(name, None)
    for name in line.frees():
        if name in state.freed_at:
            raise ValueError(f"double free of {name} (first freed at line {state.freed_at[name]})")
        if name not in state.live:
            raise ValueError(f"frees undefined name {name}")
        if name in state.constants:
            raise ValueError(f"frees constant {name}, which the program does not own")
        del state.live[name]
        state.freed_at[name] = number


def _alias_source(line: WrapperLine) -> str | None:
    """The name whose storage `line`'s result views, if it views one."""
    if isinstance(line, (Reinterpret, MultiOutput, ReuseBuffer)):
        return line.source
    if isinstance(line, ExternKernel):
        return line.alias_of
    return None
