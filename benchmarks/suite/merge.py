"""Join suite runs into one page: the slices of one run cut to fit a machine's time limit, and
runs of the same device in other dtypes (each model then named `<model> @<dtype>`, its suite
`<suite> (<dtype>)`).

    python -m benchmarks.suite.merge RUN.json [RUN.json ...] [--mixed-code] [--out-dir DIR]

The page is named as a run of every suite and dtype it holds would be, after the last run's
machine, date and commit. The runs must share a device and machine, and a commit unless
`--mixed-code` is given: then the page names the code each model ran (a commit, or a modified
tree's hash), and a model run again in a later run keeps only its latest rows (a rerun after a
fix); without it, a model in two runs of one dtype is refused.
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


def merge(runs: list[Report], mixed_code: bool = False) -> Report:
    """One report of `runs` (same device and machine, and commit unless `mixed_code`; see the
    module's docstring for a model in two runs)."""
    last = runs[-1]

    def where(run: Report) -> tuple[str, ...]:
        place = (run.info.device, machine.machine_tag(run.info))
        return place if mixed_code else (*place, machine.commit_tag(run.info))

    for run in runs[:-1]:
        if where(run) != where(last):
            raise ValueError(f"a run of another device, machine or commit: {where(run)} against {where(last)}"
                             + ("" if mixed_code else " (--mixed-code joins runs of different code)"))
    dtypes = sorted({d for r in runs for d in r.extra.get("dtype", "").split("/")})
    tagged = len(dtypes) > 1
    workloads: dict[str, str] = {}
    results: list[Result] = []
    suites: dict[str, str] = {}
    code: dict[str, str] = {}
    commands: list[str] = []
    for run in runs:
        dtype = run.extra.get("dtype")

        def name(workload: str, dtype: str = dtype) -> str:  # a merged page's names are tagged already
            return f"{workload} @{dtype}" if tagged and " @" not in workload else workload

        for workload, sizes in run.workloads.items():
            if name(workload) in workloads:
                if not mixed_code:
                    raise ValueError(f"{name(workload)} is in two runs")
                results = [r for r in results if r.workload != name(workload)]  # the later run's rows stand
            workloads[name(workload)] = sizes
            code[name(workload)] = run.extra.get("code", {}).get(workload) or run.info.wrapgen_commit or "unknown"
        results += [dataclasses.replace(r, workload=name(r.workload)) for r in run.results]
        for key, suite in run.extra.get("suites", {}).items():
            suites[name(key)] = f"{suite} ({dtype})" if tagged and "(" not in suite else suite
        commands += run.extra.get("commands") or [run.extra.get("command", "")]
    extra = {**last.extra, "dtype": "/".join(dtypes), "suites": suites, "commands": commands,
             "lowering": {k: v for r in runs for k, v in r.extra.get("lowering", {}).items()},
             "not_built": {k: v for r in runs for k, v in r.extra.get("not_built", {}).items()}}
    extra["command"] = " ; ".join(commands)
    if len(set(code.values())) > 1:
        extra["code"] = code
    return Report(info=last.info, profile=last.profile, plan=last.plan, copy_bandwidth=last.copy_bandwidth,
                  copy_buffer_bytes=0, workloads=workloads, results=results,
                  elapsed_s=sum(r.elapsed_s for r in runs), rounds=max(r.rounds for r in runs), extra=extra)


def page_name(merged: Report) -> str:
    """`suite-<suites>-<dtypes>-<size>[-training]`, as `run.suite_name` names a run of it all."""
    present = set(merged.extra.get("suites", {}).values())
    suites = "-".join(s for s in catalog.SUITES if any(p.split(" ")[0] == s for p in present))
    dtypes = merged.extra["dtype"].replace("/", "-")
    training = any(w.split(" @")[0].endswith(catalog.TRAINING_SUFFIX) for w in merged.workloads)
    return f"suite-{suites}-{dtypes}-{merged.extra.get('size')}" + ("-training" if training else "")


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the runs' .json files")
    parser.add_argument("--mixed-code", action="store_true",
                        help="join runs of different code; a model's latest run replaces its earlier ones")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        merged = merge([load(path) for path in args.runs], mixed_code=args.mixed_code)
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
