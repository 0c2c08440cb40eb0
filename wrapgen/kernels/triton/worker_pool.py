"""Triton compile workers: processes of our own program (`compile_worker.py`), never
multiprocessing children, so the user's `__main__` is not imported again in each one.

One pool per process, made on first use; workers start when a batch needs them and are
kept for later programs (starting one imports torch and Triton: seconds). Each worker is
driven by one thread at a time, so a batch compiles in parallel. A request that fails, a
worker that dies and a worker that stops answering cost only the warm-up of their kernels:
the caller compiles every kernel in its own process afterwards anyway (a warmed kernel is
then a Triton cache hit). A dead worker is replaced on the next batch; all are shut down
at exit.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wrapgen.errors import WrapgenError
from wrapgen.kernels.triton import compat
from wrapgen.kernels.triton.compile_worker import read_message, write_message

# `-c`, not `-m`: `-m` puts the working directory first on sys.path, where a folder named
# `torch` (a PyTorch checkout) would shadow the installed one. This process's own sys.path
# reaches the worker through PYTHONPATH, so it finds the same wrapgen, torch and Triton.
_BOOTSTRAP = "import sys; del sys.path[0]; from wrapgen.kernels.triton.compile_worker import main; main()"
START_TIMEOUT_S = 300.0  # importing torch and Triton, on a loaded machine
REQUEST_TIMEOUT_S = 600.0  # one kernel's compile
MAX_WORKERS = 16


class WorkerFailed(WrapgenError, RuntimeError):
    """A compile worker exited or stopped answering (its own error, if any, is on stderr)."""


@dataclass(frozen=True)
class Outcome:
    """One request's end: `error` is None when the worker did it, else why it did not."""

    key: str
    error: str | None


class _Deadline:
    """Reads from a pipe's file descriptor, failing once `seconds` have passed."""

    def __init__(self, fd: int, seconds: float) -> None:
        self.fd, self.end = fd, time.monotonic() + seconds

    def read(self, size: int) -> bytes:
        left = self.end - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            raise TimeoutError
        return os.read(self.fd, size)


class CompileWorker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        self.environment = compat.worker_environment()  # the Triton cache its compiles land in, ...
        env = {**os.environ, **self.environment, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.served = 0
        self._ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, key: str, args: tuple) -> str | None:
        """Have the worker warm one kernel: None when it did, else its traceback text.
        Raises WorkerFailed (and stops the worker) when it died or did not answer in time."""
        assert self.process.stdin is not None and self.process.stdout is not None
        replies = self.process.stdout.fileno()  # read unbuffered, so nothing waits in a buffer
        try:
            if not self._ready:
                message = read_message(_Deadline(replies, START_TIMEOUT_S))
                if not (isinstance(message, tuple) and message[:1] == ("ready",)):
                    raise ValueError(f"expected its ready message, got {message!r}")
                self._ready = True
            write_message(self.process.stdin, (key, args))
            reply = read_message(_Deadline(replies, REQUEST_TIMEOUT_S))
            if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == key):
                raise ValueError(f"expected the answer for {key!r}, got {reply!r:.200}")
        except (EOFError, OSError, TimeoutError, ValueError, pickle.UnpicklingError) as e:
            raise WorkerFailed(self._failure(e, key)) from e
        self.served += 1
        return reply[1]

    def _failure(self, cause: BaseException, key: str) -> str:
        if isinstance(cause, (EOFError, BrokenPipeError)):  # it is exiting: wait for its code
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        code = self.process.poll()
        if code is not None:
            what = f"exited with code {code}"
        elif isinstance(cause, TimeoutError):
            what = f"gave no answer in {REQUEST_TIMEOUT_S if self._ready else START_TIMEOUT_S:.0f} s"
        else:
            what = f"broke the protocol ({type(cause).__name__}: {cause})"
        self.stop()
        return f"Triton compile worker (pid {self.pid}) {what} while working on {key}; its error, if any, is on stderr"

    def stop(self, grace_s: float = 0.0) -> None:
        """Close its input (a worker exits at end of input); kill it if it is still there after `grace_s`."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class CompilePool:
    """Compile workers for this process, started lazily and reused."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self.owner = os.getpid()
        self.workers: list[CompileWorker] = []
        self._lock = threading.Lock()

    def served(self) -> dict[int, int]:
        """Requests answered so far by each live worker, by pid."""
        return {w.pid: w.served for w in self.workers if w.alive()}

    def run(self, requests: Sequence[tuple[str, tuple]],
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Run `(key, args)` requests on the workers in parallel; one Outcome per request."""
        if not requests:
            return []
        with self._lock:
            try:
                workers = self._workers_for(len(requests))
            except OSError as e:  # no Python to start (a frozen or embedded interpreter)
                if not self.workers:
                    return [Outcome(key, f"could not start a Triton compile worker: {e}") for key, _ in requests]
                workers = self.workers[: len(requests)]
            jobs: queue.SimpleQueue[tuple[str, tuple]] = queue.SimpleQueue()
            for request in requests:
                jobs.put(request)
            results: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
            for worker in workers:
                threading.Thread(target=_drive, args=(worker, jobs, results), daemon=True).start()
            outcomes: list[Outcome] = []
            running = len(workers)
            while running:
                outcome = results.get()
                if outcome is None:
                    running -= 1
                    continue
                outcomes.append(outcome)
                if on_done is not None:
                    on_done(outcome)
            while not jobs.empty():  # every worker failed before the queue ran dry
                outcomes.append(Outcome(jobs.get()[0], "no Triton compile worker was left to take it"))
            return outcomes

    def _workers_for(self, count: int) -> list[CompileWorker]:
        """Up to `count` live workers (no more than max_workers), starting new ones for the dead or missing.
        Workers started under other Triton settings (TRITON_CACHE_DIR changed since, as a benchmark
        does for a cold compile) are replaced: their compiles would warm a cache this process does
        not read, and every kernel would then compile again here, one after another."""
        current = compat.worker_environment()
        for worker in [w for w in self.workers if not w.alive() or w.environment != current]:
            worker.stop()
        self.workers = [w for w in self.workers if w.alive() and w.environment == current]
        while len(self.workers) < min(count, self.max_workers):
            self.workers.append(CompileWorker())
        return self.workers[:count]

    def close(self) -> None:
        """Stop every worker; only the process that started them does (a fork's copy does not)."""
        if os.getpid() != self.owner:
            return
        workers, self.workers = self.workers, []
        for worker in workers:
            if worker.process.stdin is not None and not worker.process.stdin.closed:
                worker.process.stdin.close()
        for worker in workers:
            worker.stop(grace_s=5.0)


def _drive(worker: CompileWorker, jobs: queue.SimpleQueue, results: queue.SimpleQueue) -> None:
    """One worker's thread: take requests until none are left or the worker fails; then a None."""
    try:
        while True:
            try:
                key, args = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                results.put(Outcome(key, worker.request(key, args)))
            except WorkerFailed as e:
                results.put(Outcome(key, str(e)))
                return
            except Exception as e:  # noqa: BLE001 - e.g. arguments that do not pickle: drop this worker
                worker.stop()
                results.put(Outcome(key, f"{type(e).__name__}: {e}"))
                return
    finally:
        results.put(None)


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def compile_pool() -> CompilePool:
    """This process's pool (a forked child makes its own; it never drives its parent's workers)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.owner != os.getpid():
            _pool = CompilePool(max(1, min(os.cpu_count() or 1, MAX_WORKERS)))
            atexit.register(_pool.close)
        return _pool
