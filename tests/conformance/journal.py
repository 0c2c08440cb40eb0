"""The run's JSON-lines journal, written as results arrive so a killed run still leaves them.

Records, one a line:

    {"run": {...}}                      first: what the run planned (ops per lane, targets, ...)
    {"device": ..., "op": ..., ...}     one sample's result (report.Result's fields)
    {"op_done": {...}}                  an op finished (device, op, seconds, dtype)
    {"worker": {...}}                   a worker started (its startup seconds, by stage)
    {"end": {...}}                      last: elapsed seconds and why it stopped

A journal without its "end" record comes from a run that was killed; `load` reads it all
the same. Several journals (the shards of one run) merge into one `Journal`.

A *lane* is a device and a sample dtype: `"cpu"` for float32 (as journals from before other
dtypes name it), `"cpu/bfloat16"` otherwise. Records without a dtype are float32.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from .report import Result


def lane(device: str, dtype: str = "float32") -> str:
    """The key a device and sample dtype are planned and finished under."""
    return device if dtype == "float32" else f"{device}/{dtype}"


@dataclass
class Journal:
    """What one run (or the merged shards of one) planned and did."""

    info: dict[str, Any] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    done: dict[tuple[str, str], float] = field(default_factory=dict)  # (lane, op) -> seconds
    workers: list[dict[str, Any]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)  # one per run that reached its end

    def planned(self, device: str, dtype: str = "float32") -> dict[str, list[str]]:
        """The ops the run set out to do on `device` in `dtype`, each with its modes."""
        return dict(self.info.get("planned", {}).get(lane(device, dtype), {}))

    def unfinished(self, device: str, dtype: str = "float32") -> tuple[list[str], list[str]]:
        """(not run, cut off): planned ops with no result at all, and ops that have some
        results but did not finish (the budget ran out, or the run was killed, while they ran)."""
        started = {r.op for r in self.results if r.device == device and r.dtype == dtype}
        missing = [op for op in self.planned(device, dtype) if (lane(device, dtype), op) not in self.done]
        return [op for op in missing if op not in started], [op for op in missing if op in started]


class JournalWriter:
    """Appends records and flushes each one (the file is complete up to the last record)."""

    def __init__(self, path: Path | None, info: dict[str, Any]) -> None:
        self.stream: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.stream = open(path, "w")  # noqa: SIM115 - closed by close()
        self._write({"run": info})

    def _write(self, record: dict[str, Any]) -> None:
        if self.stream is not None:
            self.stream.write(json.dumps(record) + "\n")
            self.stream.flush()

    def result(self, result: Result) -> None:
        self._write(asdict(result))

    def op_done(self, device: str, op: str, seconds: float, dtype: str = "float32") -> None:
        self._write({"op_done": {"device": device, "op": op, "seconds": round(seconds, 2), "dtype": dtype}})

    def worker(self, startup: dict[str, Any]) -> None:
        self._write({"worker": startup})

    def end(self, elapsed_s: float, stopped: str) -> None:
        self._write({"end": {"elapsed_s": round(elapsed_s, 1), "stopped": stopped}})

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def _merge_info(into: dict[str, Any], info: dict[str, Any]) -> None:
    if not into:
        into.update({**info, "planned": {d: dict(ops) for d, ops in info.get("planned", {}).items()}})
        into["shards"] = [info.get("shard")]
        return
    for key in ("targets", "devices", "modes", "dtypes"):
        into[key] = list(dict.fromkeys([*into.get(key, []), *info.get(key, [])]))
    for device, ops in info.get("planned", {}).items():
        into["planned"].setdefault(device, {}).update(ops)
    into["shards"].append(info.get("shard"))
    if info.get("command") != into.get("command"):
        into["command"] = f"{into['command']} ; {info.get('command')}"


def load(paths: list[Path]) -> Journal:
    """Read journals (possibly cut short, possibly several shards) into one."""
    journal = Journal()
    results: dict[tuple, Result] = {}  # a later record for the same sample replaces an earlier one
    for path in paths:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break  # the last line of a killed run may be half written
                raise ValueError(f"{path}:{number}: not a JSON record") from None
            if "run" in record:
                _merge_info(journal.info, {"dtypes": ["float32"], **record["run"]})
            elif "op_done" in record:
                done = record["op_done"]
                journal.done[(lane(done["device"], done.get("dtype", "float32")), done["op"])] = done["seconds"]
            elif "worker" in record:
                journal.workers.append(record["worker"])
            elif "end" in record:
                journal.ends.append(record["end"])
            else:
                r = Result(**{**record, "fallbacks": tuple(record["fallbacks"])})
                results[(r.device, r.dtype, r.target, r.op, r.mode, r.index)] = r
    journal.results = list(results.values())
    return journal
