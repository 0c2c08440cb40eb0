"""AOT packages and the C++ runtime: `wrapgen.aot_compile` / `wrapgen.load_package`, the
standalone runner built with CMake (no Python), concurrent runs during double-buffered weight
swaps, leak checks, and refusing packages built for another runtime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch

import wrapgen
from tests import test_end_to_end as e2e
from wrapgen.errors import InputMismatchError
from wrapgen.package_check import write_metadata
from wrapgen.packaging import PackageError, read_tensor_file, write_tensor_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    model = e2e.MLP().eval()
    with wrapgen.config.patch(matmul_kernel_limit=0):  # the linears stay library calls (generated shims)
        path = wrapgen.aot_compile(model, (torch.randn(4, 8),), tmp_path_factory.mktemp("pkg") / "mlp.wgpkg")
    return model, path


@pytest.fixture(scope="module")
def fallback_package(tmp_path_factory):
    """A transformer block with generated kernels off: every op is a library call (fallbacks with
    optional and list arguments go through aoti_torch_call_dispatcher)."""
    model = e2e.SDPABlock().eval()
    with wrapgen.config.patch(kernels=False):
        path = wrapgen.aot_compile(model, (torch.randn(2, 5, 16),), tmp_path_factory.mktemp("pkg") / "sdpa.wgpkg")
    return model, path


def build_runner(build: Path) -> Path:
    """wrapgen_runner, built from this checkout with CMake into `build` (skips without cmake)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    torch_dir = os.path.dirname(torch.__file__)
    subprocess.run(
        ["cmake", "-S", str(REPO), "-B", str(build), f"-DTORCH_DIR={torch_dir}", "-DCMAKE_BUILD_TYPE=Release"],
        check=True, capture_output=True, text=True,
    )
    subprocess.run(["cmake", "--build", str(build), "--target", "wrapgen_runner", "-j2"], check=True, capture_output=True, text=True)
    return build / "wrapgen_runner"


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    return build_runner(tmp_path_factory.mktemp("cmake"))


def test_package_layout_and_metadata(mlp_package):
    _, path = mlp_package
    files = {p.name for p in Path(path).iterdir()}
    assert {"model.so", "weights.bin", "metadata.json", "SHA256SUMS"} <= files
    meta = json.loads((Path(path) / "metadata.json").read_text())
    assert meta["inputs"] == [{"name": "x", "kind": "tensor", "dtype": "float32", "device": "cpu", "sizes": ["4", "8"], "strides": ["8", "1"]}]
    assert meta["outputs"] == [{"kind": "tensor"}]
    assert meta["torch_version"] == torch.__version__.split("+")[0]
    assert "aoti_torch_empty_strided" in meta["shims"] and "aoti_torch_cpu_addmm_out" in meta["shims"]
    assert all(not v or re.fullmatch(r"\d+\.\d+", v) for v in meta["shims"].values())
    weights = read_tensor_file(Path(path) / "weights.bin")
    assert set(weights) == {c["name"] for c in meta["constants"]}


def test_load_package_matches_eager(mlp_package):
    model, path = mlp_package
    runner = wrapgen.load_package(path)
    for _ in range(3):
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), model(x))
    assert runner.live_handles() == 0


def test_packaged_model_rejects_bad_inputs(mlp_package):
    _, path = mlp_package
    runner = wrapgen.load_package(path)
    with pytest.raises(InputMismatchError, match=r"expected shape \(4, 8\), got \(5, 8\)"):
        runner(torch.randn(5, 8))
    with pytest.raises(InputMismatchError, match="dtype"):
        runner(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(InputMismatchError, match="expected 1 inputs, got 2"):
        runner.run([torch.randn(4, 8), torch.randn(4, 8)])
    with pytest.raises(InputMismatchError, match="expected a tensor"):
        runner.run(["x"])
    assert runner.live_handles() == 0


def test_standalone_runner_matches_eager(mlp_package, runner, tmp_path):
    model, path = mlp_package
    x = torch.randn(4, 8)
    write_tensor_file(tmp_path / "inputs.bin", {"x": x})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run(
        [str(runner), path, str(tmp_path / "inputs.bin"), str(tmp_path / "outputs.bin")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        expected = model(x)
    lines = result.stdout.splitlines()
    assert lines[0] == "output 0: torch.float32 (4, 4)"
    printed = torch.tensor([float(v) for v in lines[1].split()]).reshape(4, 4)
    torch.testing.assert_close(printed, expected)
    torch.testing.assert_close(read_tensor_file(tmp_path / "outputs.bin")["output0"], expected)
    # no Python in the runner's process
    ldd = subprocess.run(["ldd", str(runner)], capture_output=True, text=True).stdout
    assert "libpython" not in ldd and "libtorch_python" not in ldd


def test_runner_leak_check_over_1000_calls_with_fallbacks(fallback_package, runner, tmp_path):
    model, path = fallback_package
    source = (Path(path) / "model.cpp").read_text()
    assert source.count("st.call(") >= 4, "the package calls library ops through the dispatcher"
    x = torch.randn(2, 5, 16)
    write_tensor_file(tmp_path / "inputs.bin", {"x": x})
    result = subprocess.run(
        [str(runner), path, str(tmp_path / "inputs.bin"), str(tmp_path / "out.bin"), "--repeat", "1000"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs: 1000, live handles in the model: 0" in result.stdout
    with torch.no_grad():
        torch.testing.assert_close(read_tensor_file(tmp_path / "out.bin")["output0"], model(x), rtol=1e-5, atol=1e-5)


def _upstream_string_leak(block: str) -> bool:
    """torch's own leak, not ours: ToImpl<std::string> (torch/csrc/stable/stableivalue_conversions.h)
    does `new std::string(...)` and returns a copy, so libtorch loses one std::string (32 bytes)
    for every str argument passed through aoti_torch_call_dispatcher (gelu's `approximate`)."""
    m = re.search(r"([\d,]+) bytes in ([\d,]+) blocks are definitely lost", block)
    frames = re.findall(r"(?:at|by) 0x[0-9A-F]+: (\S+)", block)
    if not m or len(frames) < 2:
        return False
    size = int(m.group(1).replace(",", "")) / int(m.group(2).replace(",", ""))
    return size == 32 and frames[0].startswith("operator") and frames[1].startswith("to_ivalue")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_runner_under_valgrind_loses_no_tensor_memory(fallback_package, runner, tmp_path):
    """No definitely-lost block allocated through the model library or the C shim (a leaked
    handle or tensor would be one); libtorch's one-time allocations are 'still reachable'."""
    _, path = fallback_package
    write_tensor_file(tmp_path / "inputs.bin", {"x": torch.randn(2, 5, 16)})
    result = subprocess.run(
        ["valgrind", "--leak-check=full", "--num-callers=30", str(runner), path, str(tmp_path / "inputs.bin"), "--repeat", "20"],
        capture_output=True, text=True, timeout=900,
    )
    assert "live handles in the model: 0" in result.stdout, result.stdout + result.stderr[-3000:]
    blocks = [b for b in re.split(r"\n==\d+== \n", result.stderr) if "are definitely lost" in b]
    ours = [b for b in blocks if ("model.so" in b or "aoti_torch" in b) and not _upstream_string_leak(b)]
    assert not ours, "\n\n".join(ours)


def test_python_leak_check_over_1000_calls_with_fallbacks(fallback_package):
    model, path = fallback_package
    runner = wrapgen.load_package(path)
    x = torch.randn(2, 5, 16)
    for _ in range(1000):
        out = runner(x)
    assert runner.live_handles() == 0
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    # the output's storage is referenced by the output alone: the model kept no handle to it
    def uses(t: torch.Tensor) -> int:  # the Python storage object counts one itself
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata)

    assert uses(out) == uses(torch.empty(3))


def test_concurrent_runs_while_weights_swap(mlp_package):
    """8 threads run the model while the main thread swaps between two weight sets 100 times:
    each output equals eager's with one set in full, never a mix of the two."""
    model, path = mlp_package
    runner = wrapgen.load_package(path)
    other = e2e.MLP().eval()
    with torch.no_grad():  # distinct weights whatever the seed the fixtures ran under
        for parameter in other.parameters():
            parameter.add_(torch.rand_like(parameter) + 0.5)
    sets = [{k: v.clone() for k, v in model.state_dict().items()}, {k: v.clone() for k, v in other.state_dict().items()}]
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = [model(x), other(x)]
    assert not torch.allclose(expected[0], expected[1])
    stop = threading.Event()
    failures: list[str] = []
    seen = [0, 0]
    lock = threading.Lock()

    def work() -> None:
        while not stop.is_set():
            out = runner(x)
            match = [i for i, e in enumerate(expected) if torch.allclose(out, e, rtol=1e-6, atol=1e-6)]
            with lock:
                if not match:
                    failures.append(str(out))
                else:
                    seen[match[0]] += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        for swap in range(100):
            runner.update_weights(sets[(swap + 1) % 2])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, f"{len(failures)} outputs mixed the weight sets, e.g. {failures[0]}"
    assert seen[0] > 0 and seen[1] > 0, seen
    assert runner._model.swaps() == 100
    torch.testing.assert_close(runner(x), expected[0])  # 100 swaps end on the first set
    assert runner.live_handles() == 0


def test_update_weights_by_unknown_name_raises(mlp_package):
    _, path = mlp_package
    runner = wrapgen.load_package(path)
    with pytest.raises(RuntimeError, match="no constant named nope"):
        runner.update_weights({"nope": torch.zeros(3)})


def test_incompatible_package_is_refused(mlp_package, tmp_path):
    _, path = mlp_package
    broken = tmp_path / "future.wgpkg"
    shutil.copytree(path, broken)
    meta = json.loads((broken / "metadata.json").read_text())
    meta["shims"]["aoti_torch_from_the_future"] = "9.99"
    meta["torch_version"] = "9.99.0"
    write_metadata(broken, meta)  # re-sealed: an edit by hand is refused as damage
    with pytest.raises(PackageError, match=r"aoti_torch_from_the_future \(added in torch 9\.99\)") as info:
        wrapgen.load_package(broken)
    assert "built with torch 9.99.0" in str(info.value)
    meta["shims"].pop("aoti_torch_from_the_future")
    meta["model_abi"] = 99
    write_metadata(broken, meta)
    with pytest.raises(PackageError, match="model ABI 99"):
        wrapgen.load_package(broken)


def test_not_a_package(tmp_path):
    with pytest.raises(PackageError, match="not a wrapgen package"):
        wrapgen.load_package(tmp_path)
