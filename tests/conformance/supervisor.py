"""Hand ops to worker processes, collect their records, and keep to the wall-clock budget.

A worker that dies (a segfault, an abort, a broken CUDA context) costs only the sample it
was running, reported as a crash; the rest of its op goes to a fresh worker. Workers are
recycled every few ops so memory does not pile up. When the budget runs out (or the run
gets SIGTERM / Ctrl-C) no more work is handed out and the workers are killed: every result
that arrived is kept (the journal has them already), and the ops that did not finish are
reported as such by the caller.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .journal import JournalWriter, lane
from .report import Result

REPO = Path(__file__).resolve().parents[2]
WORKER_ARGV = [sys.executable, "-m", "tests.conformance.worker"]
MAX_DEATHS_PER_OP = 20


class Stop(Exception):
    """Raised in the supervisor by SIGTERM: stop now, keep what arrived."""


@dataclass
class Settings:
    jobs: int
    recycle: int
    timeout: float
    devices: list[str]
    deadline: float | None = None  # time.monotonic() at which to stop; None: no budget
    report_every: float = 60.0
    progress: bool = True


@dataclass
class Outcome:
    results: dict[tuple, Result] = field(default_factory=dict)
    done: dict[tuple[str, str], float] = field(default_factory=dict)  # (lane, op) -> seconds
    startups: list[dict[str, float]] = field(default_factory=list)
    stopped: str = "finished"
    log_dir: Path | None = None


class Worker:
    def __init__(self, devices: list[str], log: Any, events: queue.Queue) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [*WORKER_ARGV, "--record-fd", str(write_fd), "--devices", *devices],
            stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), text=True,
            cwd=REPO, start_new_session=True,
        )
        os.close(write_fd)
        self.task: dict | None = None
        self.in_flight: dict | None = None  # the "start" record of the sample (or target) running now
        self.progressed = False  # this task got at least one "start" record
        self.sent_at = 0.0
        self.ops_done = 0
        self.last_seen = time.monotonic()
        self.hung = False
        threading.Thread(target=self._read, args=(os.fdopen(read_fd), events), daemon=True).start()

    def _read(self, stream: Any, events: queue.Queue) -> None:
        for line in stream:
            try:
                events.put((self, json.loads(line)))
            except json.JSONDecodeError:  # a half-written record of a worker killed mid-line
                break
        events.put((self, None))

    def send(self, task: dict) -> None:
        self.task, self.in_flight, self.progressed = task, None, False
        self.last_seen = self.sent_at = time.monotonic()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(task) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died already: its EOF hands the task back
            pass

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _dtype(task: dict) -> str:
    return task.get("dtype", "float32")


def _died(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"worker process died ({signal.Signals(-returncode).name})"
    if returncode == 3:
        return "worker process exited: the CUDA context broke"
    return f"worker process exited with status {returncode}"


def supervise(
    settings: Settings,
    tasks: list[dict],
    targets: list[str],
    journal: JournalWriter,
    checkpoint: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Run the tasks; `checkpoint(outcome)` is called every `report_every` seconds (to write
    partial reports). Returns when every task is done, the deadline passes, or SIGTERM comes."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the test extra
        tqdm = None

    outcome = Outcome()
    results = outcome.results
    events: queue.Queue = queue.Queue()
    pending = collections.deque(tasks)
    deaths: collections.Counter = collections.Counter()
    outcome.log_dir = log_dir = Path(tempfile.mkdtemp(prefix="wrapgen-conformance-logs-"))
    jobs = max(1, min(settings.jobs, len(tasks)))
    logs = [open(log_dir / f"worker-{i}.log", "a") for i in range(jobs)]  # noqa: SIM115
    hang_after = settings.timeout * 2 + 120
    show = settings.progress and tqdm is not None
    progress = tqdm(total=len(tasks), unit="op", dynamic_ncols=True) if show else None
    counts: collections.Counter = collections.Counter()

    def record(task: dict, mode: str, index: int, target: str, cls: str, reason: str, fallbacks=()) -> None:
        r = Result(task["device"], target, task["op"], mode, index, cls, reason, tuple(fallbacks), _dtype(task))
        results[(r.device, r.dtype, r.target, r.op, r.mode, r.index)] = r
        journal.result(r)
        counts[cls] += 1

    def finish(task: dict, seconds: float) -> None:
        outcome.done[(lane(task["device"], _dtype(task)), task["op"])] = seconds
        journal.op_done(task["device"], task["op"], seconds, _dtype(task))
        if progress:
            progress.update(1)
            progress.set_postfix(wrong=counts["wrong"], crash=counts["crash"], refresh=False)

    def have(task: dict) -> list[list]:
        """[mode, index, target] of the task's results so far."""
        return [[m, i, t] for (d, dt, t, o, m, i) in results
                if d == task["device"] and dt == _dtype(task) and o == task["op"]]

    def out_of_time() -> bool:
        return settings.deadline is not None and time.monotonic() >= settings.deadline

    slots: dict[Worker, int] = {}

    def start(slot: int) -> None:
        w = Worker(settings.devices, logs[slot], events)
        slots[w] = slot
        feed(w)

    def feed(worker: Worker) -> None:
        if pending and worker.ops_done < settings.recycle and not out_of_time():
            worker.send(pending.popleft())
        else:
            worker.task = None
            worker.close()

    def on_death(worker: Worker) -> None:
        returncode = worker.proc.wait()
        slot = slots.pop(worker)
        task = worker.task
        if task is not None:  # it died inside a task
            why = f"hung: no progress for {hang_after:g} s" if worker.hung else _died(returncode)
            flight = worker.in_flight
            if flight is not None and flight["target"] is None:
                # Eager killed by a signal (a crash inside torch) cannot be compared: skipped.
                # A worker that exits or hangs while eager runs is the harness's own failure.
                eager_crashed = returncode is not None and returncode < 0 and not worker.hung
                for target in targets:
                    if (task["device"], _dtype(task), target, task["op"], flight["mode"], flight["index"]) not in results:
                        if eager_crashed:
                            record(task, flight["mode"], flight["index"], target, "skipped", f"eager: {why}")
                        else:
                            record(task, flight["mode"], flight["index"], target, "crash", f"harness, running eager: {why}")
            elif flight is not None:
                record(task, flight["mode"], flight["index"], flight["target"], "crash", why)
            deaths[task["op"]] += 1
            if (not worker.progressed and deaths[task["op"]] >= 2) or deaths[task["op"]] >= MAX_DEATHS_PER_OP:
                for target in targets:  # it dies before running anything: give up on the op
                    record(task, "static", -1, target, "crash", f"{why} before running a sample")
                finish(task, time.monotonic() - worker.sent_at)
            else:
                pending.appendleft({**task, "skip": have(task)})
        if pending and not out_of_time():
            start(slot)

    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise Stop("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    last_checkpoint = time.monotonic()
    try:
        for slot in range(jobs):
            if pending and not out_of_time():
                start(slot)
        while slots:
            now = time.monotonic()
            if out_of_time():
                outcome.stopped = "budget"
                break
            if checkpoint is not None and now - last_checkpoint >= settings.report_every:
                checkpoint(outcome)
                last_checkpoint = now
            wait = 10.0 if settings.deadline is None else max(0.05, min(10.0, settings.deadline - now))
            try:
                worker, rec = events.get(timeout=wait)
            except queue.Empty:
                for w in slots:
                    if w.task is not None and now - w.last_seen > hang_after:
                        w.hung = True
                        w.kill()  # its reader then reports EOF, handled below
                continue
            if worker not in slots:
                continue  # a record of a worker already handled
            worker.last_seen = time.monotonic()
            if rec is None:  # the worker's record stream ended: it exited or died
                on_death(worker)
            elif rec["t"] == "ready":
                outcome.startups.append(rec["startup"])
                journal.worker(rec["startup"])
            elif rec["t"] == "start":
                worker.in_flight, worker.progressed = rec, True
            elif rec["t"] == "result":
                record(worker.task, rec["mode"], rec["index"], rec["target"], rec["cls"], rec["reason"], rec["fallbacks"])
                if worker.in_flight is not None and worker.in_flight["target"] == rec["target"]:
                    worker.in_flight = None
            elif rec["t"] == "done":
                worker.ops_done += 1
                finish(worker.task, rec["seconds"])
                feed(worker)
        if pending and outcome.stopped == "finished":  # the budget ran out before a worker could start
            outcome.stopped = "budget"
    except Stop as why:
        outcome.stopped = str(why)
    except KeyboardInterrupt:
        outcome.stopped = "interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        for w in slots:
            w.kill()
        for w in slots:
            w.proc.wait()
        if progress:
            progress.close()
        for f in logs:
            f.close()
    return outcome
