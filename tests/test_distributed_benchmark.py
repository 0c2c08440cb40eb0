"""benchmarks.distributed on two gloo ranks, as a user launches it (torchrun): every scenario runs,
every contender's result equals eager's on every rank, and rank 0 writes its page under the
results' naming scheme. Nothing here is about speed. The ranks run under torchrun in a subprocess
with a deadline, so a hung collective fails the test instead of hanging CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_benchmarks import ROOT, _named
from tests.test_collectives_distributed import free_port

SCENARIOS = ("tp-block", "tp-train", "fsdp2", "fsdp2-gpt2")
# One of each kind of contender (Inductor's cold compile alone would take most of the time budget on
# a 2-core machine): the reference, wrapgen.compile and torch.compile(backend="wrapgen") on both targets.
CONTENDERS = ("eager", "wrapgen[python]", "wrapgen-dynamo[python]", "wrapgen-dynamo[cpp]")
DEADLINE = 300  # seconds for the whole run (about 50 s on a 2-core machine)


def test_two_ranks_run_every_scenario_and_write_the_page(tmp_path: Path, wrapgen_cache_dir: Path) -> None:
    out_dir = tmp_path / "results"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), "-m", "benchmarks.distributed", "--device", "cpu", "--size", "tiny",
               "--scenarios", ",".join(SCENARIOS), "--contenders", ",".join(CONTENDERS), "--rounds", "2",
               "--steps", "1", "--out-dir", str(out_dir)]
    env = dict(os.environ, WRAPGEN_CACHE_DIR=str(wrapgen_cache_dir), OMP_NUM_THREADS="1")
    env.pop("WRAPGEN_TARGET", None)
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the benchmark did not finish within {DEADLINE} s (a hung collective?)")
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    print(f"benchmark took {time.monotonic() - started:.0f} s")

    pages = sorted(out_dir.iterdir())
    assert sorted(p.suffix for p in pages) == [".json", ".md"], pages
    for page in pages:
        _named(page, "distributed-tiny-fp32-2ranks")
    results = json.loads(next(p for p in pages if p.suffix == ".json").read_text())["results"]
    ran = {(r["case"], r["contender"]) for r in results}
    expected = {(s, c) for s in SCENARIOS for c in CONTENDERS if s == "tp-block" or c == "eager" or c.startswith("wrapgen-dynamo")}
    assert ran == expected
    for r in results:
        assert (r["status"], r["check"]) == ("ok", "ok"), r
        assert len(r["round_times"]) == 2, r  # every contender took its turn in both rounds
    table = [line for line in done.stdout.splitlines() if line.startswith("| ") and line.split("|")[1].strip() in SCENARIOS]
    assert len(table) == len(expected), done.stdout
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == "ok" and cells[11] == "ok", line  # status and check columns
    markdown = next(p for p in pages if p.suffix == ".md").read_text()
    assert "| ranks | 2 (gloo), one process per rank |" in markdown


def test_exposed_communication_is_the_time_no_other_kernel_covers() -> None:
    from benchmarks.distributed_report import exposed_seconds, merge

    assert merge([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    kernels = [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0.0, 10.0),  # 0-2 and 6-10 exposed
        ("ampere_bf16_gemm", 2.0, 4.0),
        ("triton_poi_fused_add_0", 3.0, 6.0),
        ("ncclDevKernel_AllGather", 12.0, 14.0),  # wholly exposed
        ("triton_red_fused_1", 20.0, 30.0),  # no communication: exposes nothing
        ("ncclKernel_ReduceScatter", 21.0, 25.0),  # wholly hidden
    ]
    assert exposed_seconds(kernels) == pytest.approx((2 + 4 + 2) / 1e6)
    assert exposed_seconds([("gemm", 0.0, 5.0)]) == 0.0
