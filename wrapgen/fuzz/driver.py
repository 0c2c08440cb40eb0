"""The fuzzing loop: generate, check every variant, shrink each failure to a reproducer, report."""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from wrapgen.backends.registry import registered_backends
from wrapgen.fuzz.generator import FuzzProgram, generate
from wrapgen.fuzz.reproducer import write_reproducer
from wrapgen.fuzz.runner import EagerRefused, NotCaptured, Outcome, check, still_fails, variants
from wrapgen.fuzz.shrinker import shrink


@dataclass
class Finding:
    program: FuzzProgram  # as generated
    outcomes: list[Outcome]  # every variant that failed
    shrunk: FuzzProgram
    reproducer: Path


@dataclass
class FuzzReport:
    programs: int = 0  # checked against every variant
    skipped: int = 0  # eager refused them
    not_captured: int = 0  # torch.export refused them
    refused: int = 0  # variants that refused a line (documented UnsupportedLineError)
    findings: list[Finding] = field(default_factory=list)

    @property
    def summary(self) -> str:
        return f"{self.programs} programs, {len(self.findings)} mismatches"


def fuzz(
    seconds: float,
    seed: int = 0,
    out_dir: str | Path = "build/fuzz",
    targets: list[str] | None = None,
    programs: int | None = None,
    shrink_seconds: float = 30.0,
    log: TextIO | None = sys.stderr,
) -> FuzzReport:
    """Check generated programs until `seconds` have passed (or `programs` were checked)."""
    chosen = variants(targets or registered_backends())
    report = FuzzReport()
    start = time.monotonic()
    index = 0
    while time.monotonic() - start < seconds and (programs is None or report.programs < programs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's and torch.export's, about the random programs
            program = generate(seed, index)
            status = _check_one(program, chosen, report, Path(out_dir), shrink_seconds)
        index += 1
        if log is not None:
            elapsed = time.monotonic() - start
            print(f"[fuzz {elapsed:6.1f}s] {program.name}: {status}  ({report.summary})", file=log, flush=True)
    return report


def _check_one(program: FuzzProgram, chosen: list, report: FuzzReport, out_dir: Path, shrink_seconds: float) -> str:
    shape = f"{'dynamic' if program.dynamic else 'static'}, {len(program.statements)} statements"
    try:
        outcomes = check(program, chosen)
    except EagerRefused:
        report.skipped += 1
        return "skipped: eager refuses it"
    except NotCaptured:
        report.not_captured += 1
        return "skipped: torch.export cannot capture it"
    report.programs += 1
    refused = [o for o in outcomes if o.kind == "refused"]
    report.refused += len(refused)
    if refused:
        shape += f"; {len(refused)} refused, e.g. {refused[0].variant.label}: {refused[0].message.splitlines()[0][:120]}"
    failed = [o for o in outcomes if o.kind in ("wrong", "error")]
    if not failed:
        return f"ok ({shape}, {len(outcomes)} variants)"
    first = failed[0]
    shrunk = shrink(program, lambda p: still_fails(p, first.variant, first.signature), shrink_seconds)
    shrunk_outcome = check(shrunk, [first.variant])[0] if shrunk != program else first
    path = write_reproducer(shrunk, shrunk_outcome, out_dir)
    report.findings.append(Finding(program, failed, shrunk, path))
    labels = ", ".join(o.variant.label for o in failed)
    return f"MISMATCH ({shape}) in {labels}: {first.kind}: {first.message.splitlines()[0][:160]} -> {path}"
