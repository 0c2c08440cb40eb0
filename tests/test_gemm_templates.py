"""max_autotune: GEMM templates with fused epilogues, chosen by measurement at compile time.

CPU: the C++ template for mm / addmm / bmm with each epilogue (bias, GELU, SiLU, residual
add, scaling, cast to bf16) on the python, cpp and fx targets, against eager. Triton: the
same template code under TRITON_INTERPRET=1 on tiny sizes (python and fx targets), and on
CUDA (marked). The tuner: candidates and the choice in str(program), the winner cached on
disk (a second compile measures nothing), the library call kept when it is the only
candidate, and no change at all without the option.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.kernels.templates import autotune, cpp_gemm, triton_gemm, triton_skinny
from wrapgen.kernels.triton import compat
from wrapgen.lowering.gemm_templates import misaligned
from wrapgen.wrapper_ir.lines import Comment, ExternKernel, KernelDefinition

TARGETS = ["python", "cpp", "fx"]


@pytest.fixture(autouse=True)
def templates_only(monkeypatch):
    """Templates always win (the library is no candidate) so every test runs them; one C++
    tiling (two where a test measures) keeps the compiles short. Small matmuls that would
    become generated reductions (matmul_kernel_limit) stay products."""
    full = cpp_gemm.cpp_configs
    monkeypatch.setattr(cpp_gemm, "cpp_configs", lambda problem: full(problem)[:1])
    with wrapgen.config.patch(max_autotune=True, max_autotune_gemm_backends="template", matmul_kernel_limit=0):
        yield


def _fresh(args: tuple) -> tuple:
    return tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)


def check(fn, args, targets=TARGETS, **tol) -> wrapgen.wrapper_ir.Program:
    """Compile `fn` for each target, compare with eager on fresh inputs; the lowered program."""
    program = wrapgen.lower(fn, args)
    for target in targets:
        compiled = wrapgen.compile(fn, args, target=target)
        fresh = _fresh(args)
        torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tol)
    return program


def templates(program) -> list[KernelDefinition]:
    return [line for line in program.lines if isinstance(line, KernelDefinition) and "template" in dict(line.metadata)]


def _linear(x, w, b):
    return F.linear(x, w, b)  # addmm with a transposed weight: B strides (1, K)


EPILOGUES = {
    "bias": lambda x, w, b, r: _linear(x, w, b),
    "gelu": lambda x, w, b, r: F.gelu(_linear(x, w, b)),
    "silu": lambda x, w, b, r: F.silu(x @ w.t()),
    "residual": lambda x, w, b, r: _linear(x, w, b) + r,
    "scale": lambda x, w, b, r: (x @ w.t()) * 0.125,
    "cast_bf16": lambda x, w, b, r: (_linear(x, w, b) * 2.0).to(torch.bfloat16),
}


EPILOGUE_ARGS = (torch.Size([37, 48]), torch.Size([40, 48]), torch.Size([40]), torch.Size([37, 40]))


@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_cpu_epilogue_fused_into_template(epilogue):
    fn = EPILOGUES[epilogue]
    args = tuple(torch.randn(s) for s in EPILOGUE_ARGS)
    program = check(fn, args, targets=["python", "fx"])  # the cpp target: below, all in one program
    (kernel,) = templates(program)
    assert not any(isinstance(line, ExternKernel) and "mm" in line.op for line in program.lines)
    assert all(line.name == kernel.name for line in program.lines if isinstance(line, KernelDefinition))
    meta = dict(kernel.metadata)
    assert meta["template"].startswith("cpp_gemm_") and meta["autotune"].startswith("autotune ")
    if epilogue != "bias":  # the pointwise work runs in the template: no second kernel
        assert "," in meta["ops"]


def test_cpu_every_epilogue_on_the_cpp_target():
    """The six epilogues as six products of one program: one C++ build for all of them."""

    def fn(x, w, b, r):
        return tuple(epilogue(x, w, b, r) for epilogue in EPILOGUES.values())

    program = check(fn, tuple(torch.randn(s) for s in EPILOGUE_ARGS), targets=["cpp"])
    names = {k.name for k in templates(program)}
    # every product is a template call (those of the same code share one kernel); the epilogues
    # repeat two products (x @ w.t() with and without the bias), computed once each
    # (graph_passes/common_subexpressions.py) and read by the epilogues fused with them
    calls = sum(getattr(line, "kernel", None) in names for line in program.lines)
    assert 2 <= calls < len(EPILOGUES), str(program)
    assert not any(isinstance(line, ExternKernel) and "mm" in line.op for line in program.lines)


@pytest.mark.parametrize("op", ["mm", "addmm_alpha_beta", "bmm_relu", "bf16_linear"])
def test_cpu_products(op):
    if op == "mm":
        fn, args, tol = (lambda a, b: a @ b), (torch.randn(33, 70), torch.randn(70, 19)), {}
    elif op == "addmm_alpha_beta":
        fn = lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)  # noqa: E731
        args = (torch.randn(20, 24), torch.randn(20, 300), torch.randn(300, 24))
        tol = {"atol": 1e-4, "rtol": 1e-4}  # 300-term float sums in another order than the library's
    elif op == "bmm_relu":
        fn, args, tol = (lambda a, b: torch.bmm(a, b).relu()), (torch.randn(3, 17, 40), torch.randn(3, 40, 23)), {}
    else:
        w, b = torch.randn(40, 64, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
        fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
        args, tol = (torch.randn(24, 64, dtype=torch.bfloat16), w, b), {"atol": 2e-2, "rtol": 2e-2}
    program = check(fn, args, targets=TARGETS if op in ("bmm_relu", "bf16_linear") else ["python", "fx"], **tol)
    assert len(templates(program)) == 1


@pytest.fixture
def two_tilings(monkeypatch):
    full = cpp_gemm.CppGemmConfig
    vw = cpp_gemm.vector_width()
    monkeypatch.setattr(cpp_gemm, "cpp_configs", lambda problem: [full(32, 2 * vw, 128, 4, vw), full(48, 2 * vw, 64, 6, 2 * vw)])


class SwiGLU(torch.nn.Module):
    """A Llama-style MLP on [batch, tokens, dim] input: each product is read back through a view."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = torch.nn.Linear(32, 48, bias=False), torch.nn.Linear(32, 48, bias=False)
        self.down = torch.nn.Linear(48, 32)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x)) + x


def test_linear_on_3d_input_fuses_through_the_view():
    model = SwiGLU()
    program = check(model, (torch.randn(2, 9, 32),), targets=["python", "fx"], atol=1e-5, rtol=1e-4)
    ops = sorted(dict(k.metadata)["ops"] for k in templates(program))
    assert ops == ["aten::addmm,aten::add.Tensor", "aten::mm", "aten::mm,aten::mul.Tensor"]
    assert not any(isinstance(line, KernelDefinition) and "template" not in dict(line.metadata) for line in program.lines)


def test_identical_layers_share_one_template():
    layers = [torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.GELU()) for _ in range(3)]
    program = check(torch.nn.Sequential(*layers), (torch.randn(24, 40),), targets=["python"])
    (kernel,) = templates(program)
    assert sum(getattr(line, "kernel", None) == kernel.name for line in program.lines) == 3


def test_program_text_records_candidates_and_choice(two_tilings):
    with wrapgen.config.patch(max_autotune_gemm_backends="aten,template"):
        program = wrapgen.lower(lambda a, b: F.gelu(a @ b), (torch.randn(30, 40), torch.randn(40, 50)))
    text = str(program)
    assert "autotune mm 30x40 @ 40x50 float32" in text
    for tag in ("aten", "cpp_gemm_"):
        assert tag in text
    assert text.count("*") >= 1  # the chosen candidate is marked


def test_winner_cached_on_disk_second_compile_measures_nothing(two_tilings):
    fn, args = (lambda a, b: (a @ b).relu()), (torch.randn(26, 44), torch.randn(44, 52))
    before = dict(autotune.stats)
    first = wrapgen.lower(fn, args)
    assert autotune.stats["benchmarked"] == before["benchmarked"] + 1
    files = list((wrapgen.cache.cache_root() / "autotune").glob("gemm_*.json"))
    assert files
    second = wrapgen.lower(fn, args)
    assert autotune.stats["benchmarked"] == before["benchmarked"] + 1
    assert autotune.stats["cache_hits"] == before["cache_hits"] + 1
    assert dict(templates(second)[0].metadata)["template"] == dict(templates(first)[0].metadata)["template"]
    assert " cached:" in dict(templates(second)[0].metadata)["autotune"]


def test_library_only_keeps_the_call_and_says_so():
    fn, args = (lambda a, b: (a @ b).relu()), (torch.randn(26, 44), torch.randn(44, 52))
    with wrapgen.config.patch(max_autotune_gemm_backends="aten"):
        program = check(fn, args, targets=["python"])
    assert any(isinstance(line, ExternKernel) and line.op == "aten::mm.out" for line in program.lines)
    assert any(isinstance(line, Comment) and "aten (only candidate)" in line.text for line in program.lines)
    assert not templates(program)


def test_off_by_default_and_dynamic_sizes_keep_the_library():
    fn, args = (lambda a, b: (a @ b).relu()), (torch.randn(26, 44), torch.randn(44, 52))
    with wrapgen.config.patch(max_autotune=False):
        assert not templates(wrapgen.lower(fn, args))
        assert wrapgen.compile(fn, args, dynamic=True).at_hints is None  # nothing to measure
    program = wrapgen.lower(fn, args, dynamic=True)
    assert not templates(program)


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_sizes_run_the_measured_template_only_at_the_example_sizes(target):
    """Choose per size hint, the library call elsewhere: the example's sizes get a program of
    their own with the product measured (here: the template, its epilogue fused); any other
    size runs the dynamic program, whose product is the library call."""
    fn, args = (lambda a, b: (a @ b).relu()), (torch.randn(26, 44), torch.randn(44, 52))
    compiled = wrapgen.compile(fn, args, target=target, dynamic=True)
    assert not templates(compiled.program)
    assert any(isinstance(line, ExternKernel) and line.op == "aten::mm.out" for line in compiled.program.lines)
    assert compiled.at_hints is not None and len(templates(compiled.at_hints.function.program)) == 1
    served = []
    static = compiled.at_hints.function
    compiled.at_hints.function = lambda *a, **k: served.append(a[0].shape) or static(*a, **k)
    for rows in (26, 9, 26, 40):
        x, w = torch.randn(rows, 44), torch.randn(44, 52)
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert served == [(26, 44), (26, 44)]
    # the example's shape at other strides, or of another dtype, is not the example's layout
    assert compiled.at_hints.matches([torch.randn(26, 44), torch.randn(44, 52)])
    assert not compiled.at_hints.matches([torch.randn(44, 26).t(), torch.randn(44, 52)])
    assert not compiled.at_hints.matches([torch.randn(26, 44).double(), torch.randn(44, 52)])


ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA)])
@pytest.mark.parametrize("target", TARGETS)
def test_torch_compile_dynamic_runs_the_measured_templates_only_at_the_size_hints(target, device, monkeypatch):
    """The same under torch.compile(dynamic=True), per aot_autograd graph: the forward and the
    backward each get a program traced at their size hints with the products measured, which
    serves the calls at those sizes; every other size runs the dynamic graphs' library calls.
    Gradients equal eager's at every size."""
    import functools

    import wrapgen.dynamo

    calls = {}
    lower = wrapgen.dynamo.compile_aten_graph

    def spy(gm, name, target=None):
        calls[name] = lower(gm, name, target)
        return calls[name]

    monkeypatch.setattr(wrapgen.dynamo, "compile_aten_graph", spy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(44, 52), torch.nn.ReLU(), torch.nn.Linear(52, 12)).to(device)
    backend = functools.partial(wrapgen.dynamo.wrapgen_backend, options={"target": target})
    compiled = torch.compile(model, backend=backend, dynamic=True)
    served = {}
    for rows in (26, 9, 26, 40):
        x = torch.randn(rows, 44, device=device, requires_grad=True)
        out = compiled(x)
        out.square().sum().backward()
        grads = [x.grad] + [p.grad for p in model.parameters()]
        x_e = x.detach().clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        expected = model(x_e)
        expected.square().sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grads, [x_e.grad] + [p.grad for p in model.parameters()], rtol=1e-4, atol=1e-4)
        model.zero_grad(set_to_none=True)
        for name in ("forward", "backward"):
            if name not in served:  # count the calls the programs at the hints serve, from the first on
                at_hints = calls[name].at_hints
                static, served[name] = at_hints.function, []
                at_hints.function = functools.partial(lambda s, n, args: served[n].append(1) or s(args), static, name)
    assert set(calls) == {"forward", "backward"}
    for name in ("forward", "backward"):
        assert templates(calls[name].program_at_hints) and not templates(calls[name].program)
        assert any(isinstance(line, ExternKernel) and line.op in ("aten::mm.out", "aten::addmm.out")
                   for line in calls[name].program.lines)
    assert served == {"forward": [1], "backward": [1]}  # the third call (26 rows); the first ran before the spy


def test_a_graph_with_a_data_dependent_size_has_no_size_hints():
    """A size symbol without a hint (an unbacked one, from .item() or nonzero) leaves nothing to
    trace at: no static graph, the dynamic program serves every call; a backed one is traced at
    its hint."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from wrapgen.size_hints import aten_graph_at_hints

    def graph_with(size: object) -> torch.fx.GraphModule:
        gm = torch.fx.symbolic_trace(lambda x, n: x * 2)
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        with FakeTensorMode():
            placeholders[0].meta["val"] = torch.empty(3, 4)
        placeholders[1].meta["val"] = size
        return gm

    shape_env = ShapeEnv()
    assert aten_graph_at_hints(graph_with(shape_env.create_unbacked_symint())) is None
    backed = shape_env.create_symintnode(shape_env.create_symbol(7, torch._dynamo.source.ConstantSource("n")), hint=7)
    static, example = aten_graph_at_hints(graph_with(backed))
    assert example[1] == 7 and [tuple(example[0].shape)] == [(3, 4)]
    assert [node.meta["val"] for node in static.graph.nodes if node.op == "placeholder"][1] == 7


def test_dynamic_program_serves_every_call_when_the_example_sizes_fail_to_compile(monkeypatch):
    import wrapgen.api
    from wrapgen.errors import LoweringError

    traced = wrapgen.api.capture

    def capture(model, inputs, dynamic):
        if not dynamic:
            raise LoweringError("cannot trace at these sizes")
        return traced(model, inputs, dynamic)

    monkeypatch.setattr(wrapgen.api, "capture", capture)
    fn, args = (lambda a, b: (a @ b).relu()), (torch.randn(26, 44), torch.randn(44, 52))
    with pytest.warns(UserWarning, match="no program at the example's sizes .cannot trace at these sizes"):
        compiled = wrapgen.compile(fn, args, dynamic=True)
    assert compiled.at_hints is None
    torch.testing.assert_close(compiled(*args), fn(*args))


def test_misaligned_products_are_the_ones_with_an_unaligned_leading_dimension():
    def parts(a, b, out, dtype=torch.bfloat16):
        layouts = {"a": (*a, dtype), "b": (*b, dtype), "out": (*out, dtype)}
        return {"a": ("a",), "b": ("b",), "out": ("out",), "layouts": layouts}

    # GPT-2's LM head: x [32, 768] @ wte.t() [768, 50257] -> logits rows of 50257 elements
    assert misaligned(parts(((32, 768), (768, 1)), ((768, 50257), (1, 768)), ((32, 50257), (50257, 1))))
    assert not misaligned(parts(((32, 768), (768, 1)), ((768, 50264), (1, 768)), ((32, 50264), (50264, 1))))
    # float32 needs 4 elements, a row of one element has no leading dimension to align
    assert misaligned(parts(((8, 6), (6, 1)), ((6, 4), (4, 1)), ((8, 4), (4, 1)), torch.float32))
    assert not misaligned(parts(((8, 8), (8, 1)), ((8, 4), (4, 1)), ((8, 4), (4, 1)), torch.float32))
    assert not misaligned(parts(((1, 8), (5, 1)), ((8, 4), (4, 1)), ((1, 4), (4, 1)), torch.float32))


def test_unaligned_products_are_measured_where_a_template_dot_uses_the_tensor_cores():
    """Without max_autotune only half precision (or float32 with TF32 allowed) is worth compiling
    templates for: at IEEE float32 the library beat every template on GPT-2's LM head."""
    from wrapgen.lowering.gemm_templates import _worth_measuring_unaligned

    def parts(dtype, m=2048):
        layouts = {"a": ((m, 768), (768, 1), dtype), "b": ((768, 50257), (1, 768), dtype),
                   "out": ((m, 50257), (50257, 1), dtype)}
        return {"a": ("a", dtype), "b": ("b", dtype), "out": ("out", dtype), "layouts": layouts,
                "batch": 1, "m": m, "n": 50257, "k": 768}

    matmul, saved = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert _worth_measuring_unaligned(parts(torch.bfloat16)) and _worth_measuring_unaligned(parts(torch.float16))
        assert not _worth_measuring_unaligned(parts(torch.float32))
        assert not _worth_measuring_unaligned(parts(torch.bfloat16, m=1))  # too small to matter
        matmul.allow_tf32 = True
        assert _worth_measuring_unaligned(parts(torch.float32))
    finally:
        matmul.allow_tf32 = saved


def test_the_shortlist_is_a_few_of_the_full_set_of_configurations():
    """A misaligned product without max_autotune compiles three configurations, not eight: they
    compile in parallel, and the slowest of eight set a third of GPT-2's cold compile."""
    from wrapgen.kernels.templates.problem import GemmProblem, Operand

    def problem(m, n):
        op = lambda name: Operand(name, torch.bfloat16, (0, 1, 1))  # noqa: E731
        return GemmProblem("mm", 1, m, n, 768, op("a"), op("b"), op("out"), device="cuda")

    for m, n in ((2048, 50257), (32, 50257)):
        full, short = triton_gemm.triton_configs(problem(m, n)), triton_gemm.triton_configs(problem(m, n), True)
        assert 1 <= len(short) <= 3 < len(full) and set(short) <= set(full)


def test_misaligned_products_on_the_cpu_stay_library_calls_without_max_autotune():
    fn, args = (lambda a, b: a @ b), (torch.randn(256, 250), torch.randn(250, 257))
    with wrapgen.config.patch(max_autotune=False):
        program = wrapgen.lower(fn, args)
    assert not templates(program) and "autotune" not in str(program)


def test_the_tuner_reads_the_programs_weights_in_place(monkeypatch, tmp_path):
    """A weight operand is measured as the real tensor (a view of it), not a stand-in copy: an
    LM head's weight would otherwise be allocated a second time while compiling."""
    seen = []
    stand_ins = autotune._stand_ins
    monkeypatch.setattr(autotune, "_stand_ins", lambda problem: seen.append(problem) or stand_ins(problem))
    model = torch.nn.Linear(48, 40)
    x = torch.randn(37, 48)
    with wrapgen.config.patch(max_autotune_gemm_backends="aten,template", cache_dir=str(tmp_path)):
        check(model, (x,), targets=["python"])  # measured once (a fresh cache), then a cache hit
    (problem,) = seen
    weights = {t.data_ptr() for t in problem.weights.values()}
    assert weights == {model.weight.data_ptr(), model.bias.data_ptr()}
    assert all(t.data_ptr() in weights or name not in problem.weights
               for name, t in autotune._stand_ins(problem).items())


def test_epilogue_with_two_results():
    def fn(a, b):
        p = a @ b
        return p.relu(), p * 2

    program = check(fn, (torch.randn(20, 30), torch.randn(30, 40)), targets=["python", "fx"])
    (kernel,) = templates(program)
    assert dict(kernel.metadata)["ops"] == "aten::mm,aten::relu.default,aten::mul.Tensor"
    call = next(line for line in program.lines if getattr(line, "kernel", None) == kernel.name)
    assert len(call.writes) == 2


def test_product_read_by_a_reduction_gets_no_epilogue():
    program = check(lambda a, b: (a @ b).sum(0), (torch.randn(20, 30), torch.randn(30, 40)),
                    targets=["python", "fx"], atol=1e-4, rtol=1e-4)
    (kernel,) = templates(program)
    assert dict(kernel.metadata)["ops"] == "aten::mm"


def test_epilogue_reading_an_element_of_a_library_calls_tuple(two_tilings, tmp_path):
    """An epilogue reading one result of a library call that returns several (the attention
    backward's gradients in a training step): the line leaves its strides to the library, the
    program fixes them from torch's meta function, and the candidates are measured and run
    with it read at those (stand-ins made of that layout)."""

    def fn(a, b, c):
        values, _ = torch.sort(c, dim=-1)
        return (a @ b) + values

    with wrapgen.config.patch(cache_dir=str(tmp_path)):  # measured, not a cached choice
        program = check(fn, (torch.randn(20, 30), torch.randn(30, 40), torch.randn(20, 40)), targets=["python", "fx"])
    (kernel,) = templates(program)
    meta = dict(kernel.metadata)
    assert meta["ops"] == "aten::mm,aten::add.Tensor" and "ms" in meta["autotune"], str(program)


def test_epilogue_the_template_cannot_render_leaves_the_product_alone(monkeypatch):
    """A template that refuses an epilogue (NotImplementedError while rendering) still serves the
    product, and the pointwise work stays a kernel of its own."""
    render = cpp_gemm.cpp_gemm_source

    def refuse_epilogues(problem, config, name):
        if problem.epilogue is not None:
            raise NotImplementedError("an epilogue this test refuses")
        return render(problem, config, name)

    monkeypatch.setattr(cpp_gemm, "cpp_gemm_source", refuse_epilogues)
    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    program = check(lambda x, w, b: F.gelu(_linear(x, w, b)), (x, w, b), targets=["python"])
    (template,) = templates(program)
    assert "gelu" not in template.source.lower(), template.source
    kernels = [line for line in program.lines if isinstance(line, KernelDefinition) and line not in (template,)]
    assert any("gelu" in dict(k.metadata).get("ops", "") for k in kernels), str(program)


def test_torch_compile_options():
    fn, args = (lambda a, b: F.silu(a @ b)), (torch.randn(20, 30), torch.randn(30, 40))
    compiled = torch.compile(fn, backend="wrapgen", options={"max_autotune": True, "target": "python"})
    torch.testing.assert_close(compiled(*args), fn(*args))


# -- Triton: the interpreter on CPU (tiny sizes), the GPU when there is one ------------------------
interpreter = pytest.mark.skipif(not (compat.available() and compat.interpreting()),
                                 reason="needs triton in interpreter mode (CPU machines)")


@interpreter
@pytest.mark.parametrize("case", ["addmm_gelu_residual", "bmm_cast_bf16", "swiglu_3d"])
def test_triton_template_in_interpreter(case, monkeypatch):
    monkeypatch.setattr(triton_gemm, "triton_configs", lambda problem, shortlist=False: [triton_gemm.TritonGemmConfig(16, 16, 16, 1, 1, 2)])
    if case == "addmm_gelu_residual":
        fn = lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r  # noqa: E731
        args = (torch.randn(20, 24), torch.randn(36, 24), torch.randn(36), torch.randn(20, 36))
        tol = {}
    elif case == "bmm_cast_bf16":
        fn = lambda a, b: (torch.bmm(a, b) * 0.5).to(torch.bfloat16)  # noqa: E731
        args, tol = (torch.randn(2, 18, 20), torch.randn(2, 20, 17)), {"atol": 1e-2, "rtol": 1e-2}
    else:
        fn, args, tol = SwiGLU(), (torch.randn(2, 9, 32),), {"atol": 1e-5, "rtol": 1e-4}
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = check(fn, args, targets=["python", "fx"], **tol)
    kernels = templates(program)
    assert kernels and all(k.language == "triton" and dict(k.metadata)["template"].startswith("triton_gemm_")
                           for k in kernels)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("epilogue", ["bias", "gelu", "residual", "cast_bf16"])
@pytest.mark.parametrize("target", TARGETS)
def test_triton_template_on_gpu(epilogue, target):
    fn = EPILOGUES[epilogue]
    dt = torch.bfloat16
    args = tuple(t.cuda() for t in (torch.randn(300, 256, dtype=dt), torch.randn(384, 256, dtype=dt),
                                    torch.randn(384, dtype=dt), torch.randn(300, 384, dtype=dt)))
    with wrapgen.config.patch(max_autotune_gemm_backends="aten,template"):
        program = check(fn, args, targets=[target], atol=3e-2, rtol=3e-2)
    assert "autotune addmm" in str(program) or "autotune mm" in str(program)
    with wrapgen.config.patch(max_autotune_gemm_backends="template"):
        program = check(fn, args, targets=[target], atol=3e-2, rtol=3e-2)
    assert templates(program)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_bmm_on_gpu():
    a, b = torch.randn(4, 130, 96, device="cuda", dtype=torch.bfloat16), torch.randn(4, 96, 200, device="cuda",
                                                                                    dtype=torch.bfloat16)
    program = check(lambda a, b: torch.bmm(a, b).relu(), (a, b), atol=3e-2, rtol=3e-2)
    assert templates(program)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", TARGETS)
def test_misaligned_lm_head_is_measured_against_templates_by_default(target):
    """A vocabulary of 4099 leaves the logits' rows unaligned: without max_autotune the product
    is still measured against templates; an aligned one (4096) keeps the library call unmeasured."""
    fn = lambda x, w: x @ w.t()  # noqa: E731
    dt = torch.bfloat16
    with wrapgen.config.patch(max_autotune=False):
        args = (torch.randn(64, 256, device="cuda", dtype=dt), torch.randn(4099, 256, device="cuda", dtype=dt))
        program = check(fn, args, targets=[target], atol=3e-2, rtol=3e-2)
        assert "autotune mm 64x256 @ 256x4099" in str(program)
        aligned = (args[0], torch.randn(4096, 256, device="cuda", dtype=dt))
        assert "autotune" not in str(check(fn, aligned, targets=[target], atol=3e-2, rtol=3e-2))


# -- skinny products: a few rows times a weight (batch-1 decoding) ----------------------------------
SKINNY_CASES = {
    "one_row_k_tail": (lambda x, w: x @ w.t(), (torch.randn(1, 40), torch.randn(36, 40)), {}),
    "column_tail": (lambda x, w: x @ w.t(), (torch.randn(1, 32), torch.randn(37, 32)), {}),
    "three_rows_gelu_residual": (lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r,
                                 (torch.randn(3, 24), torch.randn(36, 24), torch.randn(36), torch.randn(3, 36)), {}),
    "linear_3d_silu": (lambda x, w: F.silu(F.linear(x, w)), (torch.randn(1, 1, 33), torch.randn(20, 33)), {}),
    "bf16": (lambda x, w: (x @ w.t()) * 2, (torch.randn(2, 32, dtype=torch.bfloat16),
                                            torch.randn(24, 32, dtype=torch.bfloat16)), {"atol": 2e-2, "rtol": 2e-2}),
}


@interpreter
@pytest.mark.parametrize("case", list(SKINNY_CASES))
def test_skinny_template_in_interpreter(case, monkeypatch):
    monkeypatch.setattr(triton_gemm, "triton_configs", lambda problem, shortlist=False: [])  # the skinny one alone
    fn, args, tol = SKINNY_CASES[case]
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = check(fn, args, targets=["python", "fx"], **tol)
    kernels = templates(program)
    assert len(kernels) == 1 and dict(kernels[0].metadata)["template"].startswith("triton_skinny_"), str(program)


def test_skinny_configs_fit_the_problem_and_the_registers():
    from wrapgen.kernels.templates.problem import GemmProblem, Operand

    def problem(m: int, n: int, k: int, op: str = "mm") -> GemmProblem:
        a, b = Operand("a", torch.bfloat16, (0, k, 1)), Operand("b", torch.bfloat16, (0, 1, k))
        return GemmProblem(op, 1, m, n, k, a, b, Operand("out", torch.bfloat16, (0, n, 1)), device="cuda")

    for m, n, k in ((1, 256, 1024), (1, 2816, 1024), (1, 1024, 2816), (5, 32000, 1024), (16, 64, 64)):
        configs = triton_skinny.skinny_configs(problem(m, n, k))
        assert configs and len(set(configs)) == len(configs)
        for c in configs:
            assert c.block_m >= m and c.block_n <= max(n, 1) * 2 and c.block_k <= max(16, 2 * k)
            assert c.block_m * c.block_n * c.block_k <= triton_skinny.ACCUMULATOR_LIMIT, c
            assert c.tag.startswith("triton_skinny_")
    assert not triton_skinny.skinny_configs(problem(17, 256, 256))  # tensor-core tiles' ground
    assert not triton_skinny.skinny(GemmProblem("bmm", 2, 1, 8, 8, Operand("a", torch.float32, (8, 8, 1)),
                                                Operand("b", torch.float32, (64, 8, 1)),
                                                Operand("out", torch.float32, (8, 8, 1))))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", TARGETS)
def test_decode_products_are_measured_against_the_skinny_template_by_default(target):
    """One token's projections (1 row over a 1024x2816 weight) are measured against the skinny
    template without max_autotune; 64 rows are not skinny and stay library calls, unmeasured."""
    fn = lambda x, w, r: F.silu(x @ w.t()) + r  # noqa: E731
    dt = torch.bfloat16
    w = torch.randn(2816, 1024, device="cuda", dtype=dt)
    with wrapgen.config.patch(max_autotune=False, max_autotune_gemm_backends="aten,template"):
        one = (torch.randn(1, 1024, device="cuda", dtype=dt), w, torch.randn(1, 2816, device="cuda", dtype=dt))
        program = check(fn, one, targets=[target], atol=3e-2, rtol=3e-2)
        assert "autotune mm 1x1024 @ 1024x2816" in str(program) and "triton_skinny_" in str(program)
        many = (torch.randn(64, 1024, device="cuda", dtype=dt), w, torch.randn(64, 2816, device="cuda", dtype=dt))
        assert "autotune" not in str(check(fn, many, targets=[target], atol=3e-2, rtol=3e-2))


# -- sibling skinny products: one launch for the products of one A (q, k and v of a decode step) ----
def _qkv(x, wq, wk, wv):
    return x @ wq.t(), x @ wk.t(), x @ wv.t()


def _q_read_before_k(x, wq, wk):
    q = x @ wq.t()
    return x @ (wk.t() + q.exp().sum()), q


def _grouping_always_wins(monkeypatch):
    """Each product's selection reports a time, and the grouped launch always beats their sum."""
    import dataclasses

    from wrapgen.kernels import templates as package
    from wrapgen.kernels.templates import triton_skinny_group

    select = package.select_gemm
    monkeypatch.setattr(package, "select_gemm", lambda *a, **k: dataclasses.replace(select(*a, **k), milliseconds=1e9))
    measure = triton_skinny_group.select_group
    monkeypatch.setattr(triton_skinny_group, "select_group", lambda problems, name, ms: measure(problems, name, 1e12))
    monkeypatch.setattr(triton_gemm, "triton_configs", lambda problem, shortlist=False: [])  # the skinny one alone


@interpreter
def test_sibling_skinny_products_run_as_one_launch_in_interpreter(monkeypatch):
    _grouping_always_wins(monkeypatch)
    args = (torch.randn(1, 40), torch.randn(37, 40), torch.randn(12, 40), torch.randn(9, 40))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = check(_qkv, args, targets=["python", "fx"])
    kernels = templates(program)
    assert len(kernels) == 1 and dict(kernels[0].metadata)["template"] == "triton_skinny_group", str(program)
    assert "grouped mm 1x40 @ 40x37 float32 + mm 1x40 @ 40x12 float32 + mm 1x40 @ 40x9 float32" in str(program)


@interpreter
def test_a_product_read_before_its_sibling_runs_keeps_its_own_launch(monkeypatch):
    _grouping_always_wins(monkeypatch)
    args = (torch.randn(2, 16), torch.randn(24, 16), torch.randn(8, 16))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = check(_q_read_before_k, args, targets=["python"], atol=1e-4, rtol=1e-4)
    assert "triton_skinny_group" not in str(program), str(program)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_decode_projections_are_measured_as_one_launch(target):
    """q, k and v of one token (1 row over 1024x1024, 256x1024 and 256x1024 bf16 weights): the
    grouped launch is measured against the separate winners, and the program says which won."""
    dt = torch.bfloat16
    args = (torch.randn(1, 1024, device="cuda", dtype=dt), torch.randn(1024, 1024, device="cuda", dtype=dt),
            torch.randn(256, 1024, device="cuda", dtype=dt), torch.randn(256, 1024, device="cuda", dtype=dt))
    with wrapgen.config.patch(max_autotune=False, max_autotune_gemm_backends="aten,template"):
        program = check(_qkv, args, targets=[target], atol=3e-2, rtol=3e-2)
    assert "grouped mm 1x1024 @ 1024x1024 bfloat16 + mm 1x1024 @ 1024x256 bfloat16 + mm 1x1024 @ 1024x256 bfloat16" in str(program), str(program)
