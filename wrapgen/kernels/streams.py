"""Streams that CUDA-graph work runs on, and cuBLAS's workspaces, which graphs depend on.

cuBLAS keeps a workspace per stream (32 MiB on Hopper), made on the stream's first matmul and
owned by PyTorch; a recorded matmul writes into the workspace its stream had when it was
recorded. PyTorch frees workspaces behind a graph's back: `torch._C._cuda_clearCublasWorkspaces()`
frees all of them (torch.compile's reduce-overhead calls it whenever it records), and from
torch 2.13 destroying a `CUDAGraph` frees the one of the stream it was recorded on. So:
- a python program records on a stream of its own (`GraphPool.stream`), with the workspaces
  cleared around each recording, so the workspace it records is made inside its own graph
  memory pool and lives as long as the pool (no one else's clear can free it for reuse);
- C++ models loaded in this process record on `capture_stream` (one per device and process,
  on which nothing records through `torch.cuda.graph`, so no graph's destruction clears it):
  their recordings share its workspace, and `on_workspaces_cleared` tells them when a clear
  freed it, so they record again instead of replaying into freed memory.
Whoever puts work on a capture stream outside a replay holds `recording_lock` meanwhile: a
recording captures everything queued on its stream, so a recording and other work from two
threads must not interleave there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

recording_lock = threading.RLock()
_capture_streams: dict[int, torch.cuda.Stream] = {}
_cleared_listeners: dict[str, Callable[[], None]] = {}


def capture_stream(device: torch.device | str | int) -> torch.cuda.Stream:
    """The stream C++ models loaded in this process warm up and record their graphs on, per device."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
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
    """Free cuBLAS's workspaces (every stream's), telling `on_workspaces_cleared` listeners first."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def on_workspaces_cleared(name: str, listener: Callable[[], None]) -> None:
    """Call `listener` (once per `name`) before any clear of cuBLAS's workspaces in this process.

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

            clear_cublas_workspaces.wrapgen_tells_listeners = True  # type: ignore[attr-defined]
            torch._C._cuda_clearCublasWorkspaces = clear_cublas_workspaces
        _cleared_listeners[name] = listener


__all__ = ["capture_stream", "clear_library_workspaces", "on_stream", "on_workspaces_cleared", "recording_lock"]
