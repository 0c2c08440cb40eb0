"""The benchmark harness in --quick mode: it writes its files, and a contender that raises or
computes a wrong answer is reported as such while the run goes on. Nothing here is about speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level package of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks import contenders, run, workloads  # noqa: E402
from benchmarks.contenders import Contender  # noqa: E402
from benchmarks.report import Report, Result  # noqa: E402

BUILDS_THAT_RAISED: list[str] = []


def _raises_at_build(model, inputs):
    BUILDS_THAT_RAISED.append(type(model).__name__)
    raise RuntimeError("broken at build")


def _raises_at_call(model, inputs):
    def call(*args):
        raise ValueError("broken at call")

    return call


def _wrong(model, inputs):
    def call(*args):
        out = model(*args)
        return out + 1.0

    return call


BROKEN = [
    Contender("broken_build", _raises_at_build),
    Contender("broken_call", _raises_at_call),
    Contender("wrong_answer", _wrong),
]


def test_quick_run_writes_files_and_reports_failures(tmp_path: Path) -> None:
    argv = [
        "--device=cpu",
        "--quick",
        "--workloads=softmax,tiny_chain_50",
        "--contenders=wrapgen",
        "--repeats=1",
        "--rounds=2",
        f"--out-dir={tmp_path}",
        "--no-progress",
    ]
    BUILDS_THAT_RAISED.clear()
    paths = run.main(argv, extra_contenders=BROKEN)
    assert len(BUILDS_THAT_RAISED) == 2  # once per workload: a failed contender is not retried next round

    assert sorted(p.suffix for p in paths) == [".json", ".md", ".png"]
    for path in paths:
        assert path.exists() and path.stat().st_size > 0
        assert path.name.startswith("bench-cpu-") and f"torch{torch.__version__.split('+')[0]}" in path.name

    raw = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    status = {(r["workload"], r["contender"]): r for r in raw["results"]}
    for workload in ("softmax", "tiny_chain_50"):
        assert status[workload, "eager"]["status"] == "ok"
        assert status[workload, "wrapgen[python]"]["status"] == "ok"
        assert status[workload, "broken_build"]["status"] == "error"
        assert "broken at build" in status[workload, "broken_build"]["detail"]
        assert status[workload, "broken_call"]["status"] == "error"
        assert status[workload, "wrong_answer"]["status"] == "wrong"
        assert status[workload, "wrong_answer"]["median_s"] is None  # failures are not timed
        assert status[workload, "broken_call"]["detail"].startswith("round 1 of 2: ")
        assert len(status[workload, "wrapgen[python]"]["round_times"]) == 2  # contenders took turns twice
    assert status["softmax", "eager"]["copy_bw_fraction"] is not None  # memory-bound workload
    assert status["tiny_chain_50", "eager"]["copy_bw_fraction"] is None

    markdown = next(p for p in paths if p.suffix == ".md").read_text()
    assert "| softmax | broken_build | ERROR" in markdown
    assert "| tiny_chain_50 | wrong_answer | WRONG" in markdown
    assert f"| torch | {torch.__version__} |" in markdown


def test_rounds_combine_into_medians_and_keep_failures() -> None:
    def cell(status: str, seconds: float | None = None, compile_s: float | None = None, peak: int | None = None):
        return Result("softmax", "wrapgen[python]", status, "boom" if status != "ok" else "", seconds, compile_s, peak)

    combined = run.combine_rounds([cell("ok", 3.0, 1.0, 10), cell("ok", 1.0, 5.0, 30), cell("ok", 2.0, 2.0, 20)])
    assert (combined.median_s, combined.compile_s, combined.peak_bytes) == (2.0, 2.0, 30)
    assert combined.round_times == [3.0, 1.0, 2.0]
    assert Report.spread(combined) == 0.5
    failed = run.combine_rounds([cell("ok", 1.0), cell("wrong")])
    assert failed.status == "wrong" and failed.detail == "round 2 of 2: boom"


def test_selection_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.select("softmax,nope")
    with pytest.raises(ValueError, match="unknown contender"):
        contenders.select(contenders.default_contenders("cpu"), "nope")
    names = [c.name for c in contenders.select(contenders.default_contenders("cpu"), "wrapgen")]
    assert names[0] == "eager" and all(n.startswith("wrapgen[") for n in names[1:])


def test_every_workload_has_every_profile() -> None:
    for workload in workloads.WORKLOADS.values():
        assert set(workload.sizes) == set(workloads.PROFILES), workload.name
