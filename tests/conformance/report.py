"""Aggregate per-sample results and write `conformance-<device>-<target>[-<dtype>].md`."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import CAPTURE_FAILED, CLASSES, CRASH, FAILING, FALLBACK, FLOAT_REFERENCE_NOTE, SKIPPED, WRONG, worst
from .known_failures import HALF_FAILURES, KNOWN_FAILURES, Known, verdict
from .precision import default_tolerance, dtype_of


@dataclass(frozen=True)
class Result:
    """One sample (of `dtype`) of one op in one mode for one target on one device (`index` -1:
    the op's samples could not be made)."""

    device: str
    target: str
    op: str
    mode: str
    index: int
    cls: str
    reason: str = ""
    fallbacks: tuple[str, ...] = ()
    dtype: str = "float32"


@dataclass
class OpSummary:
    """All samples of one op in one mode: its class is the worst among them."""

    op: str
    mode: str
    results: list[Result] = field(default_factory=list)

    @property
    def cls(self) -> str:
        return worst([r.cls for r in self.results])

    @property
    def failing(self) -> dict[int, str]:
        """Sample index -> wrong/crash, for the samples that failed."""
        return {r.index: r.cls for r in self.results if r.cls in FAILING}

    @property
    def ran(self) -> set[int]:
        return {r.index for r in self.results}

    def first(self, cls: str) -> Result:
        return next(r for r in self.results if r.cls == cls)

    def count(self, cls: str) -> int:
        return sum(r.cls == cls for r in self.results)


@dataclass
class Coverage:
    """What the run set out to do on a device and what it did not get to."""

    planned: Mapping[str, Sequence[str]] = field(default_factory=dict)  # op -> its modes
    not_run: Sequence[str] = ()  # planned ops without any result (the budget ran out first)
    cut_off: Sequence[str] = ()  # ops stopped part way: some of their samples have results
    seconds: Mapping[str, float] = field(default_factory=dict)  # finished op -> wall seconds
    startups: Sequence[Mapping[str, Any]] = ()  # each worker's startup seconds by stage

    def missing(self, mode: str, summaries: Mapping[tuple[str, str], Any]) -> list[str]:
        """Planned ops with no result in `mode`."""
        return [op for op, modes in self.planned.items() if mode in modes and (op, mode) not in summaries]


@dataclass
class Verdicts:
    known: list[tuple[OpSummary, Known]] = field(default_factory=list)
    unexpected: list[OpSummary] = field(default_factory=list)
    stale: list[tuple[str, str, Known]] = field(default_factory=list)  # (op, mode, entry)


def summarize(results: Iterable[Result]) -> dict[tuple[str, str], OpSummary]:
    summaries: dict[tuple[str, str], OpSummary] = {}
    for r in results:
        summaries.setdefault((r.op, r.mode), OpSummary(r.op, r.mode)).results.append(r)
    return summaries


def judge(summaries: dict[tuple[str, str], OpSummary], target: str, device: str, dtype: str = "float32") -> Verdicts:
    """Hold each op's failures against the known-failures list; entries for ops that ran and
    did not fail are stale."""
    out = Verdicts()
    for (op, mode), summary in sorted(summaries.items()):
        status, entry = verdict(op, mode, target, device, summary.failing, summary.ran, dtype)
        if status == "known":
            out.known.append((summary, entry))
        elif status == "unexpected":
            out.unexpected.append(summary)
        elif status == "stale":
            out.stale.append((op, mode, entry))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _count_table(rows: Sequence[tuple[str, collections.Counter]], not_run: Mapping[str, int] | None = None) -> list[str]:
    """Counts per class and mode; with `not_run`, a column of planned ops that have no result."""
    extra = ["not run"] if not_run is not None else []
    lines = ["| mode | " + " | ".join([*CLASSES, *extra]) + " | total |", "|---" * (len(CLASSES) + len(extra) + 2) + "|"]
    for name, counts in rows:
        missing = [] if not_run is None else [not_run.get(name, 0)]
        total = sum(counts.values()) + sum(missing)
        lines.append(f"| {name} | " + " | ".join([*(str(counts[c]) for c in CLASSES), *map(str, missing)]) + f" | {total} |")
    return lines


def render(
    results: Sequence[Result],
    device: str,
    target: str,
    header: dict[str, str],
    modes: Sequence[str],
    coverage: Coverage | None = None,
    dtype: str = "float32",
) -> tuple[str, Verdicts]:
    """The markdown report for one device, target and sample dtype, and its verdicts (an op
    that was cut off cannot be stale: its failing samples may be among those that did not run)."""
    coverage = coverage or Coverage()
    summaries = summarize(results)
    verdicts = judge(summaries, target, device, dtype)
    verdicts.stale = [v for v in verdicts.stale if v[0] not in set(coverage.cut_off)]
    known_ids = {(s.op, s.mode) for s, _ in verdicts.known}
    title = f"{device} / {target}" + ("" if dtype == "float32" else f" / {dtype}")
    lines = [f"# wrapgen conformance: {title}", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += [
        "",
        f"Each {dtype} OpInfo sample, compiled with `wrapgen.compile` and compared with eager "
        "(`tests/conformance/harness.py` defines the classes; `tests/conformance/fallbacks.py` what counts "
        "as a fallback). An op's class in a mode is the worst class among its samples.",
        "",
        *([] if dtype == "float32" else [
            f"Tolerances: assert_close's {dtype} defaults (rtol {default_tolerance(dtype_of(dtype))[0]:g}, atol "
            f"{default_tolerance(dtype_of(dtype))[1]:g}), raised to the OpInfo's own {dtype} `toleranceOverride` where "
            "it has one. wrapgen's kernels compute in float32 and round once where they store, where eager rounds "
            "after every kernel it runs, so a result passes when it matches eager *or* the float32 reference "
            f"(the sample run on float32 copies of its {dtype} tensors, rounded back: the oracle of Inductor's "
            "CPU OpInfo tests) within them; `tests/conformance/precision.py` says more.",
            "",
        ]),
        f"**Unexpected wrong/crash: {len(verdicts.unexpected)}** · known failures (xfail): {len(verdicts.known)} "
        f"· stale known-failure entries (now pass): {len(verdicts.stale)}"
        f" · **ops not run: {len(coverage.not_run)}** · ops cut off part way: {len(coverage.cut_off)}",
        "",
        "## Samples per class",
        "",
    ]
    by_mode = {m: collections.Counter() for m in modes}
    ops_by_mode = {m: collections.Counter() for m in modes}
    for r in results:
        by_mode.setdefault(r.mode, collections.Counter())[r.cls] += 1
    for s in summaries.values():
        ops_by_mode.setdefault(s.mode, collections.Counter())[s.cls] += 1
    lines += _count_table(list(by_mode.items()))
    lines += ["", "## Ops per class (worst sample)", ""]
    if coverage.planned:
        lines += ["*not run*: ops planned in the mode without a single result in it (see Not run below).", ""]
        missing = {m: len(coverage.missing(m, summaries)) for m in ops_by_mode}
        lines += _count_table(list(ops_by_mode.items()), missing)
    else:
        lines += _count_table(list(ops_by_mode.items()))
    _unfinished_section(lines, coverage)

    def failing_section(title: str, cls: str, note: str) -> None:
        rows = [s for s in summaries.values() if cls in {r.cls for r in s.results}]
        rows.sort(key=lambda s: (s.op, modes.index(s.mode) if s.mode in modes else 99))
        lines.extend(["", f"## {title} ({len(rows)} op-modes)", ""])
        if note:
            lines.extend([note, ""])
        if not rows:
            lines.append("None.")
            return
        lines.append("| op | mode | samples | status | reason (first such sample) |")
        lines.append("|---|---|---|---|---|")
        for s in rows:
            first = s.first(cls)
            status = "" if cls not in FAILING else "known" if (s.op, s.mode) in known_ids else "**unexpected**"
            lines.append(
                f"| `{s.op}` | {s.mode} | {s.count(cls)}/{len(s.results)} | {status} | #{first.index}: {_cell(first.reason)} |"
            )

    failing_section("Wrong", WRONG, "Our result differs from eager's.")
    failing_section("Crash", CRASH, "wrapgen raised, or timed out, on a program torch.export captured.")
    failing_section("Capture failed", CAPTURE_FAILED, "torch.export could not trace the sample: torch's limit, counted apart.")
    if dtype != "float32":
        _reference_section(lines, results)

    lines.extend(["", f"## Stale known failures ({len(verdicts.stale)})", ""])
    if verdicts.stale:
        lines.append("Listed in `tests/conformance/known_failures.py` but no longer failing: delete the entries.")
        lines.append("")
        lines += [f"- `{op}` ({mode}): {_cell(entry.reason)}" for op, mode, entry in verdicts.stale]
    else:
        lines.append("None.")

    skipped: dict[str, list[str]] = collections.defaultdict(list)
    for s in summaries.values():
        for r in s.results:
            if r.cls == SKIPPED:
                skipped[r.reason].append(f"{r.op} ({r.mode} #{r.index})")
    lines.extend(["", f"## Skipped samples ({sum(len(v) for v in skipped.values())})", ""])
    lines.append("Not comparable, with the reason (eager's own failures on a sample, random or nondeterministic ops).")
    lines.append("")
    lines.append("| reason | samples | ops |")
    lines.append("|---|---|---|")
    for reason, where in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        ops = sorted({w.split(" (")[0] for w in where})
        shown = ", ".join(f"`{o}`" for o in ops[:12]) + (f", … ({len(ops)} ops)" if len(ops) > 12 else "")
        lines.append(f"| {_cell(reason)} | {len(where)} | {shown} |")

    fallback_users: dict[str, set[str]] = collections.defaultdict(set)
    for r in results:
        if r.cls == FALLBACK:
            for name in r.fallbacks:
                fallback_users[name].add(r.op)
    lines.extend(["", f"## ATen fallbacks ({len(fallback_users)} distinct ops)", ""])
    lines.append("Ops that ran as ATen fallbacks in correct programs, by how many OpInfo ops needed them.")
    lines.append("")
    lines.append("| ATen op | OpInfo ops |")
    lines.append("|---|---|")
    for name, users in sorted(fallback_users.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| `{name}` | {len(users)} |")
    _timing_section(lines, coverage)
    return "\n".join(lines) + "\n", verdicts


def _reference_section(lines: list[str], results: Sequence[Result]) -> None:
    """Half samples that passed against the float32 reference but differ from eager by more
    than the tolerance (eager's rounding of intermediates), so a reader sees how many."""
    matched = sorted({f"`{r.op}` ({r.mode})" for r in results if FLOAT_REFERENCE_NOTE in r.reason})
    lines.extend(["", f"## Matched the float32 reference, not eager ({len(matched)} op-modes)", ""])
    lines.append("Counted as pass / fallback: within the tolerances of the sample run in float32 and rounded back "
                 "once, as wrapgen's kernels compute it, but not of eager, which rounds after each kernel.")
    lines.extend(["", ", ".join(matched) if matched else "None."])


def _op_list(ops: Sequence[str]) -> str:
    return ", ".join(f"`{op}`" for op in ops) if ops else "None."


def _unfinished_section(lines: list[str], coverage: Coverage) -> None:
    lines.extend(["", f"## Not run ({len(coverage.not_run)} ops)", ""])
    if coverage.not_run:
        lines.extend(["Planned, but the run stopped (budget, SIGTERM, killed) before any of their samples ran.", ""])
    lines.append(_op_list(coverage.not_run))
    lines.extend(["", f"## Cut off ({len(coverage.cut_off)} ops)", ""])
    if coverage.cut_off:
        lines.extend(["Running when the run stopped: the samples that finished are counted above, the rest did not run.", ""])
    lines.append(_op_list(coverage.cut_off))


def _timing_section(lines: list[str], coverage: Coverage) -> None:
    if not coverage.seconds and not coverage.startups:
        return
    lines.extend(["", "## Where the time went", ""])
    if coverage.startups:
        stages = sorted({k for s in coverage.startups for k in s})
        medians = ", ".join(f"{k.removesuffix('_s')} {statistics.median(s.get(k, 0.0) for s in coverage.startups):.1f} s"
                            for k in stages)
        lines.append(f"- worker startups: {len(coverage.startups)}, median by stage: {medians}")
    if coverage.seconds:
        total = sum(coverage.seconds.values())
        lines.append(f"- finished ops: {len(coverage.seconds)}, {total / 60:.1f} worker-minutes, "
                     f"median {statistics.median(coverage.seconds.values()):.1f} s per op")
        slow = sorted(coverage.seconds.items(), key=lambda kv: -kv[1])[:15]
        lines.append("- slowest: " + ", ".join(f"`{op}` {s:.0f} s" for op, s in slow))


def write_report(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def known_entries_not_run(ran_ops: set[str]) -> list[str]:
    """Known-failure keys that name no op of the run (typos, renamed OpInfos)."""
    return sorted(k for k in KNOWN_FAILURES if k not in ran_ops)


def half_entries_not_run(ran_ops: set[str]) -> list[str]:
    """HALF_FAILURES keys that name no op of a half-precision run."""
    return sorted(k for k in HALF_FAILURES if k not in ran_ops)
