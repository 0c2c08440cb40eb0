"""A worker process of the full run: reads ops from stdin, writes records to a pipe.

    python -m tests.conformance.worker --record-fd N [--devices cuda]

Each worker pays its startup once (import torch and wrapgen, import PyTorch's OpInfo
database, create the CUDA context) and reports what that cost, then runs op after op.
Tasks are JSON lines: {"device", "op", "targets", "modes", "max_samples", "timeout", "dtype",
"skip": [[mode, index, target], ...]} (dtype: the samples' dtype name, float32 when absent) (skip: results the supervisor already has, when an op
is handed out again after a worker died in it). Records are JSON lines too:

    {"t": "ready", "startup": {...}}                 startup seconds by stage
    {"t": "start", "mode", "index", "target"}        before eager (target null) / each target
    {"t": "result", ...}                             one sample's class for one target
    {"t": "done", "seconds"}                         the op is finished

On CUDA a sample can leave the context broken (a device-side assert): every later call in
the process would then fail. The worker checks the device after every compiled run and, when
it is broken, records that sample as a crash and exits, so a fresh worker takes over.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.worker")
    p.add_argument("--record-fd", type=int, required=True)
    p.add_argument("--devices", nargs="*", default=["cpu"])
    return p.parse_args(argv)


class BrokenDevice(Exception):
    """The CUDA context is unusable after a sample (a device-side assert, an illegal access)."""


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    import logging
    import warnings

    out = os.fdopen(args.record_fd, "w", buffering=1)
    os.dup2(2, 1)  # whatever torch or an op prints goes to the log, not into the records
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)

    def emit(**record: Any) -> None:
        out.write(json.dumps(record) + "\n")

    startup: dict[str, float] = {}
    t0 = time.perf_counter()
    import torch

    import wrapgen

    startup["import_s"] = time.perf_counter() - t0
    from .harness import MODE_BY_NAME, SKIPPED, Outcome, make_samples, modes_for, one_line, op_database, prepare_sample
    from .precision import dtype_of

    t0 = time.perf_counter()
    op_database()
    startup["op_db_s"] = time.perf_counter() - t0
    cuda = any(d.startswith("cuda") for d in args.devices)
    if cuda:
        t0 = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        startup["cuda_init_s"] = time.perf_counter() - t0
    emit(t="ready", startup={k: round(v, 2) for k, v in startup.items()})
    torch.set_num_threads(1)  # the supervisor runs one worker per core

    def check_device(device: str) -> None:
        if device.startswith("cuda"):
            try:
                torch.cuda.synchronize(device)
            except Exception as err:  # the context is gone: nothing more can run in this process
                raise BrokenDevice(one_line(f"{type(err).__name__}: {err}")) from err

    def result(task: dict, mode: str, index: int, target: str, outcome: Outcome) -> None:
        emit(t="result", device=task["device"], target=target, op=task["op"], mode=mode, index=index,
             cls=outcome.cls, reason=outcome.reason, fallbacks=list(outcome.fallbacks),
             dtype=task.get("dtype", "float32"))

    def run_op(task: dict) -> None:
        key, device, targets = task["op"], task["device"], task["targets"]
        dtype_name = task.get("dtype", "float32")
        dtype = dtype_of(dtype_name)
        op = op_database()[key]
        skip = {tuple(x) for x in task["skip"]}
        modes = modes_for(op, [MODE_BY_NAME[m] for m in task["modes"]])
        try:
            samples = make_samples(op, device, task["max_samples"] or None, dtype)
            why_none = f"the OpInfo has no {dtype_name} samples on this device"
        except Exception as err:
            samples, why_none = [], one_line(f"sample_inputs raised {type(err).__name__}: {err}")
        if not samples:  # say so, for every mode and target: an op without results reads "not run"
            for mode in modes:
                for target in targets:
                    result(task, mode.name, -1, target, Outcome(SKIPPED, why_none))
            return
        for mode in modes:
            for index, sample in samples:
                todo = [t for t in targets if (mode.name, index, t) not in skip]
                if not todo:
                    continue
                emit(t="start", mode=mode.name, index=index, target=None)
                prepared = prepare_sample(key, sample, mode, device.split(":")[0], task["timeout"], dtype)
                check_device(device)
                for target in todo:
                    if isinstance(prepared, Outcome):
                        result(task, mode.name, index, target, prepared)
                        continue
                    emit(t="start", mode=mode.name, index=index, target=target)
                    try:
                        outcome = prepared.run(target, task["timeout"])
                        check_device(device)
                    except BrokenDevice as err:
                        result(task, mode.name, index, target, Outcome("crash", f"the run broke the CUDA context: {err}"))
                        raise
                    except Exception as err:  # the harness itself (comparing, classifying) raised
                        outcome = Outcome("crash", one_line(f"harness raised {type(err).__name__}: {err}"))
                    result(task, mode.name, index, target, outcome)

    with tempfile.TemporaryDirectory(prefix="wrapgen-conformance-") as cache, wrapgen.config.patch(cache_dir=cache):
        for line in sys.stdin:
            task = json.loads(line)
            started = time.perf_counter()
            try:
                run_op(task)
            except BrokenDevice:
                out.flush()
                os._exit(3)  # the supervisor hands the rest of the op to a fresh worker
            emit(t="done", seconds=round(time.perf_counter() - started, 2))
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
