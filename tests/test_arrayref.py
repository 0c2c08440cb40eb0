"""The array-ref entry of AOT packages (`aot_compile(..., arrayref=True)`): results equal to eager
and to the handle entry, many threads on one package, every kind of bad descriptor answered with
an error code naming the argument (and nothing written), refusals naming the line, and the
callers without Python (wrapgen_runner --arrayref, examples/arrayref_call.cpp)."""

from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path

import pytest
import torch

import wrapgen
from examples.demo import TinyBlock
from tests import test_end_to_end as e2e
from tests.test_cpp_runtime import build_runner
from wrapgen.backends.cpp.arrayref import ArrayRefRefused
from wrapgen.backends.cpp.build import torch_library_dir
from wrapgen.errors import InputMismatchError
from wrapgen.packaging import PackageError, read_tensor_file, write_tensor_file

REPO = Path(__file__).resolve().parents[1]
WG_INPUT_MISMATCH = 1


def _package(tmp_path_factory, model: torch.nn.Module, x: torch.Tensor, name: str, **options) -> str:
    with torch.no_grad(), wrapgen.config.patch(**options):
        return wrapgen.aot_compile(model, (x,), tmp_path_factory.mktemp("pkg") / name, arrayref=True)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, tuple[int, ...], str]]:
    """The models of the package tests: generated kernels, library linears, every op a library call."""
    torch.manual_seed(0)
    demo, mlp, sdpa = TinyBlock().eval(), e2e.MLP().eval(), e2e.SDPABlock().eval()
    return {
        "demo": (demo, (1, 64), _package(tmp_path_factory, demo, torch.randn(1, 64), "demo.wgpkg")),
        "mlp": (mlp, (4, 8), _package(tmp_path_factory, mlp, torch.randn(4, 8), "mlp.wgpkg", matmul_kernel_limit=0)),
        "sdpa": (sdpa, (2, 5, 16), _package(tmp_path_factory, sdpa, torch.randn(2, 5, 16), "sdpa.wgpkg", kernels=False)),
    }


@pytest.mark.parametrize("name", ["demo", "mlp", "sdpa"])
def test_arrayref_matches_eager_and_the_handle_entry(packages, name):
    model, shape, path = packages[name]
    handle, arrayref = wrapgen.load_package(path), wrapgen.load_package(path, interface="arrayref")
    for _ in range(3):
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        got = arrayref(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(got, handle(x), rtol=0, atol=0)
    assert arrayref.live_handles() == 0


def test_eight_threads_call_one_package(packages):
    model, shape, path = packages["sdpa"]
    arrayref = wrapgen.load_package(path, interface="arrayref")
    inputs = [torch.randn(shape) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(50):
                torch.testing.assert_close(arrayref(inputs[i]), expected[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


class WgArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("sizes", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


def _array(t: torch.Tensor, dtype: int = 6, sizes: tuple[int, ...] | None = None, data: int | None = None,
           strides: tuple[int, ...] | None = None) -> tuple[WgArray, list]:
    sizes = tuple(t.shape) if sizes is None else sizes
    c_sizes = (ctypes.c_int64 * max(1, len(sizes)))(*sizes)
    c_strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
    array = WgArray(t.data_ptr() if data is None else data, dtype, len(sizes), c_sizes,
                    ctypes.cast(c_strides, ctypes.POINTER(ctypes.c_int64)) if c_strides is not None else None)
    return array, [c_sizes, c_strides]


@pytest.mark.parametrize("case, message", [
    ("rank", r"input 0 \(x\): expected rank 2, got 1"),
    ("size", r"input 0 \(x\): expected size 64 in dimension 1, got 65"),
    ("dtype", r"input 0 \(x\): expected dtype torch.float32, got torch.float64"),
    ("null input", r"input 0 \(x\): null data pointer"),
    ("null output", r"output 0 \(\w+\): null data pointer"),
    ("too few outputs", r"expected 1 outputs, got 0"),
    ("too few inputs", r"expected 1 inputs, got 0"),
    ("strides", r"input 0 \(x\): not contiguous \(stride 2 in dimension 1, expected 1\)"),
    ("output size", r"output 0 \(\w+\): expected size 64 in dimension 1, got 32"),
])
def test_bad_descriptor_is_an_error_code_naming_the_argument(packages, case, message):
    _, _, path = packages["demo"]
    runner = wrapgen.load_package(path, interface="arrayref")
    model = runner._arrayref
    x, out = torch.randn(1, 64), torch.full((1, 64), 7.0)
    inputs = {"rank": dict(sizes=(64,)), "size": dict(sizes=(1, 65)), "dtype": dict(dtype=7), "null input": dict(data=0),
              "strides": dict(strides=(128, 2))}.get(case, {})
    outputs = {"null output": dict(data=0), "output size": dict(sizes=(1, 32))}.get(case, {})
    in_array, keep_in = _array(x, **inputs)
    out_array, keep_out = _array(out, **outputs)
    n_in = 0 if case == "too few inputs" else 1
    n_out = 0 if case == "too few outputs" else 1
    message_buffer = ctypes.create_string_buffer(512)
    constants = model.handles._constants
    status = model._entry(constants.array, constants.count, ctypes.byref(in_array), ctypes.c_int64(n_in),
                          ctypes.byref(out_array), ctypes.c_int64(n_out), message_buffer, ctypes.c_int64(512))
    assert status == WG_INPUT_MISMATCH
    import re

    assert re.search(message, message_buffer.value.decode()), message_buffer.value
    assert torch.equal(out, torch.full((1, 64), 7.0))  # nothing written
    del keep_in, keep_out


def test_python_caller_rejects_bad_tensors(packages):
    _, _, path = packages["demo"]
    runner = wrapgen.load_package(path, interface="arrayref")
    with pytest.raises(InputMismatchError, match=r"input 0 \(x\): expected size 1 in dimension 0, got 2"):
        runner(torch.randn(2, 64))
    with pytest.raises(InputMismatchError, match=r"input 0 \(x\): not contiguous"):
        runner(torch.randn(1, 128)[:, ::2])
    with pytest.raises(InputMismatchError, match=r"expected 1 inputs, got 2"):
        runner(torch.randn(1, 64), torch.randn(1, 64))


def test_handle_only_package_has_no_arrayref_interface(tmp_path):
    path = wrapgen.aot_compile(torch.nn.ReLU(), (torch.randn(3),), tmp_path / "relu.wgpkg")
    with pytest.raises(PackageError, match="has no array-ref entry"):
        wrapgen.load_package(path, interface="arrayref")
    with pytest.raises(ValueError, match="interface must be"):
        wrapgen.load_package(path, interface="arrays")


def test_dynamic_sizes_are_refused_naming_the_line(tmp_path):
    with pytest.raises(ArrayRefRefused, match=r"cannot serve line \d+ \(.*\): dynamic sizes"):
        wrapgen.aot_compile(torch.nn.ReLU(), (torch.randn(3, 4),), tmp_path / "dyn.wgpkg", dynamic=True, arrayref=True)


def test_non_contiguous_output_is_refused_naming_the_line(tmp_path):
    def transposed(x):
        return (x * 2).t()

    with pytest.raises(ArrayRefRefused, match=r"cannot serve line \d+ \(return .*\): output 0 \(\w+\) is not contiguous"):
        wrapgen.aot_compile(transposed, (torch.randn(3, 4),), tmp_path / "t.wgpkg", arrayref=True)


def test_scalar_input_is_refused(tmp_path):
    with pytest.raises(ArrayRefRefused, match=r"input \w+: a (int|float), not a tensor"):
        wrapgen.aot_compile(lambda x, k: x * k, (torch.randn(3), 2.5), tmp_path / "s.wgpkg", arrayref=True)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    return build_runner(tmp_path_factory.mktemp("cmake"))


def test_standalone_runner_arrayref(packages, runner, tmp_path):
    model, shape, path = packages["sdpa"]
    x = torch.randn(shape)
    write_tensor_file(tmp_path / "in.bin", {"x": x})
    done = subprocess.run([str(runner), path, str(tmp_path / "in.bin"), str(tmp_path / "out.bin"), "--arrayref", "--repeat", "20"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "array-ref entry" in done.stdout
    with torch.no_grad():
        torch.testing.assert_close(read_tensor_file(tmp_path / "out.bin")["output0"], model(x))


def test_cpp_example_calls_both_entries(packages, tmp_path):
    _, shape, path = packages["demo"]
    torch_dir = Path(torch_library_dir()).parent
    binary = tmp_path / "arrayref_call"
    subprocess.run(["g++", "-O1", "-std=c++17", f"-I{REPO / 'cpp_runtime' / 'include'}", f"-I{torch_dir / 'include'}",
                    str(REPO / "examples" / "arrayref_call.cpp"), f"-L{torch_lib}" if (torch_lib := torch_library_dir()) else "",
                    f"-Wl,-rpath,{torch_lib}", "-ltorch_cpu", "-lc10", "-ldl", "-o", str(binary)], check=True, timeout=120)
    write_tensor_file(tmp_path / "in.bin", {"x": torch.randn(shape)})
    done = subprocess.run([str(binary), path, str(tmp_path / "in.bin"), "200", "3"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "max |handle - arrayref|: 0\n" in done.stdout
    assert "array-ref entry:" in done.stdout


def test_outputs_that_are_inputs_or_repeated_are_copied(tmp_path):
    def f(x):
        y = torch.sigmoid(x) * 2
        return x, y, y

    path = wrapgen.aot_compile(f, (torch.randn(3, 5),), tmp_path / "alias.wgpkg", arrayref=True)
    runner = wrapgen.load_package(path, interface="arrayref")
    x = torch.randn(3, 5)
    got = runner(x)
    for value, expected in zip(got, f(x)):
        torch.testing.assert_close(value, expected)
    assert got[0].data_ptr() != x.data_ptr()  # the caller's output memory, not the input


def test_an_output_viewing_a_whole_buffer_is_written_in_the_callers_memory(tmp_path):
    """A library product viewed as the output ([6, 16] viewed as [2, 3, 16], the logits of a
    language model head) is computed straight into the caller's output memory: no copy at the
    end. An output that views only part of a buffer is still copied, and every result is right."""
    from wrapgen.api import optimize
    from wrapgen.backends.cpp.arrayref import ArrayRefEmitter

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 16).eval()

    def whole(x):
        return head(x)  # [2, 3, 8] -> the product [6, 16], viewed as [2, 3, 16]

    def part(x):
        return head(x)[1:]  # a view of the product's second half

    x = torch.randn(2, 3, 8)
    for fn, copies in ((whole, False), (part, True)):
        with torch.no_grad(), wrapgen.config.patch(matmul_kernel_limit=0):
            program = optimize(wrapgen.lower(fn, (x,)), "cpp")
            body = "\n".join(ArrayRefEmitter().arrayref_parts(program)["body"])
            path = wrapgen.aot_compile(fn, (x,), tmp_path / f"{fn.__name__}.wgpkg", arrayref=True)
        assert ("std::memcpy(outputs[0].data" in body) == copies, body
        runner = wrapgen.load_package(path, interface="arrayref")
        for _ in range(3):
            v = torch.randn(2, 3, 8)
            with torch.no_grad():
                torch.testing.assert_close(runner(v), fn(v))


def test_large_temporaries_use_the_per_thread_arena(tmp_path):
    from wrapgen.api import optimize
    from wrapgen.backends.cpp.arrayref import STACK_ARENA_BYTES, ArrayRefEmitter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 8)).eval()
    x = torch.randn(64, 64)
    with torch.no_grad():
        program = optimize(wrapgen.lower(model, (x,)), "cpp")
        assert ArrayRefEmitter().arrayref_parts(program)["arena_bytes"] > STACK_ARENA_BYTES
        path = wrapgen.aot_compile(model, (x,), tmp_path / "big.wgpkg", arrayref=True)
    runner = wrapgen.load_package(path, interface="arrayref")
    inputs = [torch.randn(64, 64) for _ in range(4)]
    with torch.no_grad():
        expected = [model(v) for v in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                torch.testing.assert_close(runner(inputs[i]), expected[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_update_weights_reaches_the_arrayref_entry(packages):
    model, shape, path = packages["mlp"]
    runner = wrapgen.load_package(path, interface="arrayref")
    other = e2e.MLP().eval()
    runner.update_weights({k: v for k, v in other.state_dict().items()})
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), other(x))


def _bind(model, handles: list[int]) -> tuple[int, int, str]:
    """wg_arrayref_bind on these handles: (status, context, message)."""
    library = model.handles.library
    library.wg_arrayref_bind.restype = ctypes.c_int32
    array = (ctypes.c_void_p * max(1, len(handles)))(*handles)
    context, message = ctypes.c_void_p(), ctypes.create_string_buffer(512)
    status = library.wg_arrayref_bind(array, ctypes.c_int64(len(handles)), ctypes.byref(context), message, ctypes.c_int64(512))
    return status, context.value or 0, message.value.decode()


@pytest.mark.parametrize("case, message", [
    ("dtype", r"constant 0 \(p_norm_weight\): expected dtype torch.float32, got torch.float64"),
    ("size", r"constant 0 \(p_norm_weight\): expected size 64 in dimension 0, got 32"),
    ("rank", r"constant 0 \(p_norm_weight\): expected rank 1, got 2"),
    ("strides", r"constant 5 \(p_fc1_weight_kmajor\): expected stride 256 in dimension 0, got 1"),
    ("null", r"constant 0 \(p_norm_weight\): null handle"),
    ("count", r"expected 8 constants, got 7"),
])
def test_binding_a_constant_that_does_not_match_names_it(packages, case, message):
    """wg_arrayref_bind checks every constant against the program once, so the bound entry can
    read their pointers without asking on each call: a wrong one is an error code naming it."""
    from wrapgen.backends.cpp.loader import _from_handles, _to_handles

    _, _, path = packages["demo"]
    model = wrapgen.load_package(path, interface="arrayref")._arrayref
    values = list(model.handles._constants.values)
    if case == "dtype":
        values[0] = values[0].double()
    elif case == "size":
        values[0] = values[0][:32].clone()
    elif case == "rank":
        values[0] = values[0][None].clone()
    elif case == "strides":  # the K-major weight in the other layout: same sizes, wrong order in memory
        values[5] = values[5].t().contiguous().t()
    elif case == "count":
        values = values[:-1]
    handles = _to_handles([v for v in values])
    if case == "null":
        handles[0], dropped = 0, handles[0]
    try:
        status, context, text = _bind(model, handles)
    finally:
        _from_handles([h for h in handles if h])
        if case == "null":
            _from_handles([dropped])
    assert (status, context) == (WG_INPUT_MISMATCH, 0)
    import re

    assert re.search(message, text), text


def test_bound_and_unbound_entries_agree_and_a_stray_context_is_refused(packages):
    _, shape, path = packages["demo"]
    model = wrapgen.load_package(path, interface="arrayref")._arrayref
    x = torch.randn(shape)
    in_array, keep_in = _array(x)
    outs = [torch.full((1, 64), 7.0) for _ in range(3)]
    arrays = [_array(o) for o in outs]
    message = ctypes.create_string_buffer(512)
    constants = model.handles._constants
    args = (ctypes.byref(in_array), ctypes.c_int64(1))
    tail = (message, ctypes.c_int64(512))
    assert model._entry(constants.array, constants.count, *args, ctypes.byref(arrays[0][0]), ctypes.c_int64(1), *tail) == 0
    bound = model._binding
    assert model._bound_entry(bound.context, *args, ctypes.byref(arrays[1][0]), ctypes.c_int64(1), *tail) == 0
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], torch.full((1, 64), 7.0))
    stray = ctypes.c_void_p(x.data_ptr())  # memory that is not a binding
    for context in (ctypes.c_void_p(0), stray):
        status = model._bound_entry(context, *args, ctypes.byref(arrays[2][0]), ctypes.c_int64(1), *tail)
        assert status == WG_INPUT_MISMATCH
        assert "not one wg_arrayref_bind of this model returned" in message.value.decode()
    assert torch.equal(outs[2], torch.full((1, 64), 7.0))  # nothing written
    del keep_in, arrays
