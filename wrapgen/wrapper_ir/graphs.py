"""CUDA-graph partitions as Wrapper IR lines: `GraphBegin` ... `GraphEnd` mark a run of lines
that a target may record once as a CUDA graph and replay on later calls.

Why lines: a graph changes how the program runs (what is recorded, which inputs are copied into
static buffers, which names live in graph memory), so it is data every target sees, the
verifier checks and `str(program)` shows. The partition pass (`passes/graph_partition.py`)
places them; this module says what may go inside (`line_blocker`) and checks a partition
(`GraphScope`, used by the verifier).

Inside a region there is no host work whose result the replay would skip: no symbol bindings,
input checks, reads of tensor data on the host, CPU tensors, collectives, ops whose output size
depends on data, or library ops known not to be capturable. The region's key is the values of
the size symbols it uses (`key`): one graph per distinct tuple. Names it reads from outside are
its `inputs`; those in `in_place` (constants, parameters and buffers the caller keeps at a fixed
address, outputs of earlier graphs) are used where they are, the rest are copied into static
buffers before each replay, so a region never writes such an input (the pass leaves those writes
outside). Names it defines and later lines need are its `outputs` (graph memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy
import torch

from wrapgen.wrapper_ir.collectives import CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.lines import (
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
from wrapgen.wrapper_ir.values import TensorType


@dataclass(frozen=True)
class GraphBegin(WrapperLine):
    """Start of graph region `graph` on `device`: the lines up to the matching `GraphEnd` are
    recorded once per value of `key` (size symbols bound before the region) and replayed."""

    graph: str
    device: torch.device
    inputs: tuple[str, ...] = ()
    in_place: tuple[str, ...] = ()
    key: tuple[sympy.Symbol, ...] = ()

    def uses(self) -> tuple[str, ...]:
        return self.inputs

    def symbols_used(self) -> set[sympy.Symbol]:
        return set(self.key)

    def check(self) -> None:
        if not self.graph.isidentifier():
            raise ValueError(f"graph name {self.graph!r} is not an identifier")
        stray = [name for name in self.in_place if name not in self.inputs]
        if stray:
            raise ValueError(f"in_place names {', '.join(stray)} are not among the graph's inputs")
        if len(set(self.inputs)) != len(self.inputs):
            raise ValueError("an input is listed twice")

    def format(self) -> str:
        text = f"graph {self.graph} begin {self.device}  inputs ({', '.join(self.inputs)})"
        if self.in_place:
            text += f"  in_place ({', '.join(self.in_place)})"
        return text + f"  key ({', '.join(str(s) for s in self.key)})"


@dataclass(frozen=True)
class GraphEnd(WrapperLine):
    """End of graph region `graph`; `outputs` are the names it defines that later lines use."""

    graph: str
    outputs: tuple[str, ...] = ()

    def uses(self) -> tuple[str, ...]:
        return self.outputs

    def format(self) -> str:
        return f"graph {self.graph} end  outputs ({', '.join(self.outputs)})"


# Library ops that cannot be recorded: they read device data on the host (a sync), or their
# output's size depends on data. Ops tagged so by torch are refused as well (`_op_tags`).
UNCAPTURABLE_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::item",
        "aten::nonzero",
        "aten::nonzero_static",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::repeat_interleave",
        "aten::equal",
        "aten::is_nonzero",
        "aten::allclose",
        "aten::bincount",
        "aten::histc",
        "aten::multinomial",
        "aten::_assert_scalar",
        "aten::sym_constrain_range",
        "aten::_make_dep_token",
    }
)
_UNCAPTURABLE_PREFIXES = ("aten::linalg_", "aten::_linalg_", "aten::cholesky", "aten::lu", "aten::_nested", "aten::to_sparse")


def _resolve(op: str):
    """The OpOverload of `namespace::name.overload`, or None where it cannot be found."""
    namespace, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _op_tags(op: str) -> set[str]:
    """Names of torch's tags on `op`; empty where it cannot be found."""
    return {str(tag).rsplit(".", 1)[-1] for tag in getattr(_resolve(op), "tags", ())}


def op_blocker(op: str | ExternKernel) -> str | None:
    """Why library op `op` (a name or an ExternKernel line) cannot be recorded in a CUDA graph, or None."""
    op = op.op if isinstance(op, ExternKernel) else op
    base = op.split(".", 1)[0]
    if base in UNCAPTURABLE_OPS or op.startswith(_UNCAPTURABLE_PREFIXES):
        return f"{op} is known not to be capturable (host sync or data-dependent output)"
    tags = _op_tags(op)
    for tag in ("cudagraph_unsafe", "dynamic_output_shape", "data_dependent_output"):
        if tag in tags:
            return f"{op} is tagged {tag}"
    return None


def _draws_random_numbers(line: ExternKernel) -> bool:
    """Whether a call of a seeded op draws random numbers: not when its dropout is 0 or off
    (attention and dropout ops carry the tag whatever their arguments)."""
    overload = _resolve(line.op)
    schema = getattr(overload, "_schema", None)
    if schema is None:
        return True
    kwargs = dict(line.kwargs)
    for index, argument in enumerate(schema.arguments):
        if argument.name not in ("dropout_p", "p", "train"):
            continue
        if argument.name in kwargs:
            value = kwargs[argument.name]
        elif index < len(line.args):
            value = line.args[index]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            return True
        if value in (0, 0.0, False):
            return False
    return True


def seeded_op_blocker(op: str | ExternKernel) -> str | None:
    """`op_blocker`, and random ops too: for a target whose replay would not advance the
    generator's offset (the same random numbers every replay)."""
    reason = op_blocker(op)
    name = op.op if isinstance(op, ExternKernel) else op
    if reason is None and "nondeterministic_seeded" in _op_tags(name):
        if not isinstance(op, ExternKernel) or _draws_random_numbers(op):
            return f"{name} draws random numbers, which a replay would repeat"
    return reason


def kernel_device(kernel: KernelDefinition) -> torch.device:
    """The device a kernel runs on: its metadata's "device", else the usual one for its language."""
    for key, value in kernel.metadata:
        if key == "device":
            return torch.device(str(value))
    return torch.device("cuda" if kernel.language == "triton" else "cpu")


@dataclass
class CaptureContext:
    """What deciding capturability needs beyond a line: every name's type, each kernel's device,
    the symbols read from tensor data, and the names whose size is read on the host."""

    types: dict[str, object]
    kernels: dict[str, torch.device]
    data_symbols: set[sympy.Symbol]
    host_sized: set[str]
    op_blocker: Callable[[ExternKernel], str | None] = op_blocker

    @staticmethod
    def of(program, blocker: Callable[[ExternKernel], str | None] | None = None) -> CaptureContext:
        inputs = set(program.input_names())
        kernels = {line.name: kernel_device(line) for line in program.lines if isinstance(line, KernelDefinition)}
        data: set[sympy.Symbol] = set()
        host_sized: set[str] = set()
        for line in program.lines:
            if isinstance(line, BindSymbol):
                if line.kind == "item":
                    data.add(line.symbol)
                elif line.kind in ("size", "stride", "offset") and line.source not in inputs:
                    data.add(line.symbol)
                    host_sized.add(line.source)
            elif isinstance(line, SymbolicCallArg) and line.expr.free_symbols & data:
                data.add(line.symbol)
        return CaptureContext(program.value_types(), kernels, data, host_sized, blocker or op_blocker)


_HOST_LINES: dict[type, str] = {
    BindSymbol: "binds a size symbol on the host",
    SymbolicCallArg: "computes a symbol on the host",
    AssertInput: "checks an input on the host",
    AssertScalar: "checks an input on the host",
    AssertFinite: "reads tensor data on the host",
    Output: "returns the program's results",
    CollectiveStart: "collectives are not recorded",
    CollectiveWait: "collectives are not recorded",
    GraphBegin: "graph regions do not nest",
    GraphEnd: "graph regions do not nest",
}
# Lines with no work of their own: they go with whatever surrounds them.
NEUTRAL_LINES = (Comment, KernelDefinition, Free)


def _device_of(type_: object) -> torch.device | None:
    return type_.device if isinstance(type_, TensorType) else None


def same_device(a: torch.device | None, b: torch.device | None) -> bool:
    """`cuda` and `cuda:0` are one device here (kernels name the type, buffers the index)."""
    if a is None or b is None:
        return a is b
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _result_devices(result: object) -> list[torch.device | None]:
    """The devices of a result's tensors. A tuple's untyped entries (flash and cuDNN attention's
    SymInts and undefined tensors) are never picked, so they do not keep the call out of a graph."""
    if isinstance(result, tuple):
        return [d for r in result if r is not None for d in _result_devices(r)]
    return [_device_of(result)]


def line_blocker(line: WrapperLine, ctx: CaptureContext, device: torch.device) -> str | None:
    """Why `line`, taken on its own, cannot be recorded in a graph on `device`; None if it can."""
    if isinstance(line, NEUTRAL_LINES):
        return None
    if type(line) in _HOST_LINES:
        item = isinstance(line, BindSymbol) and line.kind == "item"
        return "reads tensor data on the host (.item())" if item else _HOST_LINES[type(line)]
    data = sorted(str(s) for s in line.symbols_used() & ctx.data_symbols)
    if data:
        return f"uses {', '.join(data)}, read from tensor data (a data-dependent size)"
    sized = [name for name in line.defines() if name in ctx.host_sized]
    if sized:
        return f"defines {sized[0]}, whose size is read on the host (a data-dependent size)"
    if isinstance(line, (Allocate, ReuseBuffer, AllocateFromPool, MultiOutput)):
        where = line.type.device
    elif isinstance(line, Reinterpret) or type(line).__name__ == "EnsureStrides":
        where = line.device
    elif isinstance(line, KernelCall) or hasattr(line, "candidates"):
        calls = line.candidates if hasattr(line, "candidates") else (line,)
        for call in calls:
            where = ctx.kernels.get(call.kernel)
            if not same_device(where, device):
                return f"launches kernel {call.kernel} on {where}"
        return None
    elif isinstance(line, ExternKernel):
        reason = ctx.op_blocker(line)
        if reason is not None:
            return reason
        if line.name is not None and line.result is None:
            return f"{line.op} returns a result of unknown type (an allocation of unknown size)"
        for where in _result_devices(line.result) if line.name is not None else []:
            if not same_device(where, device):
                return f"{line.op} returns a result on {where}"
        return None
    else:
        return f"{type(line).__name__} lines are not known to be capturable"
    return None if same_device(where, device) else f"works on {where}"


def root_of(roots: dict[str, str], line: WrapperLine, name: str) -> str:
    """The storage `name` (defined by `line`) views: its source's root for views, else itself."""
    source = None
    if isinstance(line, (Reinterpret, MultiOutput)):
        source = line.source
    elif isinstance(line, ExternKernel):
        source = line.alias_of
    return roots.get(source, source) if source is not None else name


def written_names(line: WrapperLine) -> tuple[str, ...]:
    return tuple(getattr(line, "writes", ()))


def region_blocker(line: WrapperLine, graph: str, born: set[str], roots: dict[str, str], in_place_roots: set[str]) -> str | None:
    """Why `line` cannot join region `graph`, given the names the region defined so far (`born`):
    it would write an input the region copies (the caller would not see the write), re-lay
    out (`EnsureStrides`) a name defined outside (the new tensor would stay inside), or pick
    from a tuple defined outside (a graph's inputs are tensors: the pick stays with the tuple,
    and the tensor it picks crosses instead)."""
    if type(line).__name__ == "EnsureStrides" and line.name not in born:
        return f"re-lays out {line.name}, which graph {graph} does not define"
    if isinstance(line, MultiOutput) and line.source not in born:
        return f"picks from {line.source}, a tuple graph {graph} does not define"
    for name in written_names(line):
        root = roots.get(name, name)
        if root not in born and root not in in_place_roots:
            return f"writes {name}, an input graph {graph} copies (a write the caller would not see)"
    return None


@dataclass
class GraphScope:
    """The verifier's view of graph regions: the open one, and what each closed one kept private."""

    ctx: CaptureContext
    open: tuple[int, GraphBegin] | None = None
    local: set[str] = field(default_factory=set)  # live names the open region defined
    born: set[str] = field(default_factory=set)  # every name the open region defined
    roots: dict[str, str] = field(default_factory=dict)
    in_place_roots: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    private: dict[str, str] = field(default_factory=dict)  # name -> graph that defines but does not return it

    def check(self, line: WrapperLine) -> None:
        """Raise ValueError when `line` breaks a graph region (before it is applied)."""
        for name in (*line.uses(), *line.frees()):
            if name in self.private and name not in self.local:
                raise ValueError(f"uses {name}, which graph {self.private[name]} defines but does not list as an output")
        if isinstance(line, GraphBegin):
            if self.open is not None:
                raise ValueError(f"graph regions do not nest: graph {self.open[1].graph} (line {self.open[0]}) is open")
            if line.graph in self.names:
                raise ValueError(f"graph {line.graph} is defined twice")
            tuples = [name for name in line.inputs if isinstance(self.ctx.types.get(name), tuple)]
            if tuples:  # a target binds and copies each input as one tensor
                raise ValueError(f"lists {tuples[0]}, a tuple result, as an input (a graph's inputs are tensors)")
            return
        if self.open is None:
            if isinstance(line, GraphEnd):
                raise ValueError(f"ends graph {line.graph}, which is not open")
            return
        number, begin = self.open
        if isinstance(line, GraphEnd):
            if line.graph != begin.graph:
                raise ValueError(f"ends graph {line.graph}, but graph {begin.graph} (line {number}) is open")
            missing = [name for name in line.outputs if name not in self.local]
            if missing:
                raise ValueError(f"lists {', '.join(missing)} as outputs, which the region does not define")
            return
        if isinstance(line, Output):
            raise ValueError(f"the program ends inside graph {begin.graph} (opened at line {number})")
        reason = line_blocker(line, self.ctx, begin.device)
        if reason is not None:
            raise ValueError(f"cannot be recorded in graph {begin.graph}: {reason}")
        outside = [name for name in line.uses() if name not in self.local and name not in begin.inputs]
        if outside:
            raise ValueError(f"reads {outside[0]}, which graph {begin.graph} does not list as an input")
        keyless = sorted(str(s) for s in line.symbols_used() if s not in begin.key)
        if keyless:
            raise ValueError(f"uses {', '.join(keyless)}, which graph {begin.graph} does not list in its key")
        reason = region_blocker(line, begin.graph, self.born, self.roots, self.in_place_roots)
        if reason is not None:
            raise ValueError(f"cannot be recorded in graph {begin.graph}: {reason}")

    def apply(self, line: WrapperLine, number: int) -> None:
        for name in line.defines():
            self.roots[name] = root_of(self.roots, line, name)
            self.private.pop(name, None)
        if isinstance(line, GraphBegin):
            self.open = (number, line)
            self.names.add(line.graph)
            self.local, self.born = set(), set()
            self.in_place_roots = {self.roots.get(name, name) for name in line.in_place}
        elif isinstance(line, GraphEnd):
            for name in self.local - set(line.outputs):
                self.private[name] = line.graph
            self.open = None
            self.local, self.born = set(), set()
        elif self.open is not None:
            self.local.update(line.defines())
            self.born.update(line.defines())
            self.local.difference_update(line.frees())


__all__ = [
    "UNCAPTURABLE_OPS",
    "CaptureContext",
    "GraphBegin",
    "GraphEnd",
    "GraphScope",
    "line_blocker",
    "region_blocker",
    "op_blocker",
    "seeded_op_blocker",
]
