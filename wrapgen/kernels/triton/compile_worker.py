"""A Triton compile worker, started as its own program:

    python -m wrapgen.kernels.triton.compile_worker

It is not a multiprocessing child: "spawn" imports the parent's `__main__` in every worker,
so a user's script without an `if __name__ == "__main__":` guard ran its whole body again
in each one (16 workers: 16 extra runs of a benchmark). Started this way, a worker imports
only wrapgen, torch and Triton; it never sees the user's script.

Protocol, on the worker's stdin and stdout: length-prefixed pickles (both ends are wrapgen,
run by the same user). The worker first sends `("ready", pid)`; then for each request
it calls `compat.warm_cache_in_subprocess(*args)` and answers `(key, None)`,
or `(key, traceback text)` when that raised. End of input ends the worker, so a worker
whose parent died exits too. A request is `(key, args, settings)`: `settings` are environment
variables (the Triton cache directory) set before the compile, so one worker serves
compiles into whichever cache the parent reads at the time.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import traceback
from typing import BinaryIO

_HEADER = struct.Struct("<Q")


def write_message(stream: BinaryIO, message: object) -> None:
    """Send one message: its pickled size, then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    """`size` bytes from `stream`; EOFError when it ends first (the other side is gone)."""
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the other end of the compile-worker pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_message(stream: BinaryIO) -> object:
    """Receive one message written by `write_message`."""
    (size,) = _HEADER.unpack(read_exactly(stream, _HEADER.size))
    return pickle.loads(read_exactly(stream, size))


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer requests until the parent closes `requests`."""
    from wrapgen.kernels.triton import compat

    compat.prepare_worker()
    write_message(replies, ("ready", os.getpid()))
    while True:
        try:
            key, args, settings = read_message(requests)
        except EOFError:
            return
        try:
            os.environ.update(settings)
            compat.warm_cache_in_subprocess(*args)
            error = None
        except Exception:  # noqa: BLE001 - any failure goes back to the parent as text
            error = traceback.format_exc()
        write_message(replies, (key, error))


def main() -> None:
    """Replies go to a private copy of stdout; fd 1 then points at stderr, so whatever Triton
    or a kernel prints cannot corrupt the reply stream. Ctrl-C is the parent's to handle (a
    terminal sends it to every worker too): a worker ends when its input does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        serve(sys.stdin.buffer, replies)
    except BrokenPipeError:  # the parent went away mid-reply
        pass


if __name__ == "__main__":
    main()
