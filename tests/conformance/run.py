"""The full conformance run: every OpInfo op, every registered target, every mode.

    python -m tests.conformance.run [--ops 'add*' ...] [--max-samples N] [--jobs N]
                                    [--budget-s SECONDS] [--shard i/n] [--dtypes bfloat16 float16]
    python -m tests.conformance.run --from-json a.jsonl [b.jsonl ...]   # re-judge; merge shards

writes `benchmarks/results/conformance-<device>-<target>.md` for float32 samples and
`conformance-<device>-<target>-<dtype>.md` for bfloat16 / float16 ones
(`...shard-i-of-n.md` for a shard) and exits 1 when a *wrong* or *crash* is not in known_failures.py or an entry
there no longer fails, 3 when the run is otherwise clean but did not finish every op.

Samples run in worker processes (worker.py), one op at a time, handed out by a supervisor
(supervisor.py), cheapest ops first (schedule.py). Every result goes to the JSON-lines
journal as it arrives, and the reports are rewritten every `--report-every` seconds, so a
killed run still leaves what it did. With `--budget-s` the run stops handing out work when
the budget is spent, kills the workers, and writes the reports: the ops it did not get to
are listed there as *not run* (or *cut off*, when some of their samples ran).
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from . import schedule
from .journal import Journal, JournalWriter, lane, load
from .precision import DEFAULT_DTYPE, DTYPES

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "results"
DEFAULT_JSON = REPO / "build" / "conformance" / "results.jsonl"
REPORT_RESERVE_S = 5.0  # of the budget, kept for writing the reports at the end


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", nargs="*", help="targets to run (default: every registered one)")
    p.add_argument("--devices", nargs="*", help="devices (default: cpu, and cuda when available)")
    p.add_argument("--ops", nargs="*", help="fnmatch patterns of OpInfo keys (default: all)")
    p.add_argument("--modes", nargs="*", help="static dynamic inplace-static inplace-dynamic (default: all)")
    p.add_argument("--dtypes", nargs="+", default=[DEFAULT_DTYPE], choices=list(DTYPES),
                   help="sample dtypes, each a report of its own (default: float32)")
    p.add_argument("--max-samples", type=int, default=0, help="samples per op and mode, 0 = every sample")
    p.add_argument("--jobs", type=int, help="worker processes (default: one per CPU; at most 8 with CUDA)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per sample and target")
    p.add_argument("--recycle", type=int, default=25, help="ops a worker runs before a fresh one replaces it")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="wall-clock seconds for the whole run, reports included; 0 = no limit")
    p.add_argument("--shard", help="i/n: run every n-th op of the (cheapest first) order, starting at the i-th")
    p.add_argument("--report-every", type=float, default=60.0, help="seconds between rewrites of the partial reports")
    p.add_argument("--costs", type=Path, default=schedule.COSTS_PATH,
                   help="seconds per op from a measured run, to order ops cheapest first")
    p.add_argument("--write-costs", type=Path, help="write this run's seconds per op here (for --costs)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the markdown reports")
    p.add_argument("--json", type=Path, help=f"the journal: every result as JSON lines (default: {DEFAULT_JSON})")
    p.add_argument("--from-json", type=Path, nargs="+", help="write the reports from earlier journals; run nothing")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.shard:
        try:
            args.shard = schedule.parse_shard(args.shard)
        except ValueError as err:
            p.error(str(err))
    if args.budget_s < 0:
        p.error("--budget-s must be >= 0")
    return args


def _suffix(shard: tuple[int, int] | list | None) -> str:
    return f".shard-{shard[0]}-of-{shard[1]}" if shard else ""


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plan(args: argparse.Namespace, argv: list[str] | None) -> tuple[dict, list[dict]]:
    """The run's description (the journal's first record) and its tasks, cheapest first."""
    import torch

    import wrapgen

    from .harness import MODE_BY_NAME, MODES, devices, modes_for, op_database, ops_for

    targets = args.targets or wrapgen.backends.registered_backends()
    unknown = [t for t in targets if t not in wrapgen.backends.registered_backends()]
    if unknown:
        raise SystemExit(f"unknown target(s) {unknown}; registered: {wrapgen.backends.registered_backends()}")
    device_list = args.devices or devices()
    modes = args.modes or [m.name for m in MODES]
    bad_modes = [m for m in modes if m not in MODE_BY_NAME]
    if bad_modes:
        raise SystemExit(f"unknown mode(s) {bad_modes}; modes are {list(MODE_BY_NAME)}")
    if args.jobs is None:
        cpus = os.cpu_count() or 1
        args.jobs = min(cpus, 8) if any(d.startswith("cuda") for d in device_list) else cpus
    costs = schedule.load_costs(args.costs)
    dtypes = list(dict.fromkeys(args.dtypes))
    tasks: list[dict] = []
    for device in device_list:
        for dtype in dtypes:
            keys = ops_for(device.split(":")[0], DTYPES[dtype])
            if args.ops:
                keys = [k for k in keys if any(fnmatch.fnmatchcase(k, p) for p in args.ops)]
            tasks += [
                {"device": device, "op": k, "targets": targets, "modes": modes, "max_samples": args.max_samples,
                 "timeout": args.timeout, "dtype": dtype, "skip": []}
                for k in keys
            ]
    ordered = schedule.order(list(dict.fromkeys(t["op"] for t in tasks)), costs)
    rank = {op: i for i, op in enumerate(ordered)}
    tasks.sort(key=lambda t: (rank[t["op"]], device_list.index(t["device"]), dtypes.index(t["dtype"])))
    if args.shard:
        tasks = schedule.take_shard(tasks, *args.shard)
    planned: dict[str, dict[str, list[str]]] = {lane(d, dt): {} for d in device_list for dt in dtypes}
    for t in tasks:
        op_modes = modes_for(op_database()[t["op"]], [MODE_BY_NAME[m] for m in modes])
        planned[lane(t["device"], t["dtype"])][t["op"]] = [m.name for m in op_modes]
    info = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node() or 'unknown'}, {platform.machine()}, {os.cpu_count()} CPUs",
        "cuda": {d: torch.cuda.get_device_name(d) for d in device_list if d.startswith("cuda")},
        "versions": f"torch {torch.__version__}, wrapgen {wrapgen.__version__} (git {_git_commit()}), "
        f"Python {platform.python_version()}",
        "targets": targets,
        "devices": device_list,
        "modes": modes,
        "dtypes": dtypes,
        "ops": args.ops,
        "max_samples": args.max_samples,
        "jobs": args.jobs,
        "budget_s": args.budget_s,
        "shard": list(args.shard) if args.shard else None,
        "planned": planned,
        "command": "python -m tests.conformance.run " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    return info, tasks


def _run(args: argparse.Namespace, argv: list[str] | None, began: float) -> Journal:
    from .supervisor import Settings, supervise

    info, tasks = plan(args, argv)
    json_path = args.json or DEFAULT_JSON.with_name(f"results{_suffix(args.shard)}.jsonl")
    writer = JournalWriter(json_path, info)
    print(f"conformance: {len(tasks)} ops x {len(info['targets'])} target(s) {info['targets']} on {info['devices']}, "
          f"dtypes {info['dtypes']}, modes {info['modes']}, "
          f"{'every sample' if not args.max_samples else f'up to {args.max_samples} samples'} per op, "
          f"{args.jobs} worker(s)"
          + (f", budget {args.budget_s:g} s" if args.budget_s else "")
          + (f", shard {args.shard[0]}/{args.shard[1]}" if args.shard else ""), file=sys.stderr)
    print(f"journal: {json_path}", file=sys.stderr)
    deadline = began + args.budget_s - REPORT_RESERVE_S if args.budget_s else None
    settings = Settings(args.jobs, args.recycle, args.timeout, info["devices"], deadline, args.report_every,
                        not args.no_progress)

    def journal_of(outcome) -> Journal:
        return Journal(info, list(outcome.results.values()), dict(outcome.done), list(outcome.startups))

    def checkpoint(outcome) -> None:
        partial = journal_of(outcome)
        partial.info = {**info, "elapsed_s": round(time.monotonic() - began, 1), "stopped": "still running"}
        write_reports(args, partial, quiet=True)

    try:
        outcome = supervise(settings, tasks, info["targets"], writer, checkpoint)
        elapsed = time.monotonic() - began
        writer.end(elapsed, outcome.stopped)
    finally:
        writer.close()
    print(f"worker logs: {outcome.log_dir}", file=sys.stderr)
    journal = journal_of(outcome)
    journal.info = {**info, "elapsed_s": round(elapsed, 1), "stopped": outcome.stopped}
    return journal


def write_reports(args: argparse.Namespace, journal: Journal, quiet: bool = False) -> int:
    """Write one report per device, sample dtype and target; the exit status the run's verdicts call for."""
    from .report import Coverage, half_entries_not_run, known_entries_not_run, render, write_report

    info = journal.info
    status = 0
    incomplete = False
    shard = info.get("shard") if len(info.get("shards", [info.get("shard")])) <= 1 else None
    dtypes = info.get("dtypes") or [DEFAULT_DTYPE]
    for device, dtype in [(d, dt) for d in info["devices"] for dt in dtypes]:
        not_run, cut_off = journal.unfinished(device, dtype)
        incomplete = incomplete or bool(not_run or cut_off)
        coverage = Coverage(journal.planned(device, dtype), not_run, cut_off,
                            {op: s for (d, op), s in journal.done.items() if d == lane(device, dtype)}, journal.workers)
        for target in info["targets"]:
            mine = [r for r in journal.results if r.device == device and r.target == target and r.dtype == dtype]
            text, verdicts = render(mine, device, target, _header(info, device, coverage, dtype), info["modes"],
                                    coverage, dtype)
            named = "" if dtype == DEFAULT_DTYPE else f"-{dtype}"
            path = args.out / f"conformance-{device.replace(':', '')}-{target}{named}{_suffix(shard)}.md"
            write_report(path, text)
            if verdicts.unexpected or verdicts.stale:
                status = 1
            if quiet:
                continue
            print(f"{path}: {len(verdicts.unexpected)} unexpected, {len(verdicts.known)} known, "
                  f"{len(verdicts.stale)} stale, {len(not_run)} ops not run, {len(cut_off)} cut off", file=sys.stderr)
            for s in verdicts.unexpected:
                print(f"  unexpected: {s.op} ({s.mode}): {sorted(set(s.failing.values()))}", file=sys.stderr)
            for op, mode, _ in verdicts.stale:
                print(f"  stale: {op} ({mode})", file=sys.stderr)
    if not info.get("ops") and not shard and not incomplete:
        ran = {r.op for r in journal.results}
        missing = known_entries_not_run(ran) if DEFAULT_DTYPE in dtypes else []
        missing += half_entries_not_run(ran) if set(dtypes) - {DEFAULT_DTYPE} else []
        if missing:
            if not quiet:
                print(f"known_failures.py names ops that did not run: {missing}", file=sys.stderr)
            status = 1
    return status or (3 if incomplete else 0)


def _header(info: dict, device: str, coverage, dtype: str = DEFAULT_DTYPE) -> dict[str, str]:
    shards = [s for s in info.get("shards", []) if s]
    stopped = info.get("stopped", "")
    return {
        "date": info["date"],
        "machine": info["machine"] + (f", {info['cuda'][device]}" if device in info.get("cuda", {}) else ""),
        "versions": info["versions"],
        "ops": f"{len(coverage.planned)} OpInfo ops with {dtype} support on {device}"
        + (f" matching {' '.join(info['ops'])}" if info.get("ops") else "")
        + (f" (shard {info['shard'][0]} of {info['shard'][1]})" if info.get("shard") and len(shards) <= 1 else "")
        + (f" (merged from {len(shards)} shards)" if len(shards) > 1 else ""),
        "targets": ", ".join(info["targets"]),
        "samples": "every sample" if not info["max_samples"]
        else f"up to {info['max_samples']} per op, spread evenly over its samples (first and last included)",
        "modes": ", ".join(info["modes"]),
        "run time": f"{info.get('elapsed_s', 0) / 60:.1f} min with {info['jobs']} worker process(es)"
        + (f" ({' + '.join(f'{s / 60:.1f}' for s in info['runs_s'])} min in {len(info['runs_s'])} runs)"
           if len(info.get("runs_s", [])) > 1 else "")
        + (f", budget {info['budget_s']:g} s" if info.get("budget_s") else ""),
        "finished": {"finished": "yes, every op", "budget": "no: the budget ran out",
                     "still running": "no: partial report of a run still going (or killed)",
                     "SIGTERM": "no: stopped by SIGTERM", "interrupted": "no: interrupted"}.get(
                         stopped, stopped or "no: the journal has no end (killed?)"),
        "command": " ; ".join(_short_command(c) for c in info["command"].split(" ; ")),
    }


def _short_command(command: str, shown: int = 6) -> str:
    """The command, with a long --ops list (a rerun of the ops a budget left out) counted, not spelled out."""
    words = command.split(" ")
    if "--ops" not in words:
        return command
    start = words.index("--ops") + 1
    end = next((i for i in range(start, len(words)) if words[i].startswith("--")), len(words))
    if end - start <= shown:
        return command
    return " ".join([*words[:start], *words[start : start + shown], f"... ({end - start} ops)", *words[end:]])


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()
    args = parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    if args.from_json:
        journal = load(args.from_json)
        if not journal.info:
            raise SystemExit(f"{args.from_json}: no run record")
        complete = not any(any(journal.unfinished(d, dt)) for d in journal.info["devices"]
                           for dt in journal.info.get("dtypes") or [DEFAULT_DTYPE])
        if complete:
            journal.info["stopped"] = "finished"
        elif len(journal.ends) == len(args.from_json):
            journal.info["stopped"] = next((e["stopped"] for e in journal.ends if e["stopped"] != "finished"), "finished")
        else:
            journal.info["stopped"] = ""
        journal.info["elapsed_s"] = sum(e["elapsed_s"] for e in journal.ends)
        journal.info["runs_s"] = [e["elapsed_s"] for e in journal.ends]
    else:
        journal = _run(args, argv, began)
    if args.write_costs:
        seconds = {op: s for (_d, op), s in journal.done.items()}
        schedule.write_costs(args.write_costs, seconds, journal.info["command"] + " on " + journal.info["machine"])
    return write_reports(args, journal)


if __name__ == "__main__":
    sys.exit(main())
