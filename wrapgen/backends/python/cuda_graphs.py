"""The Python target's CUDA-graph regions: each `GraphBegin` ... `GraphEnd` becomes a module-level
function of the region's inputs and key symbols, called through a `GraphRegion`
(`graph_runtime.py`) that warms it up, records it and replays it:

    buf5, buf7, = _graph_g0((arg0_1, buf1, w), (s0,))

A mixin of `PythonEmitter`: the region's lines are emitted by the emitter's own methods into the
function's body instead of `call`'s. Frees of names defined outside the region happen after
the call (the function only drops its own reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.graphs import GraphBegin, GraphEnd
from wrapgen.wrapper_ir.lines import ExternKernel, Free, WrapperLine
from wrapgen.wrapper_ir.program import Program


@dataclass
class _OpenRegion:
    begin: GraphBegin
    saved: tuple
    local: set[str] = field(default_factory=set)
    deferred: list[Free] = field(default_factory=list)
    library_calls: bool = False  # an ExternKernel inside: cuBLAS may need its workspace


class PythonGraphRegions:
    """`emit_graph_begin` / `emit_graph_end` for an emitter with PythonEmitter's state."""

    def emit(self, program: Program):
        self._graph_functions: list[list[str]] = []
        self._graph_regions: list[tuple[GraphBegin, bool]] = []  # (region, holds a library call)
        self._open_region: _OpenRegion | None = None
        return super().emit(program)  # type: ignore[misc]

    def dispatch(self, line: WrapperLine) -> None:
        region = self._open_region
        if region is not None and not isinstance(line, GraphEnd):
            if isinstance(line, Free) and line.name not in region.local:
                region.deferred.append(line)
                return
            region.local.update(line.defines())
            region.local.difference_update(line.frees())
            region.library_calls |= isinstance(line, ExternKernel)
        super().dispatch(line)  # type: ignore[misc]

    def emit_graph_begin(self, line: GraphBegin) -> None:
        for name in line.inputs:  # GraphRegion takes the stride and address of each input
            if isinstance(self.types.get(name), tuple):  # type: ignore[attr-defined]
                raise UnsupportedLineError(
                    f"{type(self).__name__} cannot emit line {self.line_number} ({line.format()}): "  # type: ignore[attr-defined]
                    f"input {name} is a tuple result; a graph's inputs are tensors"
                )
        self._open_region = _OpenRegion(line, (self.body, self.depth, self.call_prologues, self.pool_views))
        self.body, self.depth, self.call_prologues, self.pool_views = [], 1, set(), {}

    def emit_graph_end(self, line: GraphEnd) -> None:
        region = self._open_region
        assert region is not None and region.begin.graph == line.graph
        begin = region.begin
        outputs = ", ".join(line.outputs) + ("," if len(line.outputs) == 1 else "")
        self.writeline(f"return ({outputs})")
        params = ", ".join([*begin.inputs, *(str(s) for s in begin.key)])
        self._graph_functions.append([f"def _region_{line.graph}({params}):", *self.body])
        self._graph_regions.append((begin, region.library_calls))
        self.body, self.depth, self.call_prologues, self.pool_views = region.saved
        self._open_region = None
        inputs = ", ".join(begin.inputs) + ("," if len(begin.inputs) == 1 else "")
        key = ", ".join(str(s) for s in begin.key) + ("," if len(begin.key) == 1 else "")
        call = f"_graph_{line.graph}(({inputs}), ({key}))"
        self.writeline(f"{', '.join(line.outputs)}, = {call}" if line.outputs else call)
        for free in region.deferred:
            self.emit_free(free)  # type: ignore[attr-defined]

    def graph_source(self) -> list[str]:
        """Module-level code after `call`: the region functions and their GraphRegions."""
        if not self._graph_regions:
            return []
        lines = ["from wrapgen.backends.python.graph_runtime import GraphPool, GraphRegion", "", "_graph_pool = GraphPool()", "", ""]
        for function in self._graph_functions:
            lines += [*function, "", ""]
        for number, (begin, library_calls) in enumerate(self._graph_regions):
            in_place = tuple(begin.inputs.index(name) for name in begin.in_place)
            lines.append(
                f"_graph_{begin.graph} = GraphRegion({begin.graph!r}, _region_{begin.graph}, {str(begin.device)!r}, "
                f"{len(begin.inputs)}, {in_place!r}, _graph_pool, first={number == 0}, "
                f"library_calls={library_calls})"
            )
        return [*lines, "", ""]


__all__ = ["PythonGraphRegions"]
