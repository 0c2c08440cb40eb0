"""The full conformance run: every OpInfo op, every registered target, every mode.

    python -m tests.conformance.run [--ops 'add*' ...] [--max-samples N] [--jobs N]

writes `benchmarks/results/conformance-<device>-<target>.md` and exits non-zero when a
*wrong* or *crash* is not in known_failures.py, or an entry there no longer fails.

Samples run in-process in worker processes (one op at a time, handed out by this
supervisor); each worker guards every sample with a time limit. A worker that dies anyway
(a segfault, an abort) costs only the sample it was running, which is reported as a crash;
a fresh worker carries on with the rest of the op. Workers are recycled every few ops so
memory does not pile up.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import fnmatch
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", nargs="*", help="targets to run (default: every registered one)")
    p.add_argument("--devices", nargs="*", help="devices (default: cpu, and cuda when available)")
    p.add_argument("--ops", nargs="*", help="fnmatch patterns of OpInfo keys (default: all)")
    p.add_argument("--modes", nargs="*", help="static dynamic inplace-static inplace-dynamic (default: all)")
    p.add_argument("--max-samples", type=int, default=0, help="samples per op and mode, 0 = every sample")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per sample and target")
    p.add_argument("--recycle", type=int, default=25, help="ops a worker runs before a fresh one replaces it")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the markdown reports")
    p.add_argument("--json", type=Path, default=REPO / "build" / "conformance" / "results.jsonl",
                   help="where to write every sample's result (JSON lines)")
    p.add_argument("--from-json", type=Path, help="write the reports from an earlier run's results; run nothing")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--record-fd", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- worker -------------------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    """Run the tasks read from stdin (one JSON object a line); write records to --record-fd."""
    import logging
    import warnings

    out = os.fdopen(args.record_fd, "w", buffering=1)
    os.dup2(2, 1)  # whatever torch or an op prints goes to the log, not into the records
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)

    import torch

    import wrapgen

    from .harness import MODE_BY_NAME, SKIPPED, Outcome, make_samples, modes_for, one_line, op_database, prepare_sample

    torch.set_num_threads(1)  # the supervisor runs one worker per core

    def emit(**record: Any) -> None:
        out.write(json.dumps(record) + "\n")

    def result(task: dict, mode: str, index: int, target: str, outcome: Outcome) -> None:
        emit(t="result", device=task["device"], target=target, op=task["op"], mode=mode, index=index,
             cls=outcome.cls, reason=outcome.reason, fallbacks=list(outcome.fallbacks))

    with tempfile.TemporaryDirectory(prefix="wrapgen-conformance-") as cache, wrapgen.config.patch(cache_dir=cache):
        for line in sys.stdin:
            task = json.loads(line)
            key, device = task["op"], task["device"]
            op = op_database()[key]
            skip = {tuple(x) for x in task["skip"]}
            modes = modes_for(op, [MODE_BY_NAME[m] for m in task["modes"]])
            try:
                samples = make_samples(op, device, task["max_samples"] or None)
            except Exception as err:
                outcome = Outcome(SKIPPED, one_line(f"sample_inputs raised {type(err).__name__}: {err}"))
                for mode in modes:
                    for target in task["targets"]:
                        result(task, mode.name, -1, target, outcome)
                samples = []
            for mode in modes:
                for index, sample in samples:
                    if (mode.name, index) in skip:
                        continue
                    emit(t="start", mode=mode.name, index=index, target=None)
                    prepared = prepare_sample(key, sample, mode, device.split(":")[0], task["timeout"])
                    for target in task["targets"]:
                        if isinstance(prepared, Outcome):
                            result(task, mode.name, index, target, prepared)
                            continue
                        emit(t="start", mode=mode.name, index=index, target=target)
                        result(task, mode.name, index, target, prepared.run(target, task["timeout"]))
            emit(t="done")
            torch._dynamo.reset()


# -- supervisor ---------------------------------------------------------------------------------


class Worker:
    def __init__(self, argv: list[str], log: Any, events: queue.Queue) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [*argv, "--record-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), text=True,
            cwd=REPO, start_new_session=True,
        )
        os.close(write_fd)
        self.task: dict | None = None
        self.in_flight: dict | None = None  # the last "start" record of the current task
        self.ops_done = 0
        self.last_seen = time.monotonic()
        self.hung = False
        threading.Thread(target=self._read, args=(os.fdopen(read_fd), events), daemon=True).start()

    def _read(self, stream: Any, events: queue.Queue) -> None:
        for line in stream:
            events.put((self, json.loads(line)))
        events.put((self, None))

    def send(self, task: dict) -> None:
        self.task, self.in_flight = task, None
        self.last_seen = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _died(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"worker process died ({signal.Signals(-returncode).name})"
    return f"worker process exited with status {returncode}"


def supervise(args: argparse.Namespace, tasks: list[dict], targets: list[str]) -> list[Any]:
    from .report import Result

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the test extra
        tqdm = None

    results: dict[tuple, Result] = {}
    events: queue.Queue = queue.Queue()
    pending = collections.deque(tasks)
    deaths: collections.Counter = collections.Counter()
    argv = [sys.executable, "-m", "tests.conformance.run", "--worker"]
    log_dir = Path(tempfile.mkdtemp(prefix="wrapgen-conformance-logs-"))
    logs = [open(log_dir / f"worker-{i}.log", "a") for i in range(max(1, args.jobs))]  # noqa: SIM115
    hang_after = args.timeout * 2 + 120
    progress = tqdm(total=len(tasks), unit="op", disable=args.no_progress, dynamic_ncols=True) if tqdm else None
    counts: collections.Counter = collections.Counter()

    def record(task: dict, mode: str, index: int, target: str, cls: str, reason: str, fallbacks=()) -> None:
        r = Result(task["device"], target, task["op"], mode, index, cls, reason, tuple(fallbacks))
        results[(r.device, r.target, r.op, r.mode, r.index)] = r
        counts[cls] += 1

    def done_samples(task: dict) -> list[list]:
        """(mode, index) pairs of the task that have a result for every target."""
        per_sample = collections.Counter(
            (m, i) for (d, _t, o, m, i) in results if d == task["device"] and o == task["op"]
        )
        return [[m, i] for (m, i), n in per_sample.items() if n >= len(targets)]

    def start(slot: int) -> Worker:
        return Worker(argv, logs[slot], events)

    slots: dict[Worker, int] = {}

    def feed(worker: Worker) -> None:
        if pending and worker.ops_done < args.recycle:
            worker.send(pending.popleft())
        else:
            worker.task = None
            worker.close()

    for slot in range(min(max(1, args.jobs), len(tasks))):
        w = start(slot)
        slots[w] = slot
        feed(w)
    try:
        while slots:
            try:
                worker, rec = events.get(timeout=10)
            except queue.Empty:
                now = time.monotonic()
                for w in slots:
                    if w.task is not None and now - w.last_seen > hang_after:
                        w.hung = True
                        w.kill()  # its reader then reports EOF, handled below
                continue
            worker.last_seen = time.monotonic()
            if rec is None:  # the worker's record stream ended: it exited or died
                returncode = worker.proc.wait()
                slot = slots.pop(worker)
                task = worker.task
                if task is not None:  # it died inside a task
                    why = f"hung: no progress for {hang_after:g} s" if worker.hung else _died(returncode)
                    flight = worker.in_flight
                    if flight is not None and flight["target"] is None:  # eager itself died on the sample
                        for target in targets:
                            record(task, flight["mode"], flight["index"], target, "skipped", f"eager: {why}")
                    elif flight is not None:
                        record(task, flight["mode"], flight["index"], flight["target"], "crash", why)
                    deaths[task["op"]] += 1
                    if flight is None and deaths[task["op"]] >= 2:  # dies before any sample: give up on the op
                        for target in targets:
                            record(task, "static", -1, target, "crash", f"{why} before running a sample")
                        if progress:
                            progress.update(1)
                    else:
                        pending.appendleft({**task, "skip": done_samples(task)})
                if pending:
                    w = start(slot)
                    slots[w] = slot
                    feed(w)
                continue
            if rec["t"] == "start":
                worker.in_flight = rec
            elif rec["t"] == "result":
                record(worker.task, rec["mode"], rec["index"], rec["target"], rec["cls"], rec["reason"], rec["fallbacks"])
            elif rec["t"] == "done":
                worker.ops_done += 1
                if progress:
                    progress.update(1)
                    progress.set_postfix(wrong=counts["wrong"], crash=counts["crash"], refresh=False)
                feed(worker)
    finally:
        for w in slots:
            w.kill()
        if progress:
            progress.close()
        for f in logs:
            f.close()
    print(f"worker logs: {log_dir}", file=sys.stderr)
    return list(results.values())


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run_info(args: argparse.Namespace, argv: list[str] | None, targets: list[str], devices: list[str], modes: list[str]) -> dict:
    import torch

    import wrapgen

    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node() or 'unknown'}, {platform.machine()}, {os.cpu_count()} CPUs",
        "cuda": {d: torch.cuda.get_device_name(d) for d in devices if d.startswith("cuda")},
        "versions": f"torch {torch.__version__}, wrapgen {wrapgen.__version__} (git {_git_commit()}), "
        f"Python {platform.python_version()}",
        "targets": targets,
        "devices": devices,
        "modes": modes,
        "ops": args.ops,
        "max_samples": args.max_samples,
        "jobs": args.jobs,
        "command": "python -m tests.conformance.run " + " ".join(argv if argv is not None else sys.argv[1:]),
    }


def _run(args: argparse.Namespace, argv: list[str] | None) -> tuple[dict, list]:
    import wrapgen

    from .harness import MODES, devices, ops_for

    targets = args.targets or wrapgen.backends.registered_backends()
    device_list = args.devices or devices()
    modes = args.modes or [m.name for m in MODES]
    info = _run_info(args, argv, targets, device_list, modes)
    started = time.time()
    tasks = []
    for device in device_list:
        keys = ops_for(device.split(":")[0])
        if args.ops:
            keys = [k for k in keys if any(fnmatch.fnmatchcase(k, p) for p in args.ops)]
        tasks += [
            {"device": device, "op": k, "targets": targets, "modes": modes, "max_samples": args.max_samples,
             "timeout": args.timeout, "skip": []}
            for k in keys
        ]
    print(f"conformance: {len(tasks)} ops x {len(targets)} target(s) {targets}, modes {modes}, "
          f"{'every sample' if not args.max_samples else f'up to {args.max_samples} samples'} per op, "
          f"{args.jobs} worker(s)", file=sys.stderr)
    results = supervise(args, tasks, targets)
    info["elapsed_s"] = round(time.time() - started, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"run": info})] + [json.dumps(asdict(r)) for r in results]
        args.json.write_text("\n".join(lines) + "\n")
        print(f"results: {args.json}", file=sys.stderr)
    return info, results


def _load(path: Path) -> tuple[dict, list]:
    from .report import Result

    info: dict = {}
    results = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "run" in record:
            info = record["run"]
        else:
            results.append(Result(**{**record, "fallbacks": tuple(record["fallbacks"])}))
    return info, results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    import warnings

    warnings.simplefilter("ignore")
    from .report import known_entries_not_run, render, write_report

    info, results = _load(args.from_json) if args.from_json else _run(args, argv)
    status = 0
    for device in info["devices"]:
        for target in info["targets"]:
            mine = [r for r in results if r.device == device and r.target == target]
            header = {
                "date": info["date"],
                "machine": info["machine"] + (f", {info['cuda'][device]}" if device in info["cuda"] else ""),
                "versions": info["versions"],
                "ops": f"{len({r.op for r in mine})} OpInfo ops with float32 support on {device}"
                + (f" matching {' '.join(info['ops'])}" if info["ops"] else ""),
                "samples": "every sample" if not info["max_samples"]
                else f"up to {info['max_samples']} per op, spread evenly over its samples (first and last included)",
                "modes": ", ".join(info["modes"]),
                "run time": f"{info['elapsed_s'] / 60:.1f} min with {info['jobs']} worker process(es)",
                "command": info["command"],
            }
            text, verdicts = render(mine, device, target, header, info["modes"])
            path = args.out / f"conformance-{device.replace(':', '')}-{target}.md"
            write_report(path, text)
            print(f"{path}: {len(verdicts.unexpected)} unexpected, {len(verdicts.known)} known, "
                  f"{len(verdicts.stale)} stale", file=sys.stderr)
            for s in verdicts.unexpected:
                print(f"  unexpected: {s.op} ({s.mode}): {sorted(set(s.failing.values()))}", file=sys.stderr)
            for op, mode, _ in verdicts.stale:
                print(f"  stale: {op} ({mode})", file=sys.stderr)
            if verdicts.unexpected or verdicts.stale:
                status = 1
    if not info["ops"]:
        missing = known_entries_not_run({r.op for r in results})
        if missing:
            print(f"known_failures.py names ops that did not run: {missing}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
