"""User-defined Triton kernels (torch.library.triton_op + wrap_triton, @triton.autotune) in
compiled programs: lowered to KernelDefinition lines holding the user's source, launched by
every target, autotuned once per key at run time, mutated arguments declared as written.

On CPU, torch captures these launches (torch.export, torch.compile) when the kernels are real
JITFunctions (tests/user_triton_kernels.py defines them so), and wrapgen runs them in Triton's
interpreter; the C++ target launches Triton kernels only on the GPU (cuda-marked tests)."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from tests.user_triton_kernels import accumulate, plain_mul, scale_add, scale_add_reference
from wrapgen.errors import LoweringError, UnsupportedLineError
from wrapgen.kernels.choice import BENCHMARKS
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir import KernelDefinition, MultiKernelCall

interpreter = pytest.mark.skipif(
    not (compat.available() and compat.interpreting()), reason="needs triton in interpreter mode (CPU machines)"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def program_fn(acc, x, y):
    a = scale_add(x, y)  # call site 1
    b = scale_add(x[:50].cos(), y[:50])  # call site 2, another size: another autotune key
    accumulate(acc, a)  # a mutated argument (acc is a program input)
    return b * 2, plain_mul(a, 1.5)


def scale_add_only(x, y):
    return scale_add(x, y)


def reference(acc, x, y):
    a = scale_add_reference(x, y)
    b = scale_add_reference(x[:50].cos(), y[:50])
    acc += a
    return b * 2, a * 1.5


def check_calls(fn, sizes, device="cpu") -> None:
    for n in sizes:
        args = [torch.randn(n, device=device) for _ in range(3)]
        expected_acc = args[0].clone()
        expected = reference(expected_acc, args[1].clone(), args[2].clone())
        torch.testing.assert_close(fn(*args), expected)
        torch.testing.assert_close(args[0], expected_acc)


@pytest.fixture
def triton_on_cpu():
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        yield


def _definitions(program) -> list[KernelDefinition]:
    return [line for line in program.lines if isinstance(line, KernelDefinition) and dict(line.metadata).get("user_kernel")]


@interpreter
def test_program_holds_the_user_kernel_source_and_an_autotune_choice(triton_on_cpu):
    program = wrapgen.lower(program_fn, (torch.randn(100), torch.randn(100), torch.randn(100)))
    text = str(program)
    assert "kernel user_scale_add_kernel_0 [triton]" in text and "user_kernel='scale_add_kernel'" in text
    assert "choose autotune autotune_scale_add_kernel_" in text
    definitions = _definitions(program)
    source = next(d.source for d in definitions if d.name == "user_scale_add_kernel_0")
    # verbatim: the docstring's escaped quotes and backslash, non-ASCII text, helpers and constexprs
    assert '\\"\\"\\" quotes, a backslash \\\\ and ünïcödé' in source
    assert "def _twice(x):" in source and "def halve(x):" in source
    assert "helpers = types.ModuleType('tests.user_triton_helpers')" in source and "helpers.halve = halve" in source
    assert "SHIFT = tl.constexpr(3)" in source
    compile(source, "user_kernel", "exec")  # the module is valid Python as stored
    choices = [line for line in program.lines if isinstance(line, MultiKernelCall)]
    assert {c.key for c in choices if "scale_add" in c.choice} == {(100,), (50,)}
    # grids are evaluated per config; configs with equal grids share one grid computation
    assert all(len(c.grids()) == 2 and len(c.candidates) == 3 for c in choices if "scale_add" in c.choice)
    source = wrapgen.build(program, "python").source
    assignments = [ln for ln in source.splitlines() if ln.strip().startswith("_grid") and " = " in ln]
    assert len(assignments) == sum(len(c.grids()) for c in choices)
    configs = {dict(d.metadata)["num_warps"] for d in definitions if "scale_add" in d.name}
    assert configs == {1, 2}
    # the mutated input is declared as written (memory planning and the verifier see it)
    accumulate_choice = next(c for c in choices if "accumulate" in c.choice)
    assert accumulate_choice.writes


@interpreter
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("target", ["python", "fx", "interpret"])
def test_user_kernels_match_eager(triton_on_cpu, target, dynamic):
    BENCHMARKS.clear()
    fn = wrapgen.compile(program_fn, (torch.randn(100), torch.randn(100), torch.randn(100)), target=target, dynamic=dynamic)
    sizes = [100, 100, 80] if dynamic else [100, 100]
    check_calls(fn, sizes)
    scale = sum(v for k, v in BENCHMARKS.items() if "scale_add" in k)
    accumulated = sum(v for k, v in BENCHMARKS.items() if "accumulate" in k)
    # once per autotune key: site 1 at n (100, then 80 when dynamic), site 2 at 50
    assert (scale, accumulated) == ((3, 2) if dynamic else (2, 1))


@interpreter
@pytest.mark.parametrize("target", ["python", "fx"])
def test_user_kernels_through_torch_compile(triton_on_cpu, target):
    fn = torch.compile(program_fn, backend="wrapgen", options={"target": target})
    check_calls(fn, [100])


@interpreter
def test_source_round_trips_on_every_target(triton_on_cpu, tmp_path):
    from wrapgen.kernels.triton.runtime import source_path

    x = torch.randn(64)
    program = wrapgen.lower(scale_add_only, (x, torch.randn(64)))
    definitions = _definitions(program)
    for d in definitions:  # the file Triton reads back
        assert source_path(d.source).read_text(encoding="utf-8") == d.source
    python = wrapgen.build(program, "python")
    for d in definitions:  # embedded with repr(): the module evaluates it back to the same text
        assert repr(d.source) in python.source
    from wrapgen.api import optimize
    from wrapgen.backends.fx.emitter import FxEmitter

    graph_module = FxEmitter().emit(optimize(program))
    assert all(graph_module.meta["wrapgen_kernels"][d.name] == d.source for d in definitions)
    fx = wrapgen.build(program, "fx")
    args = (torch.randn(64), torch.randn(64))
    torch.testing.assert_close(tuple(fx.call(list(args)))[0], scale_add_reference(*args))
    # C++ launches Triton kernels from their cubins, on CUDA only: refused here, naming the line
    # (the first Triton kernel: the write-back of the mutated input, or the user's kernel)
    with pytest.raises(UnsupportedLineError, match=r"kernel \w+ \[triton\].*no C\+\+ launcher for triton kernels"):
        wrapgen.build(program, "cpp")


def test_unsupported_kernels_are_refused_naming_the_kernel():
    from tests.user_triton_kernels import jit_compiled
    from wrapgen.kernels.triton.user_kernels import constant_expr, describe

    with jit_compiled():
        import triton
        import triton.language as tl

        @triton.heuristics({"BLOCK": lambda args: 16})
        @triton.jit
        def heuristic_kernel(x_ptr, BLOCK: tl.constexpr):
            pass

    with pytest.raises(LoweringError, match="heuristic_kernel"):
        describe(heuristic_kernel)
    with pytest.raises(LoweringError, match="argument scale"):
        constant_expr(object(), "argument scale")


def test_multi_kernel_line_is_checked():
    from wrapgen.wrapper_ir import KernelCall, TensorRef

    call = KernelCall("k0", (TensorRef("x"),), (), ("x",))
    line = MultiKernelCall("c", (call, KernelCall("k1", (TensorRef("x"),), (), ("x",))), (), "autotune")
    assert line.writes == ("x",) and line.called_kernels() == ("k0", "k1")
    assert str(line).startswith("choose autotune c per () among {k0(x) grid#0 | k1(x) grid#0}")
    with pytest.raises(ValueError, match="no candidates"):
        MultiKernelCall("c", ()).check()
    with pytest.raises(ValueError, match="no candidate serves every bucket"):
        MultiKernelCall("c", (call,), (4,), "multi_kernel", True, (16,)).check()


# -- GPU (H100): the acceptance runs ----------------------------------------------------------------
@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("target", ["python", "fx", "cpp"])
def test_user_kernels_match_eager_on_cuda(target, dynamic):
    BENCHMARKS.clear()
    example = [torch.randn(100, device="cuda") for _ in range(3)]
    fn = wrapgen.compile(program_fn, example, target=target, dynamic=dynamic)
    check_calls(fn, [100, 100, 80] if dynamic else [100, 100], "cuda")
    assert any(isinstance(line, MultiKernelCall) for line in fn.program.lines)
    if target != "cpp":  # the C++ target's choices count in C++
        scale = sum(v for k, v in BENCHMARKS.items() if "scale_add" in k)
        assert scale == (3 if dynamic else 2)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("target", ["python", "fx", "cpp"])
def test_user_kernels_through_torch_compile_on_cuda(target):
    fn = torch.compile(program_fn, backend="wrapgen", options={"target": target})
    check_calls(fn, [100, 100], "cuda")



@interpreter
def test_mutation_op_writes_its_tensor_arguments_in_place(triton_on_cpu):
    """make_fx without functionalization leaves `triton_kernel_wrapper_mutation`: every tensor
    argument is declared written, and no fused read is deferred past the launch."""
    import triton
    from torch.fx.experimental.proxy_tensor import make_fx

    from tests.user_triton_kernels import plain_mul_kernel
    from wrapgen.lowering.capture import capture_aten_graph
    from wrapgen.lowering.lower import lower_captured

    def f(x):
        out = torch.empty_like(x)
        torch.library.wrap_triton(plain_mul_kernel)[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), 2.0)
        return out.sin()

    program = lower_captured(capture_aten_graph(make_fx(f, tracing_mode="fake")(torch.randn(100))))
    (call,) = [line for line in program.lines if getattr(line, "kernel", None) == "user_plain_mul_kernel"]
    assert set(call.writes) == set(call.uses())
    for target in ("python", "fx", "interpret"):
        x = torch.randn(100)
        torch.testing.assert_close(wrapgen.build(program, target).call([x])[0], (x * 2).sin())
