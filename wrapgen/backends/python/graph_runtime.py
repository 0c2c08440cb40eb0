"""Run time of the Python target's CUDA-graph regions (`GraphBegin` ... `GraphEnd` lines): warm
up, record, replay.

A region is emitted as a function of its inputs and key symbols; `GraphRegion` calls it:
- the first call with a new key (the key symbols' values and the layouts of copied inputs) runs
  it eagerly: the warm-up, which loads kernels and lets library calls set themselves up. It
  runs on the stream every python program records on (`streams.capture_stream`, one per device);
- the second records it with `torch.cuda.graph` on that stream into the program's one memory
  pool (`GraphPool`), then replays; later calls copy the copied inputs into the static buffers
  the graph reads and replay it. Inputs used in place (constants, parameters, outputs of earlier
  graphs) are checked by address: a changed address records the graph again, never replays
  a stale one. A region with library calls is recorded between two clears of cuBLAS's
  workspaces (see `wrapgen.kernels.streams`): the workspace its matmuls write is made inside
  the pool while it records, so it is pool memory like any intermediate, which no clear
  elsewhere in the process can hand to someone else;
- at most `MAX_GRAPHS` graphs per region are kept (least recently used dropped); a region that
  records more than `MAX_RECORDS` times (addresses that never settle) runs eagerly from then on.

One pool serves every graph of a program. A replay writes its intermediates into pool memory
that graphs recorded earlier may have handed out as outputs, so a graph may run in a call only
after every graph that ran before it in that call was recorded before it (its `generation`);
otherwise it is recorded again. The steady state (the same sequence of keys every call) records
each graph once. Outputs of a program that live in graph memory are copied out before `return`
(the partition pass adds those lines), so a returned tensor is never overwritten by a later call.
A call on another stream than the last call's first waits for that stream's queued work.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from wrapgen.kernels.streams import capture_stream, clear_library_workspaces, on_stream, recording_lock

MAX_GRAPHS = 8
MAX_RECORDS = 64

# torch's C++ check of many data pointers at once (CUDA builds); a Python loop elsewhere.
_same_pointers = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


class GraphPool:
    """The memory pool the graphs of one program share, and the order they were recorded in."""

    def __init__(self) -> None:
        self._handle = None
        self.generation = 0  # of the last graph recorded
        self.last = 0  # generation of the last graph replayed in the current call
        self._last_run: tuple[int, torch.cuda.Stream] | None = None  # (raw handle, stream) of the last call

    def follow_last_call(self, device: torch.device) -> None:
        """Order this call after the last one when it runs on another stream: both use the same
        static buffers and pool memory, so a replay on a second stream must not start while the
        first stream's replay still reads them. The same stream (the usual case) costs one query."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        raw = torch._C._cuda_getCurrentRawStream(index)
        if self._last_run is not None and self._last_run[0] == raw:
            return
        current = torch.cuda.current_stream(index)
        if self._last_run is not None:
            current.wait_stream(self._last_run[1])
        self._last_run = (raw, current)

    def handle(self):
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle


@dataclass
class _Graph:
    graph: object  # torch.cuda.CUDAGraph
    copies: list[tuple[int, torch.Tensor, bool]]  # (input index, static buffer, copy its whole span)
    pointers: list[int | None]  # data pointers of the in-place inputs, by input index
    outputs: tuple
    generation: int


def _static_buffer(t: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """(the tensor the graph reads, what each replay copies into, whether that is the flat span).

    Same sizes and strides as `t`, on the graph's device (attention's philox seed and offset
    come from the host in eager: the graph reads them from device memory, refreshed each
    replay): a dense layout gets an elementwise copy, any other (gaps, overlapping dims) a copy
    of the storage span it covers, so the graph sees the same bytes."""
    if t.numel() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device), None, False
    span = 1 + sum((n - 1) * s for n, s in zip(t.size(), t.stride()))
    if span == t.numel():
        static = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        return static, static, False
    base = torch.empty((span,), dtype=t.dtype, device=device)
    return base.as_strided(t.size(), t.stride(), 0), base, True


class GraphRegion:
    """One graph region of a program: its function, its recorded graphs, and how it is called."""

    def __init__(
        self,
        name: str,
        fn: Callable,
        device: str,
        num_inputs: int,
        in_place: Sequence[int],
        pool: GraphPool,
        first: bool,
        library_calls: bool = True,
    ) -> None:
        self.name = name
        self.fn = fn
        self.device = torch.device(device)
        self.capture = self.device.type == "cuda"
        self.in_place = list(in_place)
        self.copied = [i for i in range(num_inputs) if i not in set(in_place)]
        self.pool = pool
        self.first = first
        self.library_calls = library_calls  # false: no cuBLAS workspace to clear around recording
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.warm: set[tuple] = set()
        self.records = 0
        self.replays = 0
        self.eager = not self.capture

    def __call__(self, inputs: tuple, key: tuple) -> tuple:
        if self.first:
            self.pool.last = 0
            if self.device.type == "cuda":
                self.pool.follow_last_call(self.device)
        if self.eager:
            return self.fn(*inputs, *key)
        full = (key, tuple(inputs[i].stride() for i in self.copied))
        graph = self.graphs.get(full)
        if graph is not None and (graph.generation < self.pool.last or not self._same_addresses(graph, inputs)):
            del self.graphs[full]  # recorded before a graph that already ran in this call, or stale addresses
            graph = None
        if graph is None:
            if full not in self.warm:
                if len(self.warm) > 4 * MAX_RECORDS:
                    self.warm.clear()
                self.warm.add(full)
                return self._warm_up(inputs, key)
            graph = self._record(full, inputs, key)
            if graph is None:
                return self.fn(*inputs, *key)
        else:
            self.graphs.move_to_end(full)
        if graph.copies:
            sources = [inputs[index] if not flat else
                       inputs[index].as_strided((static.numel(),), (1,), inputs[index].storage_offset())
                       for index, static, flat in graph.copies]
            # one multi-tensor copy: a compiled optimizer step copies in 148 gradients, which
            # one by one cost 4 us of host time and a 3.6 us copy node each
            torch._foreach_copy_([static for _, static, _ in graph.copies], sources)
        graph.graph.replay()
        self.replays += 1
        self.pool.last = graph.generation
        return graph.outputs

    def _warm_up(self, inputs: tuple, key: tuple) -> tuple:
        """Run the region eagerly on the program's recording stream, after the caller's queued
        work: library calls set up per-stream state (cuBLAS's 32 MiB workspace) for that stream,
        which recording frees again, and not for the caller's, where a fully recorded program
        would keep it for nothing."""
        if self.device.type != "cuda":
            return self.fn(*inputs, *key)
        with on_stream(capture_stream(self.device)):
            outputs = self.fn(*inputs, *key)
        caller = torch.cuda.current_stream(self.device)
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                t.record_stream(caller)  # made on the capture stream, used on the caller's
        return outputs

    def _same_addresses(self, graph: _Graph, inputs: tuple) -> bool:
        if not self.in_place:
            return True
        if _same_pointers is not None:
            return _same_pointers(list(inputs), graph.pointers, self.in_place)
        return all(inputs[i].data_ptr() == graph.pointers[i] for i in self.in_place)

    def _record(self, full: tuple, inputs: tuple, key: tuple) -> _Graph | None:
        self.records += 1
        if self.records > MAX_RECORDS:
            warnings.warn(
                f"CUDA graph {self.name} was recorded {MAX_RECORDS} times (input addresses or sizes keep "
                "changing); it runs without a graph from now on",
                stacklevel=3,
            )
            self.eager = True
            self.graphs.clear()
            return None
        statics = list(inputs)
        copies = []
        for index in self.copied:
            static, target, flat = _static_buffer(inputs[index], self.device)
            statics[index] = static
            if target is not None:
                copies.append((index, target, flat))
        pointers: list[int | None] = [None] * len(inputs)
        for index in self.in_place:
            pointers[index] = inputs[index].data_ptr()
        try:
            with recording_lock:  # nothing else may queue work on the stream while it records
                graph, outputs = self._capture(statics, key)
        except Exception as error:  # noqa: BLE001 - any failure: run without a graph, say why
            warnings.warn(f"CUDA graph {self.name} could not be recorded ({error}); it runs without a graph", stacklevel=3)
            self.eager = True
            self.graphs.clear()
            return None
        self.pool.generation += 1
        recorded = _Graph(graph, copies, pointers, tuple(outputs), self.pool.generation)
        self.graphs[full] = recorded
        while len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        return recorded

    def _capture(self, statics: list, key: tuple) -> tuple[object, tuple]:
        """Record the region on `statics`: (the graph, with `replay()`, and its output tensors)."""
        graph = torch.cuda.CUDAGraph()
        recording = torch.cuda.graph(graph, pool=self.pool.handle(), stream=capture_stream(self.device),
                                     capture_error_mode="thread_local")
        if self.library_calls:  # the workspace the graph records is then made in its pool
            clear_library_workspaces()
        try:
            with recording:
                outputs = self.fn(*statics, *key)
        finally:
            if self.library_calls:  # not left in use outside the graph
                clear_library_workspaces()
        return graph, tuple(outputs)

    def __repr__(self) -> str:
        return f"GraphRegion({self.name!r}, graphs={len(self.graphs)}, records={self.records}, replays={self.replays})"


__all__ = ["MAX_GRAPHS", "MAX_RECORDS", "GraphPool", "GraphRegion"]
