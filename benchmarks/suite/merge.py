"""Join suite runs into one page: the slices of one run cut to fit a machine's time limit, and
runs of the same device in other dtypes (each model then named `<model> @<dtype>`, its suite
`<suite> (<dtype>)`).

    python -m benchmarks.suite.merge RUN.json [RUN.json ...] [--out-dir DIR]

The page is named as a run of every suite and dtype it holds would be, after the first run's
machine, date and commit; the runs must share a device, machine and commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks import machine, report
from benchmarks.report import Report, Result
from benchmarks.suite import catalog, page

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
_RESULT_FIELDS = {f.name for f in dataclasses.fields(Result)}


def load(path: Path) -> Report:
    """A suite run back from its `.json`."""
    raw = json.loads(path.read_text())
    return Report(info=machine.MachineInfo(**raw["machine"]), profile=raw["profile"], plan=raw["plan"],
                  copy_bandwidth=raw.get("copy_bandwidth_bytes_per_s"), copy_buffer_bytes=0,
                  workloads=raw["workloads"], results=[Result(**{k: v for k, v in r.items() if k in _RESULT_FIELDS})
                                                      for r in raw["results"]],
                  rounds=raw.get("rounds", 1), extra=raw.get("settings", {}), elapsed_s=raw.get("elapsed_s", 0.0))


def merge(runs: list[Report]) -> Report:
    """One report of `runs` (same device, machine and commit; a model in two runs of one dtype
    is refused)."""
    first = runs[0]
    def where(run: Report) -> tuple[str, str, str]:
        return run.info.device, machine.machine_tag(run.info), machine.commit_tag(run.info)

    for run in runs[1:]:
        if where(run) != where(first):
            raise ValueError(f"a run of another device, machine or commit: {where(run)} against {where(first)}")
    dtypes = sorted({r.extra.get("dtype") for r in runs})
    tagged = len(dtypes) > 1
    workloads: dict[str, str] = {}
    results: list[Result] = []
    suites: dict[str, str] = {}
    commands: list[str] = []
    for run in runs:
        dtype = run.extra.get("dtype")

        def name(workload: str, dtype: str = dtype) -> str:
            return f"{workload} @{dtype}" if tagged else workload

        for workload, sizes in run.workloads.items():
            if name(workload) in workloads:
                raise ValueError(f"{name(workload)} is in two runs")
            workloads[name(workload)] = sizes
        results += [dataclasses.replace(r, workload=name(r.workload)) for r in run.results]
        for key, suite in run.extra.get("suites", {}).items():
            suites[name(key)] = f"{suite} ({dtype})" if tagged else suite
        commands.append(run.extra.get("command", ""))
    extra = {**first.extra, "dtype": "/".join(dtypes), "suites": suites, "commands": commands,
             "lowering": {k: v for r in runs for k, v in r.extra.get("lowering", {}).items()},
             "not_built": {k: v for r in runs for k, v in r.extra.get("not_built", {}).items()}}
    extra["command"] = " ; ".join(commands)
    return Report(info=first.info, profile=first.profile, plan=first.plan, copy_bandwidth=first.copy_bandwidth,
                  copy_buffer_bytes=0, workloads=workloads, results=results,
                  elapsed_s=sum(r.elapsed_s for r in runs), rounds=max(r.rounds for r in runs), extra=extra)


def page_name(merged: Report) -> str:
    present = set(merged.extra.get("suites", {}).values())
    suites = "-".join(s for s in catalog.SUITES if any(p.split(" ")[0] == s for p in present))
    dtypes = merged.extra["dtype"].replace("/", "-")
    return f"suite-{suites}-{dtypes}-{merged.extra.get('size')}"


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the runs' .json files")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        merged = merge([load(path) for path in args.runs])
    except ValueError as error:
        parser.error(str(error))
    paths = report.write(merged, args.out_dir, machine.file_stem(merged.info, page_name(merged)), render=page.markdown)
    print("\n".join(page.summary_table(merged)))
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
