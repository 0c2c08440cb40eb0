"""What `benchmarks.optimizer` and `benchmarks.decode` share: contenders kept side by side in
one process and timed in rotating rounds, each failing on its own, and the result files.

A contender is a `Row` and a `measure()` callable that runs one timed batch (an optimizer's
steps, a generation's decode steps) and returns its seconds per unit (per step, per token).
Round r times every contender once, starting with contender r mod n, so that a slow drift of
the machine reaches all of them alike; the median over rounds is reported. A contender whose
`measure()` raises is marked `error` with the exception's first line and left out of later
rounds; the others go on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import machine

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHECK_TEXT = {"ok": "ok", "mismatch": "MISMATCH", "differs": "differs (low precision)", "error": "ERROR",
              "unchecked": "—", "skipped": "skipped"}


def first_line(error: BaseException) -> str:
    """`Type: first line of the message` (a compiler's message can run to pages)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


@dataclass
class Row:
    """One contender of one case (an optimizer, a model)."""

    case: str
    contender: str
    status: str = "ok"  # "ok" | "error" (raised: not timed further) | "skipped" (not on this device/torch)
    check: str = "unchecked"  # "ok" | "mismatch" | "differs" (bf16: reported, not wrong) | "error" | ...
    detail: str = ""  # why check or status is not ok (an exception's first line)
    first_call_s: float | None = None  # the first call (its compile) as measured, caches as found
    graphs: int | None = None  # graphs dynamo compiled for it (None: not compiled through dynamo)
    round_times: list[float] = field(default_factory=list)  # seconds per unit, one per round
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.round_times) if self.round_times and self.status == "ok" else None

    def fail(self, where: str, error: BaseException) -> None:
        self.status, self.detail = "error", f"{where}: {first_line(error)}"
        if self.check in ("unchecked", "ok"):
            self.check = "error"


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_block(fn: Callable[[], Any], device: str) -> float:
    """Seconds `fn()` takes, synchronized: CUDA events around it on a GPU, the wall clock on CPU."""
    synchronize(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def wall_time(fn: Callable[..., Any], device: str, *args: Any) -> tuple[Any, float]:
    """`fn(*args)`'s result and its synchronized wall time (a first call: compile included)."""
    synchronize(device)
    begin = time.perf_counter()
    result = fn(*args)
    synchronize(device)
    return result, time.perf_counter() - begin


def dynamo_graphs() -> int:
    """Graphs dynamo has compiled so far in this process (all backends)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def raised_recompile_limits() -> contextlib.AbstractContextManager:
    """Every contender compiles the same code object (`Optimizer.step`, `LlamaForCausalLM.forward`)
    for its own backend and objects: past dynamo's default of 8 entries a code object would run
    eager without a word. A context with the limits raised, and hitting them an error, not silent."""
    config = torch._dynamo.config
    changes: dict[str, Any] = {}
    for names, value in ((("recompile_limit", "cache_size_limit"), 256),
                         (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 4096),
                         (("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"), True)):
        name = next((n for n in names if hasattr(config, n)), None)  # torch renamed them: the newest name
        if name is not None:
            changes[name] = value
    return config.patch(**changes)


def run_rounds(rows: dict[str, Row], measures: dict[str, Callable[[], float]], rounds: int,
               progress: Callable[[str], None] | None = None) -> None:
    """Time every contender of `measures` once per round, the order rotating; failures recorded."""
    names = [name for name in measures if rows[name].status == "ok"]
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)] if names else []:
            row = rows[name]
            if row.status != "ok":
                continue
            try:
                row.round_times.append(measures[name]())
            except Exception as error:  # noqa: BLE001 - one contender's failure is its row's, not the run's
                row.fail(f"round {r + 1} of {rounds}", error)
        if progress is not None:
            progress(f"round {r + 1}/{rounds} done")


def select(names: Sequence[str], wanted: str | None, always: str) -> list[str]:
    """Contenders named in a comma-separated list: a name, or its prefix before `[` (`wrapgen`
    names every `wrapgen[...]`); `always` (the reference) is kept."""
    if not wanted:
        return list(names)
    tokens = [t.strip() for t in wanted.split(",") if t.strip()]
    for token in tokens:
        if not any(n == token or n.startswith(token + "[") for n in names):
            raise ValueError(f"unknown contender {token!r}; contenders are: {', '.join(names)}")
    return [n for n in names if n == always or any(n == t or n.startswith(t + "[") for t in tokens)]


# -- result files ----------------------------------------------------------------------------------


def header(info: machine.MachineInfo, title: str, settings: dict[str, Any], command: str) -> list[str]:
    lines = [f"# {title} — {info.device.upper()} — {info.date}", "", "| | |", "| --- | --- |",
             f"| date | {info.date} {info.time} |", f"| machine | {info.hostname} |",
             f"| CPU | {info.cpu} ({info.cores} logical cores; torch threads: {info.torch_threads}) |"]
    if info.device == "cuda":
        lines.append(f"| GPU | {info.gpu} (CUDA {info.cuda}) |")
    lines += [f"| python | {info.python} |", f"| torch | {info.torch} |",
              f"| triton | {info.triton or 'not installed'} |",
              f"| wrapgen | {info.wrapgen} (commit {info.wrapgen_commit or 'unknown'}) |"]
    lines += [f"| {key} | {value} |" for key, value in settings.items()]
    lines += [f"| command | `{command}` |", ""]
    return lines


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def failures(rows: Sequence[Row]) -> list[str]:
    """Markdown lists of the contenders that raised or differ, and of those not run (and why)."""
    lines = []
    bad = [r for r in rows if r.status == "error" or r.check not in ("ok", "unchecked", "skipped")]
    if bad:
        lines += ["## Failures and mismatches", ""]
        lines += [f"- **{r.case} / {r.contender}** — {r.status}, check {r.check}: `{cell(r.detail)[:500]}`" for r in bad]
        lines.append("")
    skipped = [r for r in rows if r.status == "skipped"]
    if skipped:
        lines += ["## Not run", ""]
        lines += [f"- **{r.case} / {r.contender}**: {cell(r.detail)[:300]}" for r in skipped]
        lines.append("")
    return lines


def write(out_dir: Path, stem: str, markdown: str, payload: dict[str, Any]) -> list[Path]:
    """`<stem>.md` and `<stem>.json` in `out_dir`; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, raw = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    md.write_text(markdown)
    raw.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return [md, raw]


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [asdict(r) | {"median_s": r.median_s} for r in rows]


def settle_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`args.device`: CUDA when available if not given; a parser error if CUDA was asked for and is missing."""
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")


def parse_common(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Add the options every step benchmark shares (--threads, --out-dir), parse, and settle the
    device (CUDA when available) and --small (the default off CUDA)."""
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    settle_device(parser, args)
    if args.small is None:
        args.small = args.device != "cuda"
    return args
