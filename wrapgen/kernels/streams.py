"""CUDA-graph recording streams, and cuBLAS's workspaces, which recorded graphs depend on.

cuBLAS keeps a workspace per stream (32 MiB on Hopper), made on the stream's first matmul and
owned by PyTorch; a recorded matmul writes into the workspace its stream had when it was
recorded. PyTorch frees workspaces behind a graph's back: `torch._C._cuda_clearCublasWorkspaces()`
frees all of them (torch.compile's reduce-overhead calls it whenever it records), and from
torch 2.13 destroying a `CUDAGraph` frees the one of the stream it was recorded on (every python
program records on one stream per device, `capture_stream`). So:
- a python program records a region with library calls between two clears of the workspaces
  (`clear_library_workspaces`), so the workspace it records is made inside its own graph
  memory pool while it records: pool memory like any intermediate, which no clear elsewhere
  can hand to someone else;
- a C++ model records on a stream of its own that it makes with the driver (no
  `torch.cuda.graph` ever records there), and is told of every clear made through Python
  (`on_workspaces_cleared`), so it records again instead of replaying into freed memory.
Warm-ups and recordings hold `recording_lock`: a recording captures everything queued on its
stream, so a recording and other work from two threads must not interleave there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

recording_lock = threading.RLock()
_cleared_listeners: dict[str, Callable[[], None]] = {}
_capture_streams: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream per device on which every python program warms up and records its graphs.

    One, not one per program: on the H100 (driver 580), a recording on a third distinct stream in
    a process slows every graph replay in that process by about 0.18 µs per graph node (10% on a
    decoder at batch 1), even after those graphs are gone (`benchmarks/results/*graph-streams*`)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with recording_lock:
        if index not in _capture_streams:
            _capture_streams[index] = torch.cuda.Stream(device=index)
        return _capture_streams[index]


@contextmanager
def on_stream(stream: torch.cuda.Stream) -> Iterator[torch.cuda.Stream]:
    """Run the block's device work on `stream` (holding `recording_lock`), after the caller's
    queued work; the caller's later work waits for it."""
    with recording_lock:
        caller = torch.cuda.current_stream(stream.device)
        stream.wait_stream(caller)
        try:
            with torch.cuda.stream(stream):
                yield stream
        finally:
            caller.wait_stream(stream)


def clear_library_workspaces() -> None:
    """Free cuBLAS's workspaces (every stream's), telling `on_workspaces_cleared` listeners."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def on_workspaces_cleared(name: str, listener: Callable[[], None]) -> None:
    """Call `listener` (registered once per `name`) before and after each clear of cuBLAS's
    workspaces in this process.

    Clears come through `torch._C._cuda_clearCublasWorkspaces`, which this wraps once."""
    with recording_lock:
        original = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if original is None:
            return
        if not getattr(original, "wrapgen_tells_listeners", False):

            def clear_cublas_workspaces() -> None:
                for tell in tuple(_cleared_listeners.values()):
                    tell()
                original()
                for tell in tuple(_cleared_listeners.values()):  # and a recording that began meanwhile
                    tell()

            clear_cublas_workspaces.wrapgen_tells_listeners = True  # type: ignore[attr-defined]
            torch._C._cuda_clearCublasWorkspaces = clear_cublas_workspaces
        _cleared_listeners[name] = listener


__all__ = ["capture_stream", "clear_library_workspaces", "on_stream", "on_workspaces_cleared", "recording_lock"]
