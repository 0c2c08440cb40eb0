"""The C++ target (`target="cpp"`): every end-to-end model of test_end_to_end.py, static and
dynamic, against eager on fresh inputs, with generated kernels on and off and in every
memory-planning mode; call-time input checks; the emitted source itself.

Each case compiles a real shared library with g++ (cached by content within the session).
"""

from __future__ import annotations

import re
import shutil
import threading

import pytest
import torch
from torch.utils import _pytree as pytree

import wrapgen
from tests import test_end_to_end as e2e
from wrapgen.backends.cpp import CppEmitter
from wrapgen.errors import InputMismatchError, UnsupportedLineError
from wrapgen.wrapper_ir import Comment, ExternKernel, Output, Program, TensorRef
from wrapgen.wrapper_ir.program import TensorInput
from wrapgen.wrapper_ir.values import TensorType

# (kernels, memory_planning): every model runs in each; dynamic programs and small functions in
# a subset with kernels on and off and each planning mode (each case is a g++ build; CI has two
# cores).
ALL_MODES = [(k, p) for k in (True, False) for p in ("none", "reuse", "pooled")]
SOME_MODES = [(True, "reuse"), (False, "none"), (False, "pooled")]
DYNAMIC_MODES = [(True, "pooled"), (False, "reuse"), (True, "none")]


def mode_id(mode) -> str:
    kernels, planning = mode
    return f"{'kernels' if kernels else 'nokernels'}-{planning}"


def compile_cpp(model, example_inputs, mode, dynamic: bool = False):
    kernels, planning = mode
    with wrapgen.config.patch(kernels=kernels, memory_planning=planning):
        compiled = wrapgen.compile(model, example_inputs, target="cpp", dynamic=dynamic)
    assert compiled.target == "cpp"
    assert "aoti_torch" in compiled.source, "the emitted code talks to tensors through the C shim"
    return compiled


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def check_case(model, make, mode, calls: int = 2, **tolerances) -> None:
    """Eager and compiled on fresh inputs: same outputs, same input mutations, same aliasing."""
    compiled = compile_cpp(model, tuple(t.clone() for t in make()), mode)
    for _ in range(calls):
        inputs = make()
        eager_inputs = [t.clone() for t in inputs]
        compiled_inputs = [t.clone() for t in inputs]
        with torch.no_grad():
            expected = model(*eager_inputs)
            actual = compiled(*compiled_inputs)
        e2e.assert_same_result(actual, expected, **tolerances)
        torch.testing.assert_close(compiled_inputs, eager_inputs)
        e2e.assert_same_aliasing(actual, expected, compiled_inputs, eager_inputs)
        for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
            if any(storage_of(e) == storage_of(x) for x in eager_inputs):  # views of inputs keep eager's layout
                assert (a.stride(), a.storage_offset()) == (e.stride(), e.storage_offset())
    assert compiled.artifact.call.live_handles() == 0, "the model's code holds no tensor handle between calls"


MODELS = {
    "mlp": (lambda: e2e.MLP().eval(), e2e.fresh_randn(4, 8), {}),
    "conv_bn_pool": (lambda: e2e.ConvNet().eval(), e2e.fresh_randn(2, 3, 8, 8), {}),
    "mha_block": (lambda: e2e.MHABlock().eval(), e2e.fresh_randn(2, 5, 16), {"rtol": 1e-5, "atol": 1e-5}),
    "sdpa_block": (lambda: e2e.SDPABlock().eval(), e2e.fresh_randn(2, 5, 16), {"rtol": 1e-5, "atol": 1e-5}),
}

FUNCTIONS = {
    "topk_largest": (e2e.topk_largest, e2e.fresh_randn(6, 7)),
    "sort_descending": (e2e.sort_descending, e2e.fresh_randn(6, 7)),
    "topk_sort_variants": (e2e.topk_sort_variants, e2e.fresh_randn(6, 7)),
    "views_of_input": (e2e.views_of_input, e2e.fresh_randn(6, 8)),
    "views_of_intermediate": (e2e.views_of_intermediate, e2e.fresh_randn(6, 8)),
    "split_of_intermediate": (e2e.split_of_intermediate, e2e.fresh_randn(6, 8)),
    **{f"noncontiguous_{k}": (e2e.pointwise_reduce_reshape, (lambda m=m: (m(),))) for k, m in e2e.NONCONTIGUOUS.items()},
    "noncontiguous_matmul": (e2e.matmul_two_inputs, lambda: (torch.randn(6, 4).t(), torch.randn(12, 5)[::2])),
    **{k: v for k, v in e2e.CASES_7.items()},
    **{f"inplace_{k}": v for k, v in e2e.INPLACE.items()},
}


@pytest.mark.parametrize("mode", ALL_MODES, ids=mode_id)
@pytest.mark.parametrize("name", list(MODELS))
def test_model(name, mode):
    build, make, tolerances = MODELS[name]
    check_case(build(), make, mode, **tolerances)


@pytest.mark.parametrize("mode", SOME_MODES, ids=mode_id)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function(name, mode):
    fn, make = FUNCTIONS[name]
    check_case(fn, make, mode)


@pytest.mark.parametrize("mode", SOME_MODES, ids=mode_id)
def test_inplace_buffer_update(mode):
    eager, model = e2e.CountingModule(), e2e.CountingModule()
    compiled = compile_cpp(model, (torch.randn(2, 3),), mode)
    model.load_state_dict(eager.state_dict())
    for _ in range(3):
        x = torch.randn(2, 3)
        with torch.no_grad():
            e2e.assert_same_result(compiled(x), eager(x))
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()))


# -- dynamic shapes ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", DYNAMIC_MODES, ids=mode_id)
@pytest.mark.parametrize("case", list(e2e.DYNAMIC))
def test_dynamic(case, mode):
    build, make = e2e.DYNAMIC[case]
    model = build()
    compiled = compile_cpp(model, make(e2e.DYNAMIC_SIZES[0]), mode, dynamic=True)
    assert compiled.program.symbols
    e2e.check_dynamic(model, compiled, make)
    assert compiled.artifact.call.live_handles() == 0


@pytest.mark.parametrize(
    "case, bad",
    [("cat_with_doubled", (torch.randn(3, 4), torch.randn(7, 4))), ("flatten_add", (torch.randn(3, 5), torch.randn(14)))],
)
def test_dynamic_sizes_that_do_not_fit_raise(case, bad):
    build, make = e2e.DYNAMIC[case]
    compiled = compile_cpp(build(), make(e2e.DYNAMIC_SIZES[0]), (True, "reuse"), dynamic=True)
    with pytest.raises(InputMismatchError):
        compiled(*bad)
    e2e.check_dynamic(build(), compiled, make, calls_per_size=1)  # still usable


def test_torch_compile_with_cpp_target():
    model = e2e.MLP().eval()
    compiled = torch.compile(model, backend="wrapgen", options={"target": "cpp"}, dynamic=True, fullgraph=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))


def test_threads_calling_one_model_keep_their_own_call_buffers():
    """Each call packs its inputs into C memory it takes from the model's free list: threads
    calling at once, with sizes passed as int inputs (dynamic shapes), never see each other's."""
    model = e2e.MLP().eval()
    compiled = torch.compile(model, backend="wrapgen", options={"target": "cpp"}, dynamic=True, fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(3, 8))
        compiled(torch.randn(4, 8))  # dynamic from here: the sizes come in as int inputs
    failures: list[str] = []

    def work(rows: int) -> None:
        with torch.no_grad():
            for _ in range(40):
                x = torch.randn(rows, 8)
                out = compiled(x)
                if out.shape != (rows, model(x).shape[1]) or not torch.allclose(out, model(x), rtol=1e-4, atol=1e-5):
                    failures.append(f"rows {rows}")

    threads = [threading.Thread(target=work, args=(rows,)) for rows in (3, 5, 6, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_many_tensor_inputs_take_the_packed_handle_path():
    """A call with many tensor inputs (a decode step's weights and caches) writes its handles
    straight into the packed input array from the second call on: every call equal to eager's,
    threads included, and no handle left behind."""
    from wrapgen.backends.cpp import loader

    assert loader._capsule_reader() is not None  # g++ is here: the C loop is built

    def fn(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out * 0.5 + x
        return out

    xs = [torch.randn(3) for _ in range(40)]
    compiled = wrapgen.compile(fn, xs, target="cpp")
    failures: list[int] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(30):
            args = [torch.randn(3, generator=g) for _ in range(40)]
            if not torch.allclose(compiled(*args), fn(*args)):
                failures.append(seed)

    work(0)
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert compiled.artifact.call.live_handles() == 0
    # a non-tensor among them, once the packed path is taken: named, and the next call is right
    wrong = list(xs)
    wrong[7] = 3.0
    with pytest.raises(InputMismatchError, match="args_7: expected a tensor, got float"):
        compiled(*wrong)
    torch.testing.assert_close(compiled(*xs), fn(*xs))
    assert compiled.artifact.call.live_handles() == 0


def test_weights_swapped_while_threads_call():
    """`set_constants` while calls run: each call reads the set it started with, whole (a set
    swapped out is released only after its last call returns)."""
    model = torch.nn.Linear(8, 4).eval()
    x = torch.randn(3, 8)
    compiled = compile_cpp(model, (x,), (True, "reuse"))
    call = compiled.artifact.call
    specs = [c.name for c in compiled.program.constants]
    first = [compiled.program.constant_values()[name] for name in specs]
    with torch.no_grad():
        expected = model(x)
    sets = [first, [t * 2 for t in first]]  # the second set doubles the output
    stop = threading.Event()
    failures: list[str] = []

    def work() -> None:
        with torch.no_grad():
            while not stop.is_set():
                out = call([x])[0]
                if not (torch.allclose(out, expected, atol=1e-5) or torch.allclose(out, 2 * expected, atol=1e-5)):
                    failures.append("a call mixed two weight sets or read freed memory")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for k in range(200):
            call.set_constants([t.clone() for t in sets[k % 2]])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    call.set_constants(first)
    torch.testing.assert_close(call([x])[0], expected)


# -- bad inputs: Python exceptions, never a crash -------------------------------------------------


@pytest.fixture(scope="module")
def two_inputs():
    return compile_cpp(e2e.TwoInputs(), (torch.randn(4, 6), torch.randn(6, 3)), (True, "reuse"))


@pytest.mark.parametrize("problem", list(e2e.BAD_WEIGHTS))
def test_bad_input_raises(two_inputs, problem):
    make, patterns = e2e.BAD_WEIGHTS[problem]
    with pytest.raises(InputMismatchError) as info:
        two_inputs(torch.randn(4, 6), make())
    message = str(info.value)
    assert "weight" in message, message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    torch.testing.assert_close(two_inputs(torch.randn(4, 6), torch.ones(6, 3)).shape, torch.Size([4, 3]))


@pytest.mark.parametrize(
    "args",
    [(torch.randn(4, 6),), (torch.randn(4, 6), torch.randn(6, 3), torch.randn(1)), (torch.randn(4, 6), [1.0, 2.0]),
     (torch.randn(4, 6), 3)],
    ids=["too_few", "too_many", "list", "int"],
)
def test_wrong_count_or_kind_raises(two_inputs, args):
    with pytest.raises((TypeError, ValueError)):
        two_inputs(*args)


def test_boxed_call_checks_count_and_kind(two_inputs):
    call = two_inputs.artifact.call
    with pytest.raises(InputMismatchError, match="expected 2 inputs, got 1"):
        call([torch.randn(4, 6)])
    with pytest.raises(InputMismatchError, match="input weight: expected a tensor, got str"):
        call([torch.randn(4, 6), "w"])


def test_check_finite():
    with wrapgen.config.patch(check_finite=True):
        compiled = wrapgen.compile(e2e.log_of, (torch.rand(5) + 0.5,), target="cpp")
    x = torch.rand(5) + 0.5
    torch.testing.assert_close(compiled(x), e2e.log_of(x))
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        compiled(torch.tensor([1.0, -1.0, 2.0, 3.0, 4.0]))
    assert compiled.artifact.call.live_handles() == 0


def test_nan_passes_through_without_check_finite():
    compiled = wrapgen.compile(e2e.log_of, (torch.rand(5) + 0.5,), target="cpp")
    x = torch.tensor([1.0, -1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(compiled(x), e2e.log_of(x), equal_nan=True)


# -- the emitted source and refusals ----------------------------------------------------------------


def test_source_uses_only_the_stable_shim():
    compiled = compile_cpp(e2e.SDPABlock().eval(), (torch.randn(2, 5, 16),), (False, "reuse"))
    source = compiled.source
    assert "at::" not in source and "torch::" not in source and "c10::" not in source
    assert "aoti_torch_cpu_addmm_out" in source  # Scalar args (beta, alpha) through the generated shim
    assert 'st.call("aten::scaled_dot_product_attention"' in source  # any other op through the dispatcher
    assert "wrapgen::Stack::none()" in source  # a None argument (attn_mask) is a null value
    meta = compiled.artifact.call.metadata
    assert "aoti_torch_call_dispatcher" in meta["shims"] and "aoti_torch_cpu_addmm_out" in meta["shims"]


def test_floor_division_uses_header_helpers():
    program = Program(
        "p",
        (TensorInput("x", TensorType(torch.float32, torch.device("cpu"), (sympy_symbol("s0"),), (1,))),),
        (),
        (),
        (Comment("size arithmetic"), Output((sympy_floordiv(sympy_symbol("s0"), 3), sympy_mod(sympy_symbol("s0"), 3)))),
    )
    source = CppEmitter().emit(program)
    assert "wg_floordiv(s0, 3)" in source and "wg_mod(s0, 3)" in source


def test_unsupported_line_is_refused_naming_it():
    x = TensorRef("x")
    program = Program(
        "p",
        (TensorInput("x", TensorType(torch.float32, torch.device("cpu"), (3,), (1,))),),
        (),
        (),
        (ExternKernel("y", "aten::leaky_relu.default", (x, 2), result=None), Output((TensorRef("y"),))),
    )
    with pytest.raises(UnsupportedLineError, match=r"line 1 \(y: None = extern aten::leaky_relu"):
        CppEmitter().emit(program)


def sympy_symbol(name: str):
    import sympy

    return sympy.Symbol(name, integer=True, positive=True)


def sympy_floordiv(a, b):
    from torch.utils._sympy.functions import FloorDiv

    return FloorDiv(a, b)


def sympy_mod(a, b):
    from torch.utils._sympy.functions import PythonMod

    return PythonMod(a, b)


def test_gpu_kernel_launch_is_emitted_through_the_driver_loader():
    """A Triton kernel on CUDA: launched from C++ with the stream read once per run, the grid
    from the IR, int32/int64 arguments as the kernel was compiled, and the unaligned variant
    chosen when a maybe-unaligned input is not 16-byte aligned. (Emission only: building and
    running need a GPU, tests/test_cuda.py.)"""
    import sympy

    from wrapgen.wrapper_ir import Allocate, KernelCall, KernelDefinition

    cuda = torch.device("cuda:0")

    x_type = TensorType(torch.float32, cuda, (8,), (1,))
    kernel = KernelDefinition(
        "triton_k0",
        "triton",
        "@triton.jit\ndef triton_k0(in_ptr0, out_ptr1, xnumel, XBLOCK: tl.constexpr):\n    pass\n",
        (("device", "cuda:0"), ("arg_names", ("in_ptr0", "out_ptr1", "xnumel")),
         ("arg_types", ("ptr:float32", "ptr:float32", "int32")), ("constexprs", (("XBLOCK", 128),)),
         ("num_warps", 4), ("unaligned", ("in_ptr0",))),
    )
    program = Program(
        "p",
        (TensorInput("x", x_type),),
        (),
        (),
        (
            Allocate("buf0", x_type),
            kernel,
            KernelCall("triton_k0", (TensorRef("x"), TensorRef("buf0"), 8), grid=(sympy.Integer(1),)),
            KernelCall("triton_k0", (TensorRef("buf0"), TensorRef("buf0"), 8), grid=(sympy.Integer(1),)),
            Output((TensorRef("buf0"),)),
        ),
    )
    emitter = CppEmitter()
    source = emitter.emit(program)
    assert source.count("wrapgen::current_cuda_stream(0)") == 1  # once per run, not per launch
    assert "wrapgen::CudaDeviceGuard cuda_guard(0);" in source
    assert "int32_t a2 = static_cast<int32_t>(8);" in source
    assert "(wrapgen::cuda::aligned16(a0) ? wg_cuda_triton_k0 : wg_cuda_triton_k0_unaligned).launch(0, 1, 1, 1, cuda_stream_0, {&a0, &a1, &a2});" in source
    assert "extern const wrapgen::cuda::Kernel wg_cuda_triton_k0_unaligned;" in source
    assert emitter.devices_used == {"cuda"}


def test_precompiled_header_is_made_once_a_cache_holds_enough_models(tmp_path) -> None:
    """The first models a cache builds compile without a precompiled runtime header (making
    one costs more than it saves a build or two); the next build makes it, later ones use it."""
    from wrapgen.backends.cpp import build as cpp_build
    from wrapgen.kernels.cpp import build as kernel_build

    x = torch.randn(4, 8)
    # k + 1 outputs: each model's wrapper differs (an identical wrapper reuses its cached object)
    models = [lambda t, k=k: [torch.relu(t) + i for i in range(k + 1)] for k in range(cpp_build.PCH_AFTER_MODELS + 2)]
    commands: list[list[str]] = []
    run = kernel_build._run

    def record(cmd, what, source=None):
        commands.append(list(cmd))
        run(cmd, what, source)

    with wrapgen.config.patch(cache_dir=str(tmp_path)), pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_build, "_run", record)
        for built, model in enumerate(models):
            made_before = cpp_build.precompiled_header() is not None
            commands.clear()
            compiled = wrapgen.compile(model, (x,), target="cpp")
            torch.testing.assert_close(compiled(x), model(x))
            wrappers = [c for c in commands if any(a.endswith(".cpp") and "/model_" in a for a in c)]
            assert len(wrappers) == 1, commands
            assert ("-include" in wrappers[0]) == made_before, built
            assert (cpp_build.precompiled_header() is not None) == (built >= cpp_build.PCH_AFTER_MODELS), built


def test_build_survives_a_deleted_cache_directory(tmp_path) -> None:
    """A cache directory removed between builds (as the benchmarks remove their temporary one)
    is filled again, never referenced: the precompiled runtime header is looked up per build."""
    from wrapgen.backends.cpp import build as cpp_build

    x = torch.randn(4, 8)
    first = tmp_path / "first"
    with wrapgen.config.patch(cache_dir=str(first)):
        for k in range(cpp_build.PCH_AFTER_MODELS + 1):
            wrapgen.compile(lambda t, k=k: torch.relu(t) + k, (x,), target="cpp")
        assert cpp_build.precompiled_header() is not None
    shutil.rmtree(first)
    with wrapgen.config.patch(cache_dir=str(tmp_path / "second")):
        compiled = wrapgen.compile(lambda t: torch.tanh(t) * 2, (x,), target="cpp")
    torch.testing.assert_close(compiled(x), torch.tanh(x) * 2)


def test_a_fast_linker_that_fails_gives_way_to_the_default(tmp_path, monkeypatch) -> None:
    """A linker that passed the probe but cannot link this model (another toolchain's libraries)
    must not fail the build: the default linker links it."""
    from wrapgen.kernels.cpp import build as kernel_build

    monkeypatch.setattr(kernel_build, "fast_linker_flags", lambda: ("-fuse-ld=wrapgen-no-such-linker",))
    x = torch.randn(4, 8)
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        compiled = wrapgen.compile(lambda t: torch.sigmoid(t) * 3, (x,), target="cpp")
    torch.testing.assert_close(compiled(x), torch.sigmoid(x) * 3)



def _impl_index_program(device: torch.device) -> Program:
    """`_batch_norm_impl_index`: results (Tensor, Tensor, Tensor, Tensor, int), the first read."""
    from wrapgen.wrapper_ir import MultiOutput

    x_type = TensorType(torch.float32, device, (4, 3, 5), (15, 5, 1))
    c_type = TensorType(torch.float32, device, (3,), (1,))
    names = ("x", "w", "b", "mean", "var")
    inputs = tuple(TensorInput(n, x_type if n == "x" else c_type) for n in names)
    results = (TensorType(torch.float32, device, (4, 3, 5)), None, None, None, None)
    args = (*(TensorRef(n) for n in names), False, 0.1, 1e-5, True)
    lines = (
        ExternKernel("r", "aten::_batch_norm_impl_index.default", args, result=results),
        MultiOutput("y", "r", (0,), TensorType(torch.float32, device, (4, 3, 5))),
        Output((TensorRef("y"),)),
    )
    return Program("p", inputs, (), (), lines)


def test_mixed_tensor_and_int_results_are_refused_on_the_dispatcher_route():
    """torch's `aoti_torch_call_dispatcher` types result i as result n-1-i, so an op whose
    results mix tensors and ints in an order that does not read the same both ways would come
    back mistyped: the C++ target refuses it, naming the line."""
    with pytest.raises(UnsupportedLineError, match="_batch_norm_impl_index.*mistypes mixed results"):
        CppEmitter().emit(_impl_index_program(torch.device("cpu")))


def test_scalar_results_of_a_generated_shim_are_not_held():
    """cuDNN attention through its generated shim: the int results (max_q, max_k) go to
    `int64_t` temporaries and leave empty items, so tensor elements keep their indices.
    (Emission only: running it needs a GPU.)"""
    from wrapgen.wrapper_ir import MultiOutput

    cuda = torch.device("cuda:0")
    q_type = TensorType(torch.bfloat16, cuda, (2, 4, 8, 16), (512, 128, 16, 1))
    inputs = tuple(TensorInput(n, q_type) for n in ("q", "k", "v"))
    results = (q_type, *(TensorType(torch.float32, cuda, (2, 4, 8)),) * 3, None, None, *(q_type,) * 3)
    args = (TensorRef("q"), TensorRef("k"), TensorRef("v"), None, True)
    lines = (
        ExternKernel("r", "aten::_scaled_dot_product_cudnn_attention.default", args, result=results),
        MultiOutput("o", "r", (0,), q_type),
        MultiOutput("lse", "r", (1,), TensorType(torch.float32, cuda, (2, 4, 8))),
        Output((TensorRef("o"), TensorRef("lse"))),
    )
    source = CppEmitter().emit(Program("p", inputs, (), (), lines))
    assert "aoti_torch_cuda__scaled_dot_product_cudnn_attention(" in source
    assert source.count("int64_t ret") == 2 and "t_r.items.emplace_back();" in source


def test_none_for_a_plain_tensor_argument_is_an_undefined_tensor():
    """cuDNN attention's backward declares `Tensor attn_bias` and receives None (eager's argument
    parser turns that into an undefined tensor): the C++ target passes an undefined tensor too.
    (Emission only: running it needs a GPU.)"""
    cuda = torch.device("cuda:0")
    q_type = TensorType(torch.bfloat16, cuda, (2, 4, 8, 16), (512, 128, 16, 1))
    lse_type = TensorType(torch.float32, cuda, (2, 4, 8), (32, 8, 1))
    scalar = TensorType(torch.int64, cuda, (), ())
    names = {"grad": q_type, "q": q_type, "k": q_type, "v": q_type, "out": q_type, "lse": lse_type, "seed": scalar,
             "offset": scalar, "cq": scalar, "ck": scalar}
    inputs = tuple(TensorInput(n, t) for n, t in names.items())
    refs = {n: TensorRef(n) for n in names}
    args = (*(refs[n] for n in ("grad", "q", "k", "v", "out", "lse", "seed", "offset")), None, refs["cq"], refs["ck"],
            8, 8, 0.0, True)
    from wrapgen.wrapper_ir import MultiOutput

    lines = (
        ExternKernel("g", "aten::_scaled_dot_product_cudnn_attention_backward.default", args, result=(q_type,) * 3),
        MultiOutput("dq", "g", (0,), q_type),
        Output((TensorRef("dq"),)),
    )
    source = CppEmitter().emit(Program("p", inputs, (), (), lines))
    assert "aoti_torch_cuda__scaled_dot_product_cudnn_attention_backward(" in source
    assert "aoti_torch_new_uninitialized_tensor(&" in source
