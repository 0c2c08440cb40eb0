"""The same end-to-end checks on a CUDA device (skipped without one)."""

from __future__ import annotations

import copy

import pytest
import torch

import wrapgen
from wrapgen.dynamo import wrapgen_backend

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def conv_net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 10),
    )


def block() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)


@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
@pytest.mark.parametrize("make_model, shape", [(conv_net, (4, 3, 8, 8)), (block, (2, 16, 64))])
def test_models_match_eager_on_cuda(target: str, make_model, shape) -> None:
    model = make_model().cuda().eval()
    compiled = wrapgen.compile(model, (torch.randn(shape, device="cuda"),), target=target)
    x = torch.randn(shape, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_topk_sort_and_views_on_cuda() -> None:
    def f(x):
        values, indices = torch.topk(x, 3)
        s, order = torch.sort(x, dim=0)
        return values, indices, s, order, x.t(), (x > 0).sum()

    x = torch.randn(6, 5, device="cuda")
    compiled = wrapgen.compile(f, (x,))
    x = torch.randn(6, 5, device="cuda")
    torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
def test_dynamic_batch_on_cuda(target: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).cuda().eval()
    compiled = wrapgen.compile(model, (torch.randn(3, 16, device="cuda"),), dynamic=True, target=target)
    for batch in (2, 7, 33):
        x = torch.randn(batch, 16, device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(ValueError, match="expected device"):
        compiled(torch.randn(3, 16))


def test_training_step_through_torch_compile_on_cuda() -> None:
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
    reference = copy.deepcopy(model)
    # The callable rather than the name: this test also runs from a checkout on PYTHONPATH,
    # where the entry point that registers "wrapgen" is not installed.
    compiled = torch.compile(model, backend=wrapgen_backend)
    x = torch.randn(8, 16, device="cuda")
    compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)


# -- the C++ target on CUDA: Triton binaries launched from C++ ---------------------------------


def test_cpp_launches_unaligned_inputs_and_views_on_cuda() -> None:
    """Inputs that are views at odd offsets take the kernel variant built without the
    16-byte alignment assumption; aligned ones the fast variant."""

    def f(x, y):
        return torch.softmax(x * 2.0, dim=-1) + y.sin()

    def rows_from(offset: int) -> torch.Tensor:  # a (33, 64) view, strides (65, 1), `offset` floats in
        flat = torch.randn(33 * 65 + 8, device="cuda")
        return flat[offset - 1 : offset - 1 + 33 * 65].view(33, 65)[:, 1:]

    x, y = rows_from(1), torch.randn(33, 64, device="cuda")
    compiled = wrapgen.compile(f, (x, y), target="cpp")
    assert "wrapgen::cuda::aligned16" in compiled.source
    for offset in (1, 4, 8, 3):  # 4 bytes in (unaligned), 16 and 32 (aligned), 12 (unaligned)
        x, y = rows_from(offset), torch.randn(33, 64, device="cuda")
        torch.testing.assert_close(compiled(x, y), f(x, y))


def test_python_launches_native_and_switches_to_the_unaligned_variant_on_cuda() -> None:
    """The python target calls Triton's C launcher itself (no launcher-class frame) and still
    takes the variant without the alignment assumption for an input view at an odd offset."""
    from wrapgen.kernels.triton import compat

    def f(x, y):
        return torch.softmax(x * 2.0, dim=-1) + y.sin()

    def rows_from(offset: int) -> torch.Tensor:
        flat = torch.randn(33 * 65 + 8, device="cuda")
        return flat[offset - 1 : offset - 1 + 33 * 65].view(33, 65)[:, 1:]

    x, y = rows_from(1), torch.randn(33, 64, device="cuda")
    compiled = wrapgen.compile(f, (x, y), target="python")
    kernels = compiled.artifact.call.__globals__["_triton_kernels"]
    spec = next(iter(kernels.specs.values()))
    binary = kernels._compile(spec, True)
    native, head, _ = compat.launch_parts(binary, spec.constexprs, spec.device_index)
    if compat.version().startswith("3.6."):
        assert native is binary.run.launch and head[1:3] == (False, False)
    for offset in (1, 4, 8, 3):
        x, y = rows_from(offset), torch.randn(33, 64, device="cuda")
        torch.testing.assert_close(compiled(x, y), f(x, y))


def test_cpp_aot_package_on_cuda(tmp_path) -> None:
    model = block().cuda().eval()
    x = torch.randn(2, 16, 64, device="cuda")
    path = wrapgen.aot_compile(model, (x,), tmp_path / "block.wgpkg")
    loaded = wrapgen.load_package(path)
    for _ in range(3):
        x = torch.randn(2, 16, 64, device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-4)
    assert loaded.live_handles() == 0
    with pytest.raises(ValueError, match="device"):
        loaded(torch.randn(2, 16, 64))


def test_cpp_runs_on_the_callers_stream_on_cuda() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).cuda().eval()
    compiled = wrapgen.compile(model, (torch.randn(8, 64, device="cuda"),), target="cpp")
    stream = torch.cuda.Stream()
    source = torch.randn(8, 64, device="cuda")
    x = torch.zeros(8, 64, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.no_grad():
        torch.cuda._sleep(50_000_000)  # the side stream is busy for a while ...
        x.copy_(source)  # ... before x holds its values: a launch on another stream would read zeros
        got = compiled(x)
    stream.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(got, model(source))


def test_cpp_threads_share_a_model_on_cuda() -> None:
    import threading

    model = block().cuda().eval()
    compiled = wrapgen.compile(model, (torch.randn(2, 16, 64, device="cuda"),), target="cpp")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(20):
                x = torch.randn(2, 16, 64, device="cuda")
                with torch.no_grad():
                    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("dynamic", [False, True])
def test_cpp_target_rejects_wrong_inputs_on_cuda(dynamic: bool) -> None:
    """Wrong strides, shapes, dtypes and devices raise from the C++ wrapper (they once crashed
    the process: the error message was built with iostreams)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).cuda().eval()
    compiled = wrapgen.compile(model, (torch.randn(8, 16, device="cuda"),), target="cpp", dynamic=dynamic)
    wrong = {
        "expected strides": torch.randn(16, 8, device="cuda").t(),
        "expected shape": torch.randn(8, 17, device="cuda"),
        "expected dtype": torch.randn(8, 16, device="cuda", dtype=torch.float64),
        "expected device": torch.randn(8, 16),
    }
    for message, x in wrong.items():
        with pytest.raises(ValueError, match=message):
            compiled(x)
    x = torch.randn(8, 16, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


_OUT_OF_RANGE = """
import sys, torch, wrapgen
model = torch.nn.Embedding(50, 16).cuda().eval()
idx = torch.randint(0, 50, (4, 7), device="cuda")
compiled = wrapgen.compile(model, (idx,), target=sys.argv[1])
assert not [l for l in compiled.program.lines if type(l).__name__ == "ExternKernel"], compiled.program
idx[2, 3] = 50
try:
    compiled(idx)
    torch.cuda.synchronize()
except Exception as e:
    print("RAISED", type(e).__name__, e)
    sys.exit(3)
print("NO ERROR")
"""


@pytest.mark.parametrize("target", wrapgen.backends.registered_backends())
def test_gather_index_out_of_range_fails_a_device_assert(target: str, tmp_path) -> None:
    """On CUDA, as in eager, an embedding index out of range stops at a device assert (the
    kernel is compiled with Triton's debug asserts); the process is not left running on garbage.
    A device assert poisons the CUDA context, so it runs in a child process."""
    import subprocess
    import sys

    script = tmp_path / "oob.py"
    script.write_text(_OUT_OF_RANGE)
    result = subprocess.run([sys.executable, str(script), target], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "NO ERROR" not in output and result.returncode != 0, output[-2000:]
    assert "assert" in output.lower(), output[-2000:]
