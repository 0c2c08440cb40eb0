"""Triton compile workers (wrapgen/kernels/triton/worker_pool.py): their own program, never a
multiprocessing child, so a user's script without a main guard runs once, not once per worker.

On CPU, Triton's interpreter compiles nothing: a worker does the same call it does on a GPU
(import the kernel's source, `compat.compile_kernel`), which there only loads the kernel. So
these tests check what is the same on both: how workers start, the protocol, parallel
dispatch, errors and deaths. On a GPU the last test checks that a worker's compile lands in
Triton's cache, so the compile in the parent that follows is a hit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import wrapgen
from wrapgen.kernels.triton import compat, runtime, worker_pool
from wrapgen.kernels.triton.worker_pool import CompilePool

pytestmark = [
    pytest.mark.skipif(not compat.available(), reason="needs triton"),
    pytest.mark.skipif(not torch.cuda.is_available() and not compat.interpreting(),
                       reason="Triton on CPU needs TRITON_INTERPRET=1"),
]

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# A user's script as people write them: no `if __name__ == "__main__":` guard. Each run of
# its body appends a line to the counter file; a worker that imported `__main__` would too.
PROGRAM = """\
def program(x, y):
    return (x.sin() + y).sum(1), (x * y).amax(0), torch.softmax(x.cos(), dim=-1)
"""
SCRIPT = """\
import json, os, sys
import torch
import wrapgen
from wrapgen.kernels.triton.worker_pool import compile_pool

counter, out = sys.argv[1], sys.argv[2]
with open(counter, "a") as f:
    f.write(f"{os.getpid()}\\n")

""" + PROGRAM + """
x, y = torch.randn(8, 32, device=sys.argv[3]), torch.randn(8, 32, device=sys.argv[3])
compiled = wrapgen.compile(program, (x, y))
torch.save({"inputs": (x, y), "outputs": compiled(x, y)}, out)
print(json.dumps({"pid": os.getpid(), "served": compile_pool().served()}))
"""

KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)
"""


def eager_program():
    namespace: dict = {"torch": torch}
    exec(PROGRAM, namespace)
    return namespace["program"]


def _request(path: Path, name: str = "add_one") -> tuple[str, tuple]:
    """A real warm-up request, as runtime.warm_in_workers builds it."""
    return name, (str(path), name, [("ptr", (torch.float32, True)), ("int", False)], {"BLOCK": 16}, 4, 0)


def test_script_without_main_guard_runs_once(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    counter, out = tmp_path / "body_runs.txt", tmp_path / "results.pt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "WRAPGEN_CACHE_DIR": str(tmp_path / "cache"),  # no kernel built yet: the workers get them all
        "WRAPGEN_CPU_KERNELS": "triton",
        "WRAPGEN_TRITON_COMPILE_WORKERS_MIN": "2",  # the program has 2 kernels: take the worker path
    }
    result = subprocess.run([sys.executable, str(script), str(counter), str(out), DEVICE], env=env,
                            capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert counter.read_text().splitlines() == [str(report["pid"])]  # the body ran once, in the script's process
    served = {int(pid): n for pid, n in report["served"].items()}
    assert sum(served.values()) == 2 and report["pid"] not in served  # both kernels went to worker processes
    saved = torch.load(out)
    torch.testing.assert_close(saved["outputs"], eager_program()(*saved["inputs"]))
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in served) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in served), "compile workers outlived the script"


def test_worker_errors_and_deaths_come_back_as_outcomes(tmp_path: Path) -> None:
    """A failing request leaves the worker serving; a worker that dies is reported, not waited
    on, and replaced on the next batch."""
    good, dying = tmp_path / "good.py", tmp_path / "dying.py"
    good.write_text(KERNEL)
    dying.write_text("import os\nos._exit(3)\n")
    pool = CompilePool(max_workers=1)
    try:
        first = pool.run([_request(good), _request(good, "missing_kernel")])  # one worker: in order
        assert first[0].error is None
        assert "AttributeError" in (first[1].error or "") and "missing_kernel" in (first[1].error or "")
        (pid,) = pool.served()

        died = pool.run([_request(dying), _request(good)])
        assert "exited with code 3" in (died[0].error or "") and f"pid {pid}" in (died[0].error or "")
        assert died[1].error == "no Triton compile worker was left to take it"

        again = pool.run([_request(good)])
        assert again[0].error is None and list(pool.served()) != [pid]
    finally:
        workers = list(pool.workers)
        pool.close()
    assert workers and all(w.process.poll() is not None for w in workers)  # stopped, not left running


def test_one_worker_compiles_into_whichever_cache_the_parent_reads(tmp_path: Path, monkeypatch) -> None:
    """A new TRITON_CACHE_DIR between compiles (a benchmark's cold compile does this every
    round) reaches the running worker with the next request: no restart (seconds of importing
    torch and Triton), and each compile lands in the cache the parent reads at the time."""
    seen = tmp_path / "seen.txt"
    kernel = tmp_path / "kernel.py"
    kernel.write_text(f"import os\nopen({str(seen)!r}, 'a').write(os.environ['TRITON_CACHE_DIR'] + '\\n')\n"
                      + KERNEL)
    pool = CompilePool(max_workers=1)
    try:
        caches = [tmp_path / "first", tmp_path / "second"]
        pids = []
        for cache in caches:
            monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
            (outcome,) = pool.run([_request(kernel)])
            assert outcome.error is None, outcome.error
            pids.append(list(pool.served()))
    finally:
        pool.close()
    assert pids[0] == pids[1] and len(pids[0]) == 1  # the same worker served both
    assert seen.read_text().split() == [str(c) for c in caches]


def test_workers_are_used_from_the_configured_number_of_new_kernels() -> None:
    with wrapgen.config.patch(triton_compile_workers_min=None):
        cold = runtime.STARTED_MIN if worker_pool.compile_pool().started() else runtime.PARALLEL_MIN
        assert runtime.workers_min() == (0 if compat.interpreting() else cold)
    with wrapgen.config.patch(triton_compile_workers_min=3):
        assert runtime.workers_min() == 3


class _RecordingPool:
    """Stands in for the worker pool: records whether it was asked to start."""

    def __init__(self) -> None:
        self.starts = 0

    def start(self) -> None:
        self.starts += 1

    def started(self) -> bool:
        return self.starts > 0


def test_a_cuda_compile_starts_the_workers_while_it_traces(monkeypatch) -> None:
    """Example inputs on CUDA start the pool up front (fake CUDA tensors stand in here); CPU
    inputs, workers switched off, or the interpreter start nothing. Once started, any two new
    kernels go to the workers instead of sixteen."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    pool = _RecordingPool()
    monkeypatch.setattr(runtime, "compile_pool", lambda: pool)
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    with FakeTensorMode():
        on_gpu = torch.empty(4, device="cuda")
    with wrapgen.config.patch(triton_compile_workers_min=None):
        assert runtime.workers_min() == runtime.PARALLEL_MIN
        runtime.start_workers_early([torch.randn(4), None, 3])
        assert pool.starts == 0
        with wrapgen.config.patch(triton_compile_workers_min=0):
            runtime.start_workers_early([on_gpu])
        assert pool.starts == 0
        runtime.start_workers_early([torch.randn(4), on_gpu])
        assert pool.starts == 1 and runtime.workers_min() == runtime.STARTED_MIN
    monkeypatch.setattr(compat, "interpreting", lambda: True)
    runtime.start_workers_early([on_gpu])
    assert pool.starts == 1


def test_kernels_compile_here_when_no_worker_starts(monkeypatch, tmp_path: Path) -> None:
    """No Python to start a worker with: a warning names why, and the kernels compile in this process."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    monkeypatch.setattr(worker_pool, "_pool", None)  # a fresh pool for this process, none started yet
    x, y = torch.randn(8, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE)
    cache = tmp_path / "cache"
    with wrapgen.config.patch(cpu_kernels="triton", triton_compile_workers_min=1, cache_dir=str(cache)):
        with pytest.warns(RuntimeWarning, match="compile in this process.*could not start a Triton compile worker"):
            compiled = wrapgen.compile(eager_program(), (x, y))
    torch.testing.assert_close(compiled(x, y), eager_program()(x, y))
    assert not list((cache / "triton").glob("built_*"))  # not marked as built: a later program tries again


def _ptxas_other_than_tritons() -> str | None:
    """A ptxas of another version than the one Triton uses by default, if this machine has one
    (torch's own, the CUDA toolkit's): what torch.compile switches TRITON_PTXAS_PATH to."""
    try:
        from triton import knobs
    except ImportError:
        return None
    saved = os.environ.pop("TRITON_PTXAS_PATH", None)
    try:
        default = knobs.nvidia.ptxas
    except Exception:  # noqa: BLE001 - no ptxas at all
        return None
    finally:
        if saved is not None:
            os.environ["TRITON_PTXAS_PATH"] = saved
    import shutil

    for candidate in (str(Path(torch.__file__).parent / "bin" / "ptxas"), "/usr/local/cuda/bin/ptxas", shutil.which("ptxas")):
        tool = knobs.NvidiaTool.from_path(candidate) if candidate and os.access(candidate, os.X_OK) else None
        if tool is not None and tool.version != default.version:
            return candidate
    return None


def test_kernel_keys_follow_ptxas_when_it_changes_after_the_first_compile(monkeypatch) -> None:
    """Triton memoizes ptxas's version (part of every kernel's cache key) but finds the tool anew
    for each compile; after TRITON_PTXAS_PATH changes, the key and what workers get follow it."""
    nvidia = pytest.importorskip("triton.backends.nvidia.compiler")
    other = _ptxas_other_than_tritons()
    if other is None:
        pytest.skip("needs a second ptxas of another version")
    from triton import knobs

    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    try:
        compat.ptxas_in_use()
        first = nvidia.get_ptxas_version()
        monkeypatch.setenv("TRITON_PTXAS_PATH", other)  # as torch.compile does when it first compiles
        assert nvidia.get_ptxas_version() == first  # Triton alone keeps keying by the old one
        assert compat.ptxas_in_use() == other
        assert f"release {knobs.NvidiaTool.from_path(other).version}" in nvidia.get_ptxas_version()
        monkeypatch.setattr(compat, "interpreting", lambda: False)
        assert compat.worker_environment()["TRITON_PTXAS_PATH"] == other  # workers started now use it too
    finally:
        monkeypatch.undo()
        compat.ptxas_in_use()  # back in line with the restored environment


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real compile needs a GPU")
@pytest.mark.parametrize("ptxas_switch", [False, True], ids=["same-ptxas", "ptxas-switched-after-a-compile"])
def test_worker_compile_lands_in_the_parents_triton_cache(tmp_path: Path, ptxas_switch: bool) -> None:
    """After a worker compiled a kernel and built its launcher, compiling and binding it here
    adds nothing to Triton's cache (no kernel and no launcher is built a second time). Also
    when TRITON_PTXAS_PATH changed after this process first compiled (torch.compile does that):
    before, this process then keyed kernels by the old ptxas and workers by the new one."""
    other = _ptxas_other_than_tritons() if ptxas_switch else None
    if ptxas_switch and other is None:
        pytest.skip("needs a second ptxas of another version")
    switch = "" if other is None else f"""
first = Path({str(tmp_path / "first.py")!r})
first.write_text({KERNEL.replace("add_one", "first")!r})
compat.compile_kernel(compat.load_module(first, "wrapgen_triton_first").first,
                      [("ptr", (torch.float32, True)), ("int", False)], {{"BLOCK": 16}}, 4)
os.environ["TRITON_PTXAS_PATH"] = {other!r}
"""
    script = f"""\
import os, sys
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
import torch
import wrapgen
from wrapgen.kernels.triton import compat, runtime, worker_pool
from wrapgen.kernels.triton.worker_pool import CompilePool
path = Path({str(tmp_path / "kernel.py")!r})
path.write_text({KERNEL!r})
cache = Path(os.environ["TRITON_CACHE_DIR"])
{switch}
pool = CompilePool(1)
outcome = pool.run([("add_one", (str(path), "add_one", [("ptr", (torch.float32, True)), ("int", False)],
                                 {{"BLOCK": 16}}, 4, 0, 1, True, compat.device_capability(0)))])
assert outcome[0].error is None, outcome
before = sorted(p.name for p in cache.iterdir())
fn = compat.load_module(path, "wrapgen_triton_kernel").add_one
compiled = compat.compile_kernel(fn, [("ptr", (torch.float32, True)), ("int", False)], {{"BLOCK": 16}}, 4)
launch = compat.bind_launcher(compiled, fn, {{"BLOCK": 16}})
x = torch.zeros(16, device="cuda")
launch(1, 1, 1, torch.cuda.current_stream().cuda_stream, x, 16)
assert x.eq(1).all(), x
after = sorted(p.name for p in cache.iterdir())
assert before and before == after, (before, after)
print("HIT", len(before))
"""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton_cache")}
    env.pop("TRITON_PTXAS_PATH", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "HIT" in result.stdout, result.stdout + result.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real compile needs a GPU")
def test_workers_compile_without_a_cuda_context_of_their_own(tmp_path: Path, monkeypatch) -> None:
    """A worker compiles for the capability the parent sends and never touches the GPU: a
    CUDA context in each worker (about 0.5 GiB of GPU memory) slowed this process's CUDA
    graph replays by about 9% for as long as the workers lived."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
    path = tmp_path / "kernel.py"
    path.write_text(KERNEL)
    torch.cuda.init()
    free_before, _ = torch.cuda.mem_get_info()
    pool = CompilePool(2)
    try:
        request = (str(path), "add_one", [("ptr", (torch.float32, True)), ("int", False)], {"BLOCK": 16}, 4, 0, 1,
                   True, compat.device_capability(0))
        outcomes = pool.run([("a", request), ("b", request[:2] + ([("ptr", (torch.float32, False)), ("int", False)],)
                                                   + request[3:])])
        assert [o.error for o in outcomes] == [None, None], outcomes
        assert len(pool.served()) >= 1
        free_after, _ = torch.cuda.mem_get_info()
        assert free_before - free_after < 128 * 2**20, f"workers took {(free_before - free_after) / 2**20:.0f} MiB of GPU memory"
    finally:
        pool.close()


class _RunningPool:
    """Stands in for a started worker pool: records what is submitted (answered by `answer`,
    a finished Future by default) and the batches `run` is given (all built)."""

    def __init__(self, answer=None) -> None:
        self.submitted: list[str] = []
        self.batches: list[list[str]] = []
        self.answer = answer

    def started(self) -> bool:
        return True

    def submit(self, key, args):
        from concurrent.futures import Future

        self.submitted.append(key)
        assert args[7] is True  # the launcher is built too
        if self.answer is not None:
            return self.answer
        future: Future = Future()
        future.set_result(worker_pool.Outcome(key, None))
        return future

    def run(self, requests, on_done=None):
        self.batches.append([key for key, _ in requests])
        return [worker_pool.Outcome(key, None) for key, _ in requests]


def test_kernels_prefetched_during_lowering_are_waited_for_not_sent_again(tmp_path: Path, monkeypatch) -> None:
    """`prefetch` sends a kernel (aligned variant and its launcher) to running workers once; its
    answer marks it built (and it is no longer tracked), so the target's warm-up sends only what
    is still missing (the C++ target's unaligned variant)."""
    pool = _RunningPool()
    submitted, batches = pool.submitted, pool.batches
    monkeypatch.setattr(runtime, "compile_pool", lambda: pool)
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    metadata = (("arg_names", ("in_ptr0", "out_ptr0", "xnumel")), ("arg_types", ("ptr:float32", "ptr:float32", "int32")),
                ("constexprs", (("XBLOCK", 64),)), ("num_warps", 4), ("unaligned", ("in_ptr0",)), ("device", "cuda:0"))
    spec = runtime.KernelSpec("add_one", KERNEL, metadata)
    with wrapgen.config.patch(cache_dir=str(tmp_path), triton_compile_workers_min=None):
        runtime.prefetch("add_one", KERNEL, metadata)
        runtime.prefetch("add_one", KERNEL, metadata)  # answered already: marked built, no longer tracked
        assert submitted == ["add_one|True|prefetched"] and not runtime._prefetched
        runtime.warm_in_workers([spec], launchers=True)  # the Python target
        assert batches == []  # waited for, not sent again
        assert runtime._built(spec, True, True) and runtime._built(spec, True, False)
        runtime.prefetch("add_one", KERNEL, metadata)  # built: nothing to send
        assert submitted == ["add_one|True|prefetched"]
        with wrapgen.config.patch(triton_compile_workers_min=1):  # (one new kernel would compile here by default)
            runtime.warm_in_workers([spec], unaligned_too=True)  # the C++ target: only the unaligned variant is new
        assert batches == [["add_one|False"]]
        with wrapgen.config.patch(triton_compile_workers_min=0):
            runtime.prefetch("other", KERNEL.replace("add_one", "other"), metadata)
        assert submitted == ["add_one|True|prefetched"]


def test_the_warm_up_waits_for_a_prefetch_still_compiling(tmp_path: Path, monkeypatch) -> None:
    """A kernel still compiling in a worker when the target's warm-up starts is waited for (not
    sent again), and is marked built once it answers."""
    import threading
    from concurrent.futures import Future

    pending: Future = Future()
    pool = _RunningPool(answer=pending)
    batches = pool.batches
    monkeypatch.setattr(runtime, "compile_pool", lambda: pool)
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    metadata = (("arg_names", ("x_ptr", "n")), ("arg_types", ("ptr:float32", "int32")), ("constexprs", (("BLOCK", 16),)),
                ("num_warps", 4), ("device", "cuda:0"))
    spec = runtime.KernelSpec("add_one", KERNEL, metadata)
    with wrapgen.config.patch(cache_dir=str(tmp_path), triton_compile_workers_min=None):
        runtime.prefetch("add_one", KERNEL, metadata)
        assert not runtime._built(spec, True, True)
        answer = threading.Timer(0.2, lambda: pending.set_result(worker_pool.Outcome("add_one|True|prefetched", None)))
        answer.start()
        runtime.warm_in_workers([spec], launchers=True)  # returns once the worker answered
        assert pending.done() and batches == [] and runtime._built(spec, True, True)
        assert not runtime._prefetched
