"""The C++ target's CUDA-graph regions (`GraphBegin` ... `GraphEnd`), run through
`cpp_runtime/include/wrapgen/cuda_graphs.h`:

    wrapgen::Tensor t_buf5;                      // the region's outputs, declared outside it
    {
      static auto* wg_region_g0 = new wrapgen::graphs::Region();
      wrapgen::graphs::Call wg_g0(*wg_graphs, *wg_region_g0, 0, true, true);
      wg_g0.key({s0}); wg_g0.input(t_x, false); wg_g0.input(t_w, true);
      if (wg_g0.replay()) {
        t_buf5 = wg_g0.output(0);
      } else {
        wrapgen::Tensor t_x = wg_g0.bind(0);  ...  // the region's lines read these
        wg_g0.begin_body();
        ...                                        // the region's lines; frees become release()
        wg_g0.end_body({&t_buf5}, {...});
      }
    }

The runtime objects are never destroyed (a library's static destructors may run after
libtorch's at exit). A mixin of `CppEmitter`; random library ops stay out of C++ graphs (the
generator's offset would not advance between replays: `seeded_op_blocker`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wrapgen.wrapper_ir.graphs import GraphBegin, GraphEnd, seeded_op_blocker
from wrapgen.wrapper_ir.lines import ExternKernel, Free, WrapperLine
from wrapgen.wrapper_ir.program import Program

HEADER = "wrapgen/cuda_graphs.h"
# shim functions cuda_graphs.h calls
GRAPH_SHIMS = (
    "aoti_torch_copy_",
    "aoti_torch__reinterpret_tensor",
    "aoti_torch_empty_strided",
    "aoti_torch_get_data_ptr",
    "aoti_torch_get_dtype",
    "aoti_torch_get_dim",
    "aoti_torch_get_size",
    "aoti_torch_get_sizes",
    "aoti_torch_get_stride",
    "aoti_torch_get_device_type",
    "aoti_torch_get_device_index",
    "aoti_torch_dtype_element_size",
    "aoti_torch_device_type_cuda",
    "aoti_torch_delete_tensor_object",
    "aoti_torch_new_tensor_handle",
)
CUDA_GRAPH_SHIMS = ("aoti_torch_create_cuda_stream_guard", "aoti_torch_delete_cuda_stream_guard", "aoti_torch_get_current_cuda_stream")


@dataclass
class _OpenRegion:
    begin: GraphBegin
    saved: tuple
    local: list[str] = field(default_factory=list)
    deferred: list[Free] = field(default_factory=list)


class CppGraphRegions:
    """`emit_graph_begin` / `emit_graph_end` for an emitter with CppEmitter's state."""

    # which library ops a C++ graph may hold (the partition pass asks the target: api.optimize)
    cuda_graph_op_blocker = staticmethod(seeded_op_blocker)

    def emit(self, program: Program):
        self._open_region: _OpenRegion | None = None
        self._graph_run_guard = False
        return super().emit(program)  # type: ignore[misc]

    def dispatch(self, line: WrapperLine) -> None:
        region = self._open_region
        if region is None or isinstance(line, GraphEnd):
            super().dispatch(line)  # type: ignore[misc]
            return
        if isinstance(line, ExternKernel):
            reason = seeded_op_blocker(line)
            if reason is not None:
                raise self.refuse(line, f"cannot be recorded in a C++ graph: {reason}")  # type: ignore[attr-defined]
        if isinstance(line, Free):
            if line.name not in region.local:
                region.deferred.append(line)  # an input's free: after the region, in the outer scope
                return
            region.local.remove(line.name)
            self.writeline(f"wg_{region.begin.graph}.release(t_{line.name});")  # type: ignore[attr-defined]
            for (pool, _), view in self.pool_views.items():  # type: ignore[attr-defined]
                if pool == line.name:
                    self.writeline(f"{view}.reset();")  # type: ignore[attr-defined]
            return
        super().dispatch(line)  # type: ignore[misc]
        region.local += [name for name in line.defines() if name not in region.local]

    def emit_graph_begin(self, line: GraphBegin) -> None:
        graph = line.graph
        for symbol in line.key:
            if not symbol.is_integer:
                raise self.refuse(line, f"key symbol {symbol} is not an integer")  # type: ignore[attr-defined]
        for name in line.inputs:  # a tuple is a wrapgen::Value: Call::input and bind take tensors
            if not self._is_tensor_name(name):  # type: ignore[attr-defined]
                raise self.refuse(line, f"input {name} is a tuple result; a graph's inputs are tensors")  # type: ignore[attr-defined]
        self.headers.add(HEADER)  # type: ignore[attr-defined]
        self.use_shim(*GRAPH_SHIMS)  # type: ignore[attr-defined]
        if line.device.type == "cuda":
            self.use_shim(*CUDA_GRAPH_SHIMS)  # type: ignore[attr-defined]
        write = self.writeline  # type: ignore[attr-defined]
        device = line.device.index or 0
        first = not self._graph_run_guard
        if first:
            write("static auto* wg_graphs = new wrapgen::graphs::Program();")
            write(f"wrapgen::graphs::RunGuard wg_graph_run(*wg_graphs, {device});")
            self._graph_run_guard = True
        outputs = self._region_outputs(line)
        for name in outputs:
            if name not in self.declared:  # type: ignore[attr-defined]
                write(f"wrapgen::Tensor t_{name};")
                self.declared.add(name)  # type: ignore[attr-defined]
        cuda = "true" if line.device.type == "cuda" else "false"
        write(f"{{  // graph {graph}")
        write(f"static auto* wg_region_{graph} = new wrapgen::graphs::Region();")
        write(f"wrapgen::graphs::Call wg_{graph}(*wg_graphs, *wg_region_{graph}, {device}, {'true' if first else 'false'}, {cuda});")
        if line.key:
            write(f"wg_{graph}.key({{{', '.join(f'static_cast<int64_t>({s})' for s in line.key)}}});")
        for name in line.inputs:
            write(f"wg_{graph}.input(t_{name}, {'true' if name in line.in_place else 'false'});")
        write(f"if (wg_{graph}.replay()) {{")
        for number, name in enumerate(outputs):
            write(f"  t_{name} = wg_{graph}.output({number});")
        write("} else {")
        for number, name in enumerate(line.inputs):
            write(f"wrapgen::Tensor t_{name} = wg_{graph}.bind({number});")
        write(f"wg_{graph}.begin_body();")
        saved = (set(self.declared), set(self.launch_prologues), dict(self.pool_views))  # type: ignore[attr-defined]
        self.launch_prologues = set()  # the body reads the (capture) stream itself
        self.pool_views = {}
        self._open_region = _OpenRegion(line, saved)

    def _region_outputs(self, begin: GraphBegin) -> tuple[str, ...]:
        lines = self.program.lines  # type: ignore[attr-defined]
        start = self.line_number  # type: ignore[attr-defined]
        for later in lines[start:]:
            if isinstance(later, GraphEnd) and later.graph == begin.graph:
                return later.outputs
        raise self.refuse(begin, "no matching graph end")  # type: ignore[attr-defined]

    def emit_graph_end(self, line: GraphEnd) -> None:
        region = self._open_region
        assert region is not None and region.begin.graph == line.graph
        write = self.writeline  # type: ignore[attr-defined]
        outputs = ", ".join(f"&t_{name}" for name in line.outputs)
        live = ", ".join(
            f"&t_{name}" for name in region.local if name not in line.outputs and self._is_tensor_name(name)  # type: ignore[attr-defined]
        )
        for name in region.local:
            if name not in line.outputs and not self._is_tensor_name(name):  # type: ignore[attr-defined]
                write(f"wg_{line.graph}.release(t_{name});")  # a tuple result: its tensors stay with the graph
        write(f"wg_{line.graph}.end_body({{{outputs}}}, {{{live}}});")
        write("}")
        write(f"}}  // graph {line.graph}")
        declared, self.launch_prologues, self.pool_views = region.saved
        self.declared = declared | set(line.outputs)
        self._open_region = None
        for free in region.deferred:
            self.emit_free(free)  # type: ignore[attr-defined]


__all__ = ["HEADER", "CppGraphRegions"]
