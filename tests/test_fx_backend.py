"""The "fx" target: Wrapper IR programs as runnable torch.fx GraphModules.

Every end-to-end model of test_end_to_end.py runs through `wrapgen.compile(..., target="fx")`
(static, and dynamic at several sizes), with generated C++ kernels on and off, and is
compared with eager on fresh inputs. Further tests pin down what an FX consumer relies on:
size expressions computed once, the memory plan visible and honoured, the compile_graph hook,
refusals that name the line, and a graph made only of operators and named functions.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import pytest
import sympy
import torch
import torch.fx
from test_end_to_end import (
    CASES_7,
    DYNAMIC,
    DYNAMIC_SIZES,
    INPLACE,
    MLP,
    NONCONTIGUOUS,
    ConvNet,
    CountingModule,
    MHABlock,
    SDPABlock,
    TwoInputs,
    assert_same_aliasing,
    assert_same_result,
    cat_with_doubled,
    log_of,
    matmul_two_inputs,
    pointwise_reduce_reshape,
    sort_descending,
    split_of_intermediate,
    topk_largest,
    topk_sort_variants,
    views_of_input,
    views_of_intermediate,
)
from torch.utils import _pytree as pytree
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, ModularIndexing, PythonMod

import wrapgen
from wrapgen.backends import FxEmitter, register_backend
from wrapgen.backends.fx import runtime as fx_runtime
from wrapgen.backends.fx.exprs import ExpressionNodes
from wrapgen.errors import InputMismatchError, UnsupportedLineError
from wrapgen.kernels.cpp.custom_op import cpp_kernel
from wrapgen.wrapper_ir import (
    OBSERVED,
    AllocateFromPool,
    AssertInput,
    BindSymbol,
    Comment,
    KernelCall,
    KernelDefinition,
    Output,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program, SymbolInfo, TensorInput
from wrapgen.wrapper_ir.values import TensorRef, TensorType
from wrapgen.wrapper_ir.verify import verify

KERNELS = pytest.mark.parametrize("kernels", [True, False], ids=["cpp_kernels", "library_calls"])
TOL = {"rtol": 1e-5, "atol": 1e-5}


def compile_fx(model, inputs: tuple, dynamic: bool = False, kernels: bool = True):
    with wrapgen.config.patch(kernels=kernels):
        compiled = wrapgen.compile(model, inputs, target="fx", dynamic=dynamic)
    assert compiled.target == "fx"
    return compiled


def graph_of(compiled) -> torch.fx.GraphModule:
    """The GraphModule the fx target builds for a compiled function's (optimized) program."""
    return FxEmitter().emit(compiled.program)


def kernel_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is cpp_kernel]


# -- every end-to-end model -------------------------------------------------------------------

STATIC = {
    # name: (model, input maker, tolerances)
    "mlp": (lambda: MLP().eval(), lambda: (torch.randn(4, 8),), {}),
    "conv_bn_pool": (lambda: ConvNet().eval(), lambda: (torch.randn(2, 3, 8, 8),), {}),
    "multihead_attention": (lambda: MHABlock().eval(), lambda: (torch.randn(2, 5, 16),), TOL),
    "sdpa": (lambda: SDPABlock().eval(), lambda: (torch.randn(2, 5, 16),), TOL),
    "topk": (lambda: topk_largest, lambda: (torch.randn(6, 7),), {}),
    "sort": (lambda: sort_descending, lambda: (torch.randn(6, 7),), {}),
    "topk_sort_variants": (lambda: topk_sort_variants, lambda: (torch.randn(6, 7),), {}),
    "noncontiguous_matmul": (lambda: matmul_two_inputs, lambda: (torch.randn(6, 4).t(), torch.randn(12, 5)[::2]), {}),
    **{f"int_bool_{k}": (lambda fn=fn: fn, make, {}) for k, (fn, make) in CASES_7.items()},
}


@KERNELS
@pytest.mark.parametrize("case", list(STATIC))
def test_static_models(case, kernels):
    build, make, tolerances = STATIC[case]
    model = build()
    compiled = compile_fx(model, make(), kernels=kernels)
    for _ in range(2):
        inputs = make()
        with torch.no_grad():
            expected = model(*inputs)
        assert_same_result(compiled(*inputs), expected, **tolerances)
    if kernels and case in ("mlp", "sdpa"):
        assert kernel_nodes(graph_of(compiled)), "C++ kernels appear as wrapgen::cpp_kernel nodes"


@KERNELS
@pytest.mark.parametrize("fn", [views_of_input, views_of_intermediate, split_of_intermediate])
def test_view_outputs(fn, kernels):
    compiled = compile_fx(fn, (torch.randn(6, 8),), kernels=kernels)
    for _ in range(2):
        x = torch.randn(6, 8)
        expected, actual = fn(x), compiled(x)
        assert_same_result(actual, expected)
        assert_same_aliasing(actual, expected, [x], [x])


@KERNELS
@pytest.mark.parametrize("layout", list(NONCONTIGUOUS))
def test_noncontiguous_input(layout, kernels):
    make = NONCONTIGUOUS[layout]
    compiled = compile_fx(pointwise_reduce_reshape, (make(),), kernels=kernels)
    for _ in range(2):
        x = make()
        expected, actual = pointwise_reduce_reshape(x), compiled(x)
        assert_same_result(actual, expected)
        assert_same_aliasing(actual, expected, [x], [x])


@KERNELS
@pytest.mark.parametrize("case", list(INPLACE))
def test_inplace(case, kernels):
    fn, make = INPLACE[case]
    compiled = compile_fx(fn, tuple(t.clone() for t in make()), kernels=kernels)
    for _ in range(2):
        inputs = make()
        eager_inputs, compiled_inputs = [t.clone() for t in inputs], [t.clone() for t in inputs]
        expected, actual = fn(*eager_inputs), compiled(*compiled_inputs)
        assert_same_result(actual, expected)
        torch.testing.assert_close(compiled_inputs, eager_inputs)
        assert_same_aliasing(actual, expected, compiled_inputs, eager_inputs)


@KERNELS
def test_inplace_buffer_update(kernels):
    eager, model = CountingModule(), CountingModule()
    compiled = compile_fx(model, (torch.randn(2, 3),), kernels=kernels)
    model.load_state_dict(eager.state_dict())
    for _ in range(3):
        x = torch.randn(2, 3)
        with torch.no_grad():
            assert_same_result(compiled(x), eager(x))
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()))


@KERNELS
@pytest.mark.parametrize("case", list(DYNAMIC))
def test_dynamic_models(case, kernels):
    build, make = DYNAMIC[case]
    model = build()
    compiled = compile_fx(model, make(DYNAMIC_SIZES[0]), dynamic=True, kernels=kernels)
    assert compiled.program.symbols
    for n in DYNAMIC_SIZES:
        for _ in range(2):
            inputs = make(n)
            with torch.no_grad():
                expected = model(*inputs)
            assert_same_result(compiled(*inputs), expected, **TOL)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_option_target_fx(dynamic):
    """torch.compile(backend="wrapgen", options={"target": "fx"}): dynamo's boxed calling path."""
    model = MLP().eval()
    compiled = torch.compile(model, backend="wrapgen", dynamic=dynamic, fullgraph=True, options={"target": "fx"})
    for n in (5, 6, 7) if dynamic else (5, 5):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))


def test_training_step_through_torch_compile():
    eager = MLP().train()
    model = MLP().train()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="wrapgen", fullgraph=True, options={"target": "fx"})
    x, target = torch.randn(5, 8), torch.randn(5, 4)
    torch.nn.functional.mse_loss(eager(x), target).backward()
    torch.nn.functional.mse_loss(compiled(x), target).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(grads, {n: p.grad for n, p in eager.named_parameters()}, rtol=1e-4, atol=1e-5)


# -- checks: the same errors as the Python target ----------------------------------------------


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (lambda: torch.randn(5, 3), r"input weight: expected shape \(6, 3\), got \(5, 3\)"),
        (lambda: torch.randn(3, 6).t(), r"input weight: expected strides \(3, 1\), got \(1, 6\)"),
        (
            lambda: torch.randn(6, 3, dtype=torch.float64),
            r"input weight: expected dtype torch.float32, got torch.float64",
        ),
        (lambda: [1.0], r"input weight: expected a tensor, got list"),
    ],
    ids=["shape", "stride", "dtype", "not_a_tensor"],
)
def test_bad_input_raises_input_mismatch(bad, pattern):
    compiled = compile_fx(TwoInputs(), (torch.randn(4, 6), torch.randn(6, 3)))
    with pytest.raises(InputMismatchError, match=pattern):
        compiled(torch.randn(4, 6), bad())
    with pytest.raises(InputMismatchError, match="expected 2 inputs, got 1"):
        compiled.artifact.call([torch.randn(4, 6)])
    torch.testing.assert_close(compiled(torch.randn(4, 6), torch.ones(6, 3)).shape, torch.Size([4, 3]))


def test_dynamic_size_expression_is_checked():
    make = DYNAMIC["cat_with_doubled"][1]
    compiled = compile_fx(cat_with_doubled, make(5), dynamic=True)
    with pytest.raises(InputMismatchError, match=r"input args_1: expected shape \(6, 4\), got \(7, 4\)"):
        compiled(torch.randn(3, 4), torch.randn(7, 4))
    x, y = torch.randn(1, 4), torch.randn(2, 4)
    with pytest.raises(InputMismatchError, match=r"size symbol s0 = 1 is outside \[2, inf\]"):
        compiled.artifact.call([x, y])  # the dynamic program itself
    torch.testing.assert_close(compiled(x, y), cat_with_doubled(x, y))  # served by a program for s0 = 1


@pytest.mark.parametrize("kernels", [True, False], ids=["cpp_kernels", "library_calls"])
def test_check_finite(kernels):
    with wrapgen.config.patch(check_finite=True):
        compiled = compile_fx(log_of, (torch.rand(5) + 0.5,), kernels=kernels)
    x = torch.rand(5) + 0.5
    torch.testing.assert_close(compiled(x), log_of(x))
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        compiled(torch.tensor([1.0, -1.0, 2.0, 3.0, 4.0]))
    assert any(n.target is fx_runtime.assert_finite for n in graph_of(compiled).graph.nodes)


# -- size expressions --------------------------------------------------------------------------


def test_size_expression_computed_once_and_shared_by_kernel_calls():
    """softmax(x) * x.shape[0] and x.sum(0): two C++ kernels both take s0*s1; the graph computes
    it in one node that both kernel calls use."""

    def two_kernels(x):
        return torch.softmax(x, -1) * x.shape[0], x.sum(0), (x * 2).exp()

    compiled = compile_fx(two_kernels, (torch.randn(5, 7),), dynamic=True)
    program = compiled.program
    s0, s1 = (s.symbol for s in program.symbols)
    shared = [line for line in program.lines if isinstance(line, SymbolicCallArg) and line.expr == s0 * s1]
    assert len(shared) == 1, str(program)
    users = [line for line in program.lines if isinstance(line, KernelCall) and shared[0].symbol in line.args]
    assert len(users) >= 2, str(program)

    gm = graph_of(compiled)
    products = [n for n in gm.graph.nodes if n.meta.get("wrapgen_expr") == str(s0 * s1)]
    assert len(products) == 1, gm.graph
    (product,) = products
    assert product.target is operator.mul and product.meta["val"] == 35
    calls = [n for n in kernel_nodes(gm) if product in n.args[5]]
    assert len(calls) == len(users) >= 2
    # No other node computes a product of the two sizes.
    assert (
        sum(1 for n in gm.graph.nodes if n.target is operator.mul and set(n.args) == {product.args[0], product.args[1]})
        == 1
    )
    for n in (4, 9):
        x = torch.randn(n, n + 3)
        assert_same_result(compiled(x), two_kernels(x), **TOL)


s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
EXPRESSIONS = [
    s0 * s1 + 3,
    2 * s0 - s1,
    FloorDiv(s0 * s1, 4),
    CeilDiv(s0 * s1, 4),
    CeilDiv(s0, s1),
    Min(s0, 1024),
    Max(s0, s1, 3),
    PythonMod(s0 + 5, s1),
    ModularIndexing(s0 * 7, 2, 5),
    s0**2 + FloorDiv(s1, 3),
    s0 * (s0 + 1) / 2,
    -s0,
]
CONDITIONS = [s0 <= 7, sympy.And(s0 > 2, sympy.Ne(s1, 3)), sympy.Or(sympy.Eq(s0, s1), s1 >= 64)]


def test_expressions_evaluate_like_sympy():
    graph = torch.fx.Graph()
    exprs = ExpressionNodes(lambda target, args, expr: graph.call_function(target, args))
    exprs.bind(s0, graph.placeholder("s0"))
    exprs.bind(s1, graph.placeholder("s1"))
    nodes = [exprs.value(e) for e in EXPRESSIONS + CONDITIONS]
    before = len(graph.nodes)
    assert [exprs.value(e) for e in EXPRESSIONS + CONDITIONS] == nodes and len(graph.nodes) == before  # hash-consed
    graph.output(tuple(nodes))
    gm = torch.fx.GraphModule({}, graph)
    for a, b in [(5, 7), (13, 4), (1, 1), (64, 3)]:
        got = gm(a, b)
        want = [e.subs({s0: a, s1: b}) for e in EXPRESSIONS + CONDITIONS]
        assert [type(g) for g in got] == [int] * len(EXPRESSIONS) + [bool] * len(CONDITIONS), got
        assert list(got) == [int(w) for w in want[: len(EXPRESSIONS)]] + [bool(w) for w in want[len(EXPRESSIONS) :]], (
            a,
            b,
        )


def test_unknown_function_in_an_expression_names_the_line():
    program = wrapgen.lower(lambda x: x + 1, (torch.randn(5, 3),), dynamic=True)
    s = program.symbols[0].symbol
    odd = SymbolicCallArg(sympy.Symbol("ks99", integer=True), sympy.gamma(s))
    lines = (*program.lines[:-1], odd, program.lines[-1])
    with pytest.raises(
        UnsupportedLineError, match=r"cannot emit line \d+ \(ks99 = gamma\(s0\)\): no FX form for gamma"
    ):
        FxEmitter().emit(program.with_lines(lines))


def test_symbol_solved_from_an_input_size_and_comments_kept_in_meta():
    """bind s0 = x.size(0) // 2 (x is f32[2*s0]); the symbol is returned as an int output."""
    s = sympy.Symbol("s0", integer=True, positive=True)
    cpu = torch.device("cpu")
    x_type = TensorType(torch.float32, cpu, (2 * s,), (sympy.Integer(1),))
    lines = (
        BindSymbol(s, "x", "size", 0, OBSERVED / 2, 2, None),
        AssertInput("x", torch.float32, cpu, (2 * s,), (sympy.Integer(1),)),
        Comment("half of x's length"),
        Output((TensorRef("x"), s, s * s + 1)),
    )
    program = verify(Program("halves", (TensorInput("x", x_type),), (SymbolInfo(s, 5, 2, None),), (), lines))
    gm = FxEmitter().emit(program)
    x = torch.randn(14)
    out = gm(x)
    assert out[0] is x and out[1:] == (7, 50) and type(out[1]) is int
    with pytest.raises(InputMismatchError, match=r"input x: expected shape \(6,\), got \(7,\)"):
        gm(torch.randn(7))
    with pytest.raises(InputMismatchError, match=r"size symbol s0 = 1 is outside \[2, inf\]"):
        gm(torch.randn(2))
    (commented,) = [n for n in gm.graph.nodes if "wrapgen_comments" in n.meta]  # the next line's first node
    assert commented.meta["wrapgen_comments"] == ("half of x's length",)
    assert commented.meta["wrapgen_line"].startswith("4: return")
    (solved,) = [n for n in gm.graph.nodes if n.meta.get("wrapgen_symbol") == "s0"]
    assert solved.target is operator.floordiv and solved.meta["val"] == 5


# -- memory planning ---------------------------------------------------------------------------


class StorageRecorder(torch.fx.Interpreter):
    """Runs the graph and remembers each named node's untyped storage pointer."""

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.storages[n.name] = result.untyped_storage().data_ptr()
        return result


def chain(x):
    """Enough intermediates for reuse and pooling to have something to do."""
    y = torch.relu(x @ x.t())
    z = torch.tanh(y @ y) + y
    w = torch.sigmoid(z @ z)
    return (w @ w).sum(0), torch.sort(w, dim=0).values


@pytest.mark.parametrize("mode", ["none", "reuse", "pooled"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_memory_planning_modes(mode, dynamic):
    with wrapgen.config.patch(memory_planning=mode):
        compiled = compile_fx(chain, (torch.randn(6, 6),), dynamic=dynamic)
    program = compiled.program
    assert dict(program.metadata)["memory planning"] == mode
    reused = [line for line in program.lines if isinstance(line, ReuseBuffer)]
    pooled = [line for line in program.lines if isinstance(line, AllocateFromPool)]
    assert bool(reused) == (mode == "reuse") and bool(pooled) == (mode == "pooled"), str(program)

    gm = graph_of(compiled)
    allocations = [n for n in gm.graph.nodes if n.target is torch.empty_strided]
    assert len(allocations) == sum(1 for line in program.lines if type(line).__name__ == "Allocate")
    x = torch.randn(7, 6) if dynamic else torch.randn(6, 6)
    recorder = StorageRecorder(gm)
    recorder.storages = {}
    result = recorder.run(x)
    for line in reused:  # the reused name lives in its source's storage
        assert recorder.storages[line.name] == recorder.storages[line.source], line
    for line in pooled:  # and a pooled buffer in its pool's
        assert recorder.storages[line.name] == recorder.storages[line.pool], line
    assert_same_result(tuple(result), chain(x))
    assert_same_result(compiled(x), chain(x))


def test_free_is_an_explicit_node_that_survives_dead_code_elimination():
    compiled = compile_fx(chain, (torch.randn(6, 6),))
    gm = graph_of(compiled)
    frees = [n for n in gm.graph.nodes if n.target is fx_runtime.free]
    assert len(frees) == sum(1 for line in compiled.program.lines if type(line).__name__ == "Free")
    gm.graph.eliminate_dead_code()
    assert len([n for n in gm.graph.nodes if n.target is fx_runtime.free]) == len(frees)
    assert any(n.target is fx_runtime.check_input for n in gm.graph.nodes)
    for free in frees:  # a free is the last use of what it frees
        (value,) = free.args[:1]
        assert max(value.users, key=lambda u: list(gm.graph.nodes).index(u)) is free


# -- the compile_graph hook ---------------------------------------------------------------------


class PlusOneEmitter(FxEmitter):
    """An out-of-tree 'compiler' that adds 1 to every output of the graph it is handed."""

    graphs: list[torch.fx.GraphModule] = []

    def compile_graph(self, gm):
        PlusOneEmitter.graphs.append(gm)

        def run(*args):
            return tuple(out + 1 for out in gm(*args))

        return run


def test_compile_graph_override_is_what_runs():
    register_backend("fx_plus_one", PlusOneEmitter)
    model = MLP().eval()
    compiled = wrapgen.compile(model, (torch.randn(3, 8),), target="fx_plus_one")
    assert isinstance(PlusOneEmitter.graphs[-1], torch.fx.GraphModule)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x) + 1)
    through_dynamo = torch.compile(model, backend="wrapgen", options={"target": "fx_plus_one"})
    with torch.no_grad():
        torch.testing.assert_close(through_dynamo(x), model(x) + 1)


def test_default_compile_graph_returns_the_graph_module():
    program = wrapgen.compile(MLP().eval(), (torch.randn(3, 8),), target="fx").program
    gm = FxEmitter().emit(program)
    assert FxEmitter().compile_graph(gm) is gm
    x = torch.randn(3, 8)
    assert isinstance(gm(x), tuple)


# -- refusals and what the graph is made of -----------------------------------------------------


@dataclass(frozen=True)
class Mystery(WrapperLine):
    def format(self) -> str:
        return "mystery line"


def test_unknown_line_is_refused_naming_it():
    program = wrapgen.lower(MLP().eval(), (torch.randn(2, 8),))
    lines = (*program.lines[:-1], Mystery(), program.lines[-1])
    number = len(lines) - 1
    with pytest.raises(UnsupportedLineError, match=rf"FxEmitter cannot emit line {number} \(mystery line\)"):
        FxEmitter().emit(program.with_lines(lines))


def test_kernel_language_without_launch_is_refused():
    program = wrapgen.lower(MLP().eval(), (torch.randn(2, 8),))
    definition = KernelDefinition("k0", "metal", "kernel void k0() {}", (("device", "cpu"),))
    lines = (*program.lines[:-1], definition, KernelCall("k0", ()), program.lines[-1])
    assert isinstance(lines[-1], Output)
    with pytest.raises(
        UnsupportedLineError, match=r"cannot emit line \d+ \(kernel k0 \[metal\].*no FX launch for metal"
    ):
        FxEmitter().emit(program.with_lines(lines))


ALLOWED_MODULES = ("operator", "math", "torch", "builtins", "torch._ops", "wrapgen.backends.fx.runtime")


def _target_kind(target) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return "operator"
    return getattr(target, "__module__", None) or "builtins"


@pytest.mark.parametrize("case", ["mlp", "sdpa", "topk_sort_variants", "int_bool_zero_dim_input"])
def test_graph_holds_only_operators_and_named_functions(case):
    build, make, _ = STATIC[case]
    gm = graph_of(compile_fx(build(), make()))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            kind = _target_kind(node.target)
            assert kind == "operator" or kind in ALLOWED_MODULES, (node.format_node(), kind)
            assert "wrapgen_line" in node.meta, node.format_node()
        assert node.op in ("placeholder", "get_attr", "call_function", "output"), node.format_node()
    assert "wrapgen_generated" not in gm.code and "def call(" not in gm.code


def test_graph_runs_after_a_round_trip_through_its_code():
    """The graph's own code (what a consumer would save) runs without the emitter."""
    compiled = compile_fx(SDPABlock().eval(), (torch.randn(2, 5, 16),))
    gm = graph_of(compiled)
    copy = torch.fx.GraphModule(gm, gm.graph)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(copy(x), gm(x))
    assert re.search(r"torch\.ops\.wrapgen\.cpp_kernel\.default\('[^']+\.so', 'cpp_fused", copy.code)


def test_outputs_flatten_like_eager():
    compiled = compile_fx(topk_largest, (torch.randn(6, 7),))
    x = torch.randn(6, 7)
    out = compiled(x)
    assert type(out) is type(topk_largest(x))
    assert pytree.tree_structure(out) == pytree.tree_structure(topk_largest(x))


# -- Triton kernels: in Triton's CPU interpreter here (conftest sets TRITON_INTERPRET=1 without CUDA) ---


def _triton_ready() -> bool:
    from wrapgen.kernels.triton import compat

    return compat.available() and (torch.cuda.is_available() or compat.interpreting())


needs_triton = pytest.mark.skipif(not _triton_ready(), reason="needs triton (GPU, or TRITON_INTERPRET=1 on CPU)")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def triton_launches(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    return [n for n in gm.graph.nodes if n.target is triton_kernel_wrapper_mutation]


@needs_triton
@pytest.mark.parametrize("case", ["mlp", "softmax", "cat_with_doubled", "views"])
def test_triton_kernels_dynamic(case):
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    build, make = DYNAMIC[case]
    model = build()
    if isinstance(model, torch.nn.Module):
        model = model.to(TRITON_DEVICE)

    def on_device(n):
        return tuple(t.to(TRITON_DEVICE) for t in make(n))

    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        compiled = wrapgen.compile(model, on_device(DYNAMIC_SIZES[0]), target="fx", dynamic=True)
    for n in DYNAMIC_SIZES:
        inputs = on_device(n)
        with torch.no_grad():
            expected = model(*inputs)
        assert_same_result(compiled(*inputs), expected, **TOL)
    gm = graph_of(compiled)
    launches = triton_launches(gm)
    definitions = {line.name: line for line in compiled.program.lines if isinstance(line, KernelDefinition)}
    assert launches and all(d.language == "triton" for d in definitions.values())
    for node in launches:
        kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        names = set(kernel.arg_names) if hasattr(kernel, "arg_names") else set(kernel.fn.arg_names)
        assert set(node.kwargs["kwargs"]) <= names, node.format_node()
        assert set(kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])) <= names
        (grid,) = node.kwargs["grid"]
        assert len(grid) == 3


@needs_triton
def test_triton_launch_grid_computed_once():
    """Both MLP activations launch over s0*16 elements: one grid node, shared by both launches."""
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        compiled = wrapgen.compile(
            MLP().eval().to(TRITON_DEVICE), (torch.randn(5, 8, device=TRITON_DEVICE),), target="fx", dynamic=True
        )
    calls = [line for line in compiled.program.lines if isinstance(line, KernelCall)]
    assert len(calls) == 2 and calls[0].grid == calls[1].grid and calls[0].grid[0].free_symbols, calls
    gm = graph_of(compiled)
    first, second = triton_launches(gm)
    grid = first.kwargs["grid"][0][0]
    assert isinstance(grid, torch.fx.Node) and second.kwargs["grid"][0][0] is grid
    hints = {s.symbol: s.hint for s in compiled.program.symbols}
    assert grid.meta["val"] == int(calls[0].grid[0].xreplace(hints)) >= 1
    assert sum(1 for n in gm.graph.nodes if n.meta.get("wrapgen_expr") == grid.meta["wrapgen_expr"]) == 1


# -- GPU (the lead runs these on the H100) -------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", ["mlp", "sdpa_block_seq", "softmax", "cat_with_doubled"])
def test_cuda_models(case, dynamic):
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    build, make = DYNAMIC[case]
    model = build()
    if isinstance(model, torch.nn.Module):
        model = model.cuda()

    def make_cuda(n):
        return tuple(t.cuda() for t in make(n))

    compiled = wrapgen.compile(model, make_cuda(DYNAMIC_SIZES[0]), target="fx", dynamic=dynamic)
    for n in DYNAMIC_SIZES if dynamic else DYNAMIC_SIZES[:1]:
        inputs = make_cuda(n)
        with torch.no_grad():
            expected = model(*inputs)
        assert_same_result(compiled(*inputs), expected, rtol=1e-4, atol=1e-4)
    gm = graph_of(compiled)
    launches = [n for n in gm.graph.nodes if n.target is triton_kernel_wrapper_mutation]
    if any(isinstance(line, KernelDefinition) for line in compiled.program.lines):
        assert launches, gm.graph


def test_float_sizes_print_and_run():
    def fn(x):
        return torch.nn.functional.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)

    compiled = compile_fx(fn, (torch.randn(2, 3, 4, 4),), dynamic=True)
    for shape in [(2, 3, 5, 6), (3, 2, 7, 3)]:
        x = torch.randn(*shape)
        assert_same_result(compiled(x), fn(x))
    assert any(n.target in (math.trunc, math.floor) for n in graph_of(compiled).graph.nodes)
