"""The CUDA stream that graph work runs on: one per device and process, shared by every program.

cuBLAS keeps a workspace per stream (32 MiB on Hopper), made on the stream's first matmul. A
program with CUDA graphs warms up and records on this stream, so the workspace is made once,
for it; the GEMM autotuner measures the library call on it too when the program it compiles
will use graphs, and C++ models loaded in this process record on it as well (`CppModel`).
Whoever puts work on the stream outside a replay holds `recording_lock` meanwhile: a
recording captures everything queued on its stream, so two recordings (or a recording and a
warm-up) from two threads must not interleave there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

recording_lock = threading.RLock()
_capture_streams: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device | str | int) -> torch.cuda.Stream:
    """The stream every program in this process warms up and records its graphs on, per device."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    with recording_lock:
        if index not in _capture_streams:
            _capture_streams[index] = torch.cuda.Stream(device=index)
        return _capture_streams[index]


@contextmanager
def on_capture_stream(device: torch.device | str) -> Iterator[torch.cuda.Stream]:
    """Run the block's device work on the capture stream (holding `recording_lock`), after the
    caller's queued work; the caller's later work waits for it."""
    with recording_lock:
        stream = capture_stream(device)
        caller = torch.cuda.current_stream(stream.device)
        stream.wait_stream(caller)
        try:
            with torch.cuda.stream(stream):
                yield stream
        finally:
            caller.wait_stream(stream)


__all__ = ["capture_stream", "on_capture_stream", "recording_lock"]
