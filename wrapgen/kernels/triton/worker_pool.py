"""Triton compile workers: processes of our own program (`compile_worker.py`), never
multiprocessing children, so the user's `__main__` is not imported again in each one.

One pool per process, made on first use; workers start when requests need them (or all at
once, `start`, when a CUDA compile begins) and are kept for later programs (starting one
imports torch and Triton: seconds). Each worker has one driver thread taking requests from a
shared queue, so requests compile in parallel, whether submitted as a batch or one at a time
while a program is still being lowered. A request that fails, a worker that dies and a worker
that stops answering cost only the warm-up of their kernels: the caller compiles every kernel
in its own process afterwards anyway (a warmed kernel is then a Triton cache hit). A dead
worker is replaced on the next request; all are shut down at exit.
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
from concurrent.futures import Future, as_completed
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
        self.environment = compat.worker_environment()  # the ptxas its compiles use, ...
        env = {**os.environ, **self.environment, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.served = 0
        self._ready = False
        self.retired = False  # replaced (other Triton settings) or the pool closed
        self.driven = False  # a driver thread is taking requests for it

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, key: str, args: tuple, settings: dict[str, str]) -> str | None:
        """Have the worker warm one kernel into the Triton cache `settings` name: None when it
        did, else its traceback text.
        Raises WorkerFailed (and stops the worker) when it died or did not answer in time."""
        assert self.process.stdin is not None and self.process.stdout is not None
        replies = self.process.stdout.fileno()  # read unbuffered, so nothing waits in a buffer
        try:
            if not self._ready:
                message = read_message(_Deadline(replies, START_TIMEOUT_S))
                if not (isinstance(message, tuple) and message[:1] == ("ready",)):
                    raise ValueError(f"expected its ready message, got {message!r}")
                self._ready = True
            write_message(self.process.stdin, (key, args, settings))
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
    """Compile workers for this process, started lazily and reused.

    Each worker has a driver thread that takes requests from one queue for as long as the
    worker lives, so requests can be submitted one at a time while a program is still being
    lowered (`submit`) and their compiles overlap the rest of the lowering; `run` is a batch."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self.owner = os.getpid()
        self.workers: list[CompileWorker] = []
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[str, tuple, dict[str, str], Future] | None] = queue.SimpleQueue()
        self._outstanding = 0  # submitted, not answered yet: how many workers are worth having

    def start(self) -> None:
        """Start every worker now (without waiting for them to be ready); later requests use them."""
        with self._lock:
            try:
                self._ensure_workers(self.max_workers)
            except OSError:  # no Python to start: requests say why, and compile in-process
                pass

    def started(self) -> bool:
        """Whether workers were started (alive), so a batch of a few kernels need not wait for start-up."""
        return any(w.alive() for w in self.workers)

    def served(self) -> dict[int, int]:
        """Requests answered so far by each live worker, by pid."""
        return {w.pid: w.served for w in self.workers if w.alive()}

    def submit(self, key: str, args: tuple) -> Future:
        """Queue one request, to compile into the Triton cache this process reads now; the
        Future's result is its Outcome (never an exception)."""
        future: Future = Future()
        settings = compat.worker_cache_settings()
        with self._lock:
            try:
                self._ensure_workers(min(self._outstanding + 1, self.max_workers))
            except OSError as e:  # no Python to start (a frozen or embedded interpreter)
                if not any(w.driven for w in self.workers):
                    future.set_result(Outcome(key, f"could not start a Triton compile worker: {e}"))
                    return future
            self._outstanding += 1
            self._jobs.put((key, args, settings, future))
        return future

    def run(self, requests: Sequence[tuple[str, tuple]],
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Run `(key, args)` requests on the workers in parallel; their Outcomes, in request order."""
        futures = [self.submit(key, args) for key, args in requests]
        for future in as_completed(futures):
            if on_done is not None:
                on_done(future.result())
        return [future.result() for future in futures]

    def _ensure_workers(self, count: int) -> None:
        """At least `count` live workers (no more than max_workers), each with its driver thread.
        Workers started under other Triton settings (another ptxas: torch.compile switches to its
        own) are replaced: their kernels would be keyed differently from this process's, and every
        kernel would then compile again here, one after another. (The cache directory is not such
        a setting: it comes with each request.)"""
        current = compat.worker_environment()
        for worker in self.workers:
            if not worker.alive() or worker.environment != current:
                worker.retired = True
                worker.stop()
        self.workers = [w for w in self.workers if not w.retired]
        while len(self.workers) < min(count, self.max_workers):
            worker = CompileWorker()
            worker.driven = True
            self.workers.append(worker)
            threading.Thread(target=self._drive, args=(worker,), daemon=True).start()

    def _drive(self, worker: CompileWorker) -> None:
        """One worker's thread: answer queued requests until the worker fails, retires or the pool closes."""
        while True:
            job = self._jobs.get()
            if job is None:  # the pool is closing
                return
            key, args, settings, future = job
            if worker.retired:  # replaced under other settings: a live worker takes the request
                self._jobs.put(job)
                self._stop_driving(worker)
                return
            failed = True
            try:
                outcome = Outcome(key, worker.request(key, args, settings))
                failed = False
            except WorkerFailed as e:
                outcome = Outcome(key, str(e))
            except Exception as e:  # noqa: BLE001 - e.g. arguments that do not pickle: drop this worker
                worker.stop()
                outcome = Outcome(key, f"{type(e).__name__}: {e}")
            with self._lock:
                self._outstanding -= 1
            future.set_result(outcome)
            if failed:
                self._stop_driving(worker)
                return

    def _stop_driving(self, worker: CompileWorker) -> None:
        """A driver ends; when it was the last, the queued requests fail (none would take them)."""
        with self._lock:
            worker.driven = False
            if any(w.driven for w in self.workers):
                return
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    return
                if job is not None:
                    self._outstanding -= 1
                    job[3].set_result(Outcome(job[0], "no Triton compile worker was left to take it"))

    def close(self) -> None:
        """Stop every worker; only the process that started them does (a fork's copy does not)."""
        if os.getpid() != self.owner:
            return
        with self._lock:
            workers, self.workers = self.workers, []
        for worker in workers:
            worker.retired = True
            self._jobs.put(None)  # wakes one idle driver, which returns
            if worker.process.stdin is not None and not worker.process.stdin.closed:
                worker.process.stdin.close()
        for worker in workers:
            worker.stop(grace_s=5.0)


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
