"""The graph-partition pass: split a program into runs of lines a target records as CUDA graphs
(`GraphBegin` ... `GraphEnd`, see `wrapper_ir/graphs.py`) and the host work between them.

Greedy, in program order: a region opens at the first line that can be recorded and closes
before the first that cannot (a `.item()`, a CPU op, an op with a data-dependent output size, a
library op known not to be capturable, a write to an input the region would copy). Lines with
no work of their own (comments, kernel definitions, frees) join the region around them;
`SymbolicCallArg` lines (host arithmetic on sizes) move up before their region's `GraphBegin`.
A region without a kernel or library call is left as plain lines.

Names a region defines and later lines use are its outputs: graph memory, which the next replay
overwrites. So each program output that lives in graph memory is copied into a fresh tensor
before `return` (`# copied out of graph memory` lines): what a call returns is never
overwritten by a later one. The lines at the program's end that only make returned tensors
(the generated kernels writing them, their allocations and views: an LM head's logits from a
GEMM template) stay outside the graphs instead, when a returned tensor is at least
`OUTPUT_TAIL_MIN_BYTES` (at the size hints): they write fresh memory each call, one launch as
the copy would be, without the copy's traffic or a second output-sized buffer held by the
graph (and never more launches outside than the copies they save). Smaller outputs are
copied: the copy costs nothing measurable, and the program stays in one graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import sympy
import torch

from wrapgen.wrapper_ir.graphs import (
    NEUTRAL_LINES,
    CaptureContext,
    GraphBegin,
    GraphEnd,
    line_blocker,
    region_blocker,
    root_of,
    written_names,
)
from wrapgen.wrapper_ir.lines import (
    Allocate,
    AllocateFromPool,
    Comment,
    ExternKernel,
    KernelCall,
    Output,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorRef, TensorType, contiguous_strides, storage_bytes

OUTPUT_COPY = "copied out of graph memory"
OUTPUT_TAIL_MIN_BYTES = 1 << 20


@dataclass
class _Region:
    device: torch.device
    start: int  # index of its first line in the program
    lines: list[tuple[int, WrapperLine]] = field(default_factory=list)  # (index, line), SymbolicCallArgs included
    born: set[str] = field(default_factory=set)
    in_place_roots: set[str] = field(default_factory=set)

    def has_work(self) -> bool:
        return any(isinstance(line, (KernelCall, ExternKernel)) or hasattr(line, "candidates") for _, line in self.lines)


def partition_graphs(
    program: Program,
    static_inputs: Iterable[str] = (),
    device_type: str = "cuda",
    blocker: Callable[[ExternKernel], str | None] | None = None,
) -> Program:
    """Mark the runs of lines on `device_type` tensors that can be recorded as graphs.

    `static_inputs`: program inputs the caller keeps at a fixed address (parameters and buffers
    torch.compile passes as inputs); they, the constants and the inputs the program writes in
    place are used in place, the graph's key holding their addresses. `blocker`: the target's rule for library ops (`graphs.op_blocker`
    by default; it gets the ExternKernel line). A program without such runs comes back unchanged.
    """
    if any(isinstance(line, (GraphBegin, GraphEnd)) for line in program.lines):
        raise ValueError(f"program {program.name} is partitioned already")
    ctx = CaptureContext.of(program, blocker)
    static = set(static_inputs) | {c.name for c in program.constants} | written_inputs(program)
    forced: set[int] = _returned_tail(program)
    for _ in range(len(program.lines) + 1):
        lines, problems = _partition(program, ctx, static, device_type, forced)
        if not problems:
            break
        forced |= problems
    if not any(isinstance(line, GraphBegin) for line in lines):
        return program
    return program.with_lines(_copy_outputs(program, lines))


def _partition(
    program: Program, ctx: CaptureContext, static: set[str], device_type: str, forced: set[int]
) -> tuple[list[WrapperLine], set[int]]:
    """One greedy pass; `forced` lines stay outside. Returns the lines and the indices of lines
    that must be forced out too (a region output that is not a tensor)."""
    references: dict[str, list[int]] = {}
    for index, line in enumerate(program.lines):
        for name in (*line.uses(), *line.frees()):
            references.setdefault(name, []).append(index)
    returned = set(program.lines[-1].uses()) if program.lines else set()
    out: list[WrapperLine] = []
    roots: dict[str, str] = {}
    graph_roots: set[str] = set()  # storages defined inside regions (their outputs stay put)
    problems: set[int] = set()
    region: _Region | None = None

    def close() -> None:
        nonlocal region
        if region is None:
            return
        current, region = region, None
        if not current.has_work():
            out.extend(line for _, line in current.lines)
            return
        name = f"g{sum(isinstance(x, GraphBegin) for x in out)}"
        problems.update(_emit_region(current, name, out, references, ctx, static, roots, returned))
        # storage the region itself created (not views of its inputs) stays put between calls
        graph_roots.update(n for n in current.born if roots.get(n, n) == n)

    for index, line in enumerate(program.lines):
        if region is not None and isinstance(line, (*NEUTRAL_LINES, SymbolicCallArg)):
            region.lines.append((index, line))
        else:
            reason = "forced" if index in forced else None
            if region is not None:
                if reason is None:
                    reason = line_blocker(line, ctx, region.device) or region_blocker(
                        line, "", region.born, roots, region.in_place_roots
                    )
                if reason is not None:  # the region ends before a line that stays outside
                    close()
            if region is None and reason is None and not isinstance(line, NEUTRAL_LINES):
                device = _line_device(line, ctx)
                if device is not None and device.type == device_type and line_blocker(line, ctx, device) is None:
                    in_place = {roots.get(n, n) for n in static} | graph_roots
                    candidate = _Region(device, index, in_place_roots=in_place)
                    if region_blocker(line, "", candidate.born, roots, in_place) is None:
                        region = candidate
            if region is not None and reason is None:
                region.lines.append((index, line))
                region.born.update(line.defines())
            else:
                out.append(line)
        for name in line.defines():
            roots[name] = root_of(roots, line, name)
    close()
    return out, problems


def written_inputs(program: Program) -> set[str]:
    """The inputs whose storage the program writes: state (optimizer moments and steps, a KV
    cache, running statistics). A graph uses them in place, keyed by address like parameters:
    a copy would take the write instead of the caller's tensor (so the writing line could not
    join a graph), and copying state in costs a pass over it per call."""
    roots = _storage_roots(program.lines)
    written = {roots.get(name, name) for line in program.lines for name in written_names(line)}
    return {name for name in program.input_names() if name in written}


def _storage_roots(lines: Iterable[WrapperLine]) -> dict[str, str]:
    """Each name's storage: a view's source's, and storage handed on (a reused buffer, a pool's
    slice) counts as the storage it came from."""
    roots: dict[str, str] = {}
    for line in lines:
        handed = line.source if isinstance(line, ReuseBuffer) else line.pool if isinstance(line, AllocateFromPool) else None
        for name in line.defines():
            roots[name] = roots.get(handed, handed) if handed is not None else root_of(roots, line, name)
    return roots


def _returned_tail(program: Program) -> set[int]:
    """Indices of the lines at the end of `program` that only allocate, view or write storage
    the program returns: they stay outside the graphs (see the module docstring)."""
    lines = program.lines
    if not lines or not isinstance(lines[-1], Output):
        return set()
    roots = _storage_roots(lines)
    returned = {roots.get(v.name, v.name) for v in lines[-1].values if isinstance(v, TensorRef)}
    hints = {info.symbol: info.hint for info in program.symbols}
    types = program.value_types()
    if not any(_bytes_at_hints(types.get(v.name), hints) >= OUTPUT_TAIL_MIN_BYTES for v in lines[-1].values if isinstance(v, TensorRef)):
        return set()
    tail: set[int] = set()
    for index in range(len(lines) - 2, -1, -1):
        line = lines[index]
        if isinstance(line, (*NEUTRAL_LINES, SymbolicCallArg)):  # (size arithmetic moves before a region anyway)
            continue
        touched = [roots.get(n, n) for n in (*line.defines(), *written_names(line))]
        if not touched or isinstance(line, (ReuseBuffer, AllocateFromPool, ExternKernel)) or not all(r in returned for r in touched):
            break  # (a library call outside the graphs would make cuBLAS a workspace for the caller's stream)
        tail.add(index)
    # only storage the tail itself allocates comes out fresh: a kernel writing into storage made
    # inside a graph (a buffer reused in place) stays there, and that output is copied out
    made = {n for i in tail for n in lines[i].defines() if roots.get(n, n) == n}
    tail = {i for i in tail if all(roots.get(n, n) in made for n in (*lines[i].defines(), *written_names(lines[i])))}
    # each launch moved out of the graphs must save a copy-out launch: never more launches (a
    # forward pass that returns every activation it saves must not leave its graph whole)
    launches = sum(isinstance(lines[i], KernelCall) or hasattr(lines[i], "candidates") for i in tail)
    fresh = {v.name for v in lines[-1].values if isinstance(v, TensorRef) and roots.get(v.name, v.name) in made}
    return tail if launches <= len(fresh) else set()


def _bytes_at_hints(type_: object, hints: dict) -> int:
    """The bytes a tensor of `type_` spans at the symbols' hints (0 when unknown)."""
    if not isinstance(type_, TensorType):
        return 0
    nbytes = storage_bytes(type_).subs(hints)
    return int(nbytes) if nbytes.is_Integer else 0


def _line_device(line: WrapperLine, ctx: CaptureContext) -> torch.device | None:
    """The device a line works on, for opening a region (None: not a line that opens one)."""
    if isinstance(line, KernelCall):
        return ctx.kernels.get(line.kernel)
    if hasattr(line, "candidates") and line.candidates:
        return ctx.kernels.get(line.candidates[0].kernel)
    for attr in ("type", "result"):
        value = getattr(line, attr, None)
        if isinstance(value, TensorType):
            return value.device
    device = getattr(line, "device", None)
    if isinstance(device, torch.device):
        return device
    for name in line.uses():
        value = ctx.types.get(name)
        if isinstance(value, TensorType):
            return value.device
    return None


def _emit_region(
    region: _Region,
    name: str,
    out: list[WrapperLine],
    references: dict[str, list[int]],
    ctx: CaptureContext,
    static: set[str],
    roots: dict[str, str],
    returned: set[str],
) -> set[int]:
    """Append the region (hoisted host lines first) to `out`; return lines to force out, if any."""
    inputs: list[str] = []
    local: set[str] = set()
    symbols: set[sympy.Symbol] = set()
    body: list[WrapperLine] = []
    defined_at: dict[str, int] = {}
    for index, line in region.lines:
        # Host-only lines that need nothing the region computes move up before it: size
        # arithmetic, and a returned view of an input (it stays a view of the caller's tensor,
        # not of a static copy, so the caller gets it with its offset, as from eager).
        if isinstance(line, SymbolicCallArg) or (
            isinstance(line, Reinterpret) and line.source not in local and line.name in returned
        ):
            out.append(line)
            continue
        body.append(line)
        symbols |= line.symbols_used()
        for used in line.uses():
            if used not in local and used not in inputs:
                inputs.append(used)
        local.difference_update(line.frees())
        for defined in line.defines():
            local.add(defined)
            defined_at[defined] = index
    end = region.lines[-1][0]
    outputs = [n for n in sorted(local, key=defined_at.__getitem__) if any(i > end for i in references.get(n, ()))]
    untyped = {defined_at[n] for n in outputs if not isinstance(ctx.types.get(n), TensorType)}
    in_place = [n for n in inputs if n in static or roots.get(n, n) in region.in_place_roots]
    key = tuple(sorted(symbols, key=str))
    out.append(GraphBegin(name, region.device, tuple(inputs), tuple(in_place), key))
    out.extend(body)
    out.append(GraphEnd(name, tuple(outputs)))
    return untyped


def _copy_outputs(program: Program, lines: list[WrapperLine]) -> list[WrapperLine]:
    """Before `return`, copy each output that lives in graph memory into a fresh tensor."""
    roots = _storage_roots(lines)
    graph_memory: set[str] = set()
    inside = False
    for line in lines:
        for name in line.defines():
            if inside or roots[name] in graph_memory:
                graph_memory.add(name)
        if isinstance(line, (GraphBegin, GraphEnd)):
            inside = isinstance(line, GraphBegin)
    *body, output = lines
    assert isinstance(output, Output)
    taken = {n for line in lines for n in (*line.defines(), *line.uses())} | set(program.input_names())
    types = program.value_types()
    copies: dict[str, str] = {}
    extra: list[WrapperLine] = []
    for value in output.values:
        if not isinstance(value, TensorRef) or value.name not in graph_memory or value.name in copies:
            continue
        fresh = f"{value.name}_out"
        while fresh in taken:
            fresh += "_"
        taken.add(fresh)
        copies[value.name] = fresh
        extra += _copy_lines(value.name, fresh, types.get(value.name))
    if not copies:
        return lines
    values = tuple(TensorRef(copies[v.name]) if isinstance(v, TensorRef) and v.name in copies else v for v in output.values)
    return [*body, Comment(f"{len(copies)} output(s) {OUTPUT_COPY}"), *extra, Output(values)]


def _copy_lines(source: str, fresh: str, type_: object) -> list[WrapperLine]:
    """A fresh tensor holding `source`: same layout where the layout is known and has no
    overlapping (stride-0) dims, else a contiguous clone."""
    assert isinstance(type_, TensorType), f"graph output {source} has no tensor type"
    strides = type_.strides
    if strides is not None and not any(sympy.sympify(s) == 0 for s in strides):
        return [
            Allocate(fresh, type_),
            ExternKernel(None, "aten::copy_.default", (TensorRef(fresh), TensorRef(source)), writes=(fresh,)),
        ]
    contiguous = TensorType(type_.dtype, type_.device, type_.sizes, contiguous_strides(type_.sizes))
    return [
        ExternKernel(
            fresh, "aten::clone.default", (TensorRef(source),), (("memory_format", torch.contiguous_format),), result=contiguous
        )
    ]


__all__ = ["OUTPUT_COPY", "partition_graphs"]
