"""Collectives on real torch.distributed ranks: gloo over loopback, 2 and 4 rank processes.

Each rank (tests/collectives_worker.py) compiles a tensor-parallel MLP, an FSDP-like
all_gather/reduce_scatter model and a DDP-like model with gradients all-reduced in the
compiled backward, with torch.compile(backend="wrapgen") for every target, and checks the
forward output and every gradient against the model computed without distribution. Ranks are
plain subprocesses with a deadline: a rank that hangs (a collective nobody joins) or dies
fails the test, and every rank is killed, so CI never hangs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wrapgen.backends import registered_backends

WORKER = Path(__file__).with_name("collectives_worker.py")
TARGETS = tuple(t for t in ("python", "fx", "cpp", "interpret") if t in registered_backends())
SCENARIOS = ("tp", "fsdp", "ddp")
DEADLINE = 240  # seconds for all ranks of one run (about 30 s on a 2-core machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, cache_dir: Path, targets=TARGETS, scenarios=SCENARIOS, worker: Path = WORKER) -> list[list[dict]]:
    """Start `world` ranks, wait for all (or kill all at the deadline); each rank's JSON reports."""
    port = free_port()
    env = dict(os.environ, WRAPGEN_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    env.pop("WRAPGEN_TARGET", None)
    command = [sys.executable, str(worker), "", str(world), str(port), ",".join(targets), ",".join(scenarios)]
    ranks = []
    for rank in range(world):
        command[2] = str(rank)
        ranks.append(subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      cwd=worker.parents[1]))
    deadline = time.monotonic() + DEADLINE
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{world} ranks did not finish within {DEADLINE} s (a hung collective?)")
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    reports = []
    for rank, (process, (stdout, stderr)) in enumerate(zip(ranks, outputs)):
        assert process.returncode == 0, f"rank {rank} of {world} exited with {process.returncode}:\n{stderr[-4000:]}"
        reports.append([json.loads(line) for line in stdout.splitlines() if line.startswith("{")])
    return reports


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One artifact cache for every rank and both runs: ranks build the same programs."""
    return tmp_path_factory.mktemp("distributed_cache")


@pytest.mark.parametrize("world", [2, 4])
def test_every_target_matches_eager_on_every_rank(world, shared_cache):
    reports = run_ranks(world, shared_cache)
    for rank, report in enumerate(reports):
        done = {(r["scenario"], r["target"]) for r in report}
        assert done == {(s, t) for s in SCENARIOS for t in TARGETS}, f"rank {rank} checked only {sorted(done)}"
        for r in report:
            # forward and backward graphs, with the collectives as lines of the programs
            assert r["graphs"] == 2, r
            expected = {"tp": [1, 1], "fsdp": [2, 2], "ddp": [0, 4]}[r["scenario"]]
            assert r["starts"] == expected, r
            assert all(o is None or o.startswith("on:") for o in r["overlap"]), r
    ddp_backward = next(r for r in reports[0] if r["scenario"] == "ddp")["overlap"][1]
    # the gradient all_reduces overlap the rest of the backward
    assert int(ddp_backward.split(", ")[1].split()[0]) >= 3, ddp_backward

