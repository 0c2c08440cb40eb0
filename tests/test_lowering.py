"""Lowering: the shape of the programs it produces, and binding size symbols from inputs."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.backends import PythonEmitter
from wrapgen.errors import InputMismatchError
from wrapgen.kernels.triton import compat
from wrapgen.lowering.symbols import BindingSource, SymbolTable, make_symbol, plan_bindings
from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AssertInput,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Program,
    Reinterpret,
    SymbolicCallArg,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    verify,
)


def lines_of(program: Program, kind: type) -> list:
    return [line for line in program.lines if isinstance(line, kind)]


def test_linear_uses_out_variant_into_allocation() -> None:
    with wrapgen.config.patch(matmul_kernel_limit=0):  # small enough to be a generated kernel otherwise
        program = wrapgen.lower(torch.nn.Linear(8, 4), (torch.randn(3, 8),))
    (alloc,) = lines_of(program, Allocate)
    (call,) = lines_of(program, ExternKernel)
    assert call.op == "aten::addmm.out"
    assert dict(call.kwargs)["out"] == TensorRef(alloc.name) and call.writes == (alloc.name,)
    (view,) = lines_of(program, Reinterpret)  # the weight's transpose is a view, not a copy
    assert view.strides == (1, 8)
    assert {c.origin for c in program.constants} == {"weight", "bias"}


def test_every_intermediate_is_freed_right_after_its_last_use() -> None:
    program = wrapgen.lower(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)), (torch.randn(3, 8),))
    lines = program.lines
    owned = {n for line in lines for n in line.defines()} | set(program.input_names())
    freed = {line.name for line in lines_of(program, Free)}
    returned = set(lines[-1].uses())
    assert owned - returned == freed
    assert not freed & {c.name for c in program.constants}
    for index, line in enumerate(lines):
        if isinstance(line, Free):
            later = [other for other in lines[index + 1 :] if line.name in other.uses()]
            assert not later
            previous = next(other for other in reversed(lines[:index]) if not isinstance(other, Free))
            assert line.name in previous.uses() + previous.defines()


def test_multi_output_for_tuple_results_without_out_variant() -> None:
    def f(x):
        a, b = torch.ops.aten.split_with_sizes.default(x * 2, [2, 3])
        return torch.ops.aten.native_dropout.default(x, 0.0, True)[0] + 1, a, b

    program = wrapgen.lower(f, (torch.randn(5, 4),))
    outputs = lines_of(program, MultiOutput)
    assert outputs, str(program)
    producer = next(line for line in program.lines if isinstance(line, ExternKernel) and line.name == outputs[0].source)
    assert isinstance(producer.result, tuple)


def test_topk_writes_values_and_indices_buffers() -> None:
    program = wrapgen.lower(lambda x: torch.topk(x, 2), (torch.randn(4, 6),))
    (call,) = lines_of(program, ExternKernel)
    assert call.op == "aten::topk.values" and len(call.writes) == 2
    types = program.value_types()
    assert [types[n].dtype for n in call.writes] == [torch.float32, torch.int64]


def test_inplace_op_in_aten_graph_is_a_write() -> None:
    def f(x):
        y = torch.ops.aten.mul.Tensor(x, 2)
        torch.ops.aten.add_.Tensor(y, 1)
        return (y,)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(3))
    with wrapgen.config.patch(kernels=False):  # library calls: the op itself, declaring its write
        program = wrapgen.lower(gm, (torch.randn(3),))
    (inplace,) = [line for line in lines_of(program, ExternKernel) if line.op == "aten::add_.Tensor"]
    assert inplace.writes == (inplace.args[0].name,)
    program = wrapgen.lower(gm, (torch.randn(3),))  # kernels: the new value stored in place by a kernel
    assert not lines_of(program, ExternKernel)
    assert any(call.writes for call in lines_of(program, KernelCall))
    compiled = wrapgen.compile(gm, (torch.randn(3),))
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), (x * 2 + 1,))


def test_input_mutation_is_written_back() -> None:
    def f(x):
        x.mul_(3)
        return x + 1

    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(f, (torch.randn(4),))
    copies = [line for line in lines_of(program, ExternKernel) if line.op == "aten::copy_.default"]
    assert copies and copies[0].writes == (program.inputs[0].name,)
    program = wrapgen.lower(f, (torch.randn(4),))  # with kernels the write-back is a kernel's store
    name = program.inputs[0].name
    assert not lines_of(program, ExternKernel)
    assert any(name in call.writes for call in lines_of(program, KernelCall))
    x = torch.randn(4)
    expected = x * 3
    out = wrapgen.compile(f, (x.clone(),))(x)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, expected + 1)


def test_no_line_carries_target_code() -> None:
    """Strings in lines are names, qualified op names, kernel source (data) or comments."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    program = wrapgen.lower(model.eval(), (torch.randn(2, 3, 8, 8),), dynamic=True)
    identifier = str.isidentifier

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                yield from strings(item)

    for line in program.lines:
        if isinstance(line, (Comment, KernelDefinition)):
            continue
        for field in dataclasses.fields(line):
            for text in strings(getattr(line, field.name)):
                if field.name == "op":
                    namespace, _, rest = text.partition("::")
                    assert identifier(namespace) and all(identifier(p) for p in rest.split(".")), text
                elif field.name != "kind":
                    assert identifier(text), f"{type(line).__name__}.{field.name} = {text!r}"


# -- symbol binding ------------------------------------------------------------------------

def test_bindings_solve_expressions_of_several_symbols_in_any_order() -> None:
    s0, s1 = make_symbol("s0"), make_symbol("s1")
    table = SymbolTable()
    table._info = {s0: SymbolInfo(s0, 3), s1: SymbolInfo(s1, 2)}  # as if registered from inputs
    sources = [
        BindingSource("c", "size", 0, s0 + s1 - 1),  # first input: two unknowns, needs the others
        BindingSource("b", "size", 0, 2 * s1),  # only source of s1: solved as b.size(0) // 2
    ]
    lines = plan_bindings(sources, table)
    assert [line.symbol for line in lines] == [s1, s0]
    assert [line.source for line in lines] == ["b", "c"]

    # Emit and run a program that binds this way and checks every size.
    f32, cpu = torch.float32, torch.device("cpu")
    c_type = TensorType(f32, cpu, (s0 + s1 - 1,), (sympy.Integer(1),))
    b_type = TensorType(f32, cpu, (2 * s1,), (sympy.Integer(1),))
    body = [
        *lines,
        AssertInput("c", f32, cpu, c_type.sizes, c_type.strides),
        AssertInput("b", f32, cpu, b_type.sizes, b_type.strides),
        Output((s0, s1)),
    ]
    program = verify(Program("bind", (TensorInput("c", c_type), TensorInput("b", b_type)), table.infos(), (), tuple(body)))
    call = PythonEmitter().compile(program).call
    assert call([torch.zeros(6), torch.zeros(6)]) == (4, 3)  # s1 = 6 // 2, s0 = 6 - 3 + 1
    with pytest.raises(InputMismatchError, match=r"input b: expected shape \(6,\), got \(7,\)"):
        call([torch.zeros(6), torch.zeros(7)])  # odd: no s1 with 2*s1 == 7


def test_unbindable_symbol_is_reported() -> None:
    s0, s1 = make_symbol("s0"), make_symbol("s1")
    table = SymbolTable()
    table._info = {s0: SymbolInfo(s0, 3), s1: SymbolInfo(s1, 2)}
    with pytest.raises(wrapgen.LoweringError, match="cannot determine size symbol"):
        plan_bindings([BindingSource("x", "size", 0, s0 * s1)], table)


def test_dynamic_program_binds_from_inputs_and_checks_range() -> None:
    def f(y, x):  # y comes first and has size 2*s0: s0 must be bound from x
        return torch.cat([x, x]) + y

    example = (torch.randn(6, 4), torch.randn(3, 4))
    program = wrapgen.lower(f, example, dynamic=True)
    binds = {b.symbol: b for b in lines_of(program, BindSymbol)}
    (s0,) = program.inputs[0].type.sizes[0].free_symbols
    assert program.inputs[0].type.sizes[0] == 2 * s0
    assert (binds[s0].source, binds[s0].dim) == (program.inputs[1].name, 0)
    assert all(b.expr == OBSERVED and b.min == 2 for b in binds.values())
    compiled = wrapgen.compile(f, example, dynamic=True)
    for n in (2, 5, 9):
        y, x = torch.randn(2 * n, 4), torch.randn(n, 4)
        torch.testing.assert_close(compiled(y, x), f(y, x))
    with pytest.raises(InputMismatchError, match="input args_0: expected shape"):
        compiled(torch.randn(7, 4), torch.randn(4, 4))
    y, x = torch.randn(2, 4), torch.randn(1, 4)
    with pytest.raises(InputMismatchError, match=r"size symbol s0 = 1 is outside \[2, inf\]"):
        compiled.artifact.call([y, x])  # the dynamic program itself
    torch.testing.assert_close(compiled(y, x), f(y, x))  # served by a program for s0 = 1


@pytest.mark.parametrize("cpu_kernels", ["cpp", "triton"])
def test_kernel_size_arguments_are_defined_right_before_their_first_call(cpu_kernels: str) -> None:
    """The softmax kernel is generated first (it names s0*s1*s2 first) but runs after the
    batch reductions it reads: the size is defined once, before the first call that takes it."""

    if cpu_kernels == "triton" and not (compat.available() and compat.interpreting()):
        pytest.skip("CPU Triton kernels need triton in interpreter mode")

    def f(x):
        return torch.log_softmax(x, 1) - x.mean((0, 1))

    with wrapgen.config.patch(cpu_kernels=cpu_kernels):
        program = wrapgen.lower(f, (torch.randn(4, 5, 6),), dynamic=True)
    lines = list(program.lines)
    defined = lines_of(program, SymbolicCallArg)
    assert defined and len({d.symbol for d in defined}) == len(defined), str(program)
    for definition in defined:
        first = next(i for i, line in enumerate(lines) if definition.symbol in line.symbols_used())
        assert lines[first - 1] == definition and isinstance(lines[first], KernelCall), str(program)
    calls = lines_of(program, KernelCall)
    first_kernel = lines_of(program, KernelDefinition)[0].name
    assert calls[0].kernel != first_kernel, "the case needs a kernel that runs before the first one generated"


def test_specialized_number_input_is_checked_at_call_time() -> None:
    def f(x, n):
        return x * n

    compiled = wrapgen.compile(f, (torch.randn(3), 3))
    assert any(line.format() == f"assert_scalar {compiled.program.inputs[1].name} == 3" for line in compiled.program.lines)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, 3), x * 3)
    with pytest.raises(InputMismatchError, match="compiled for the value 3, got 4"):
        compiled(x, 4)


def _shifted_gradient(logits: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """GPT-2's shifted-logits gradient in small: a slice read through a reshape, scattered back."""
    batch, tokens, vocab = 2, 6, 7
    shifted = logits.view(batch, tokens, vocab)[:, :-1, :].reshape(-1, vocab) * w
    return torch.slice_scatter(torch.zeros(batch, tokens, vocab), shifted.view(batch, tokens - 1, vocab), 1, 0, tokens - 1)


@pytest.mark.parametrize("language", ["cpp", "triton"])
def test_a_clamped_position_is_not_divided_by_the_extent_it_is_clamped_below(language) -> None:
    """The scatter clamps its read position into the slice (`min(4, x1)`); the view it reads
    through splits that position by the slice's extent (5), a division and a modulo per element
    that the clamp makes constant (0) and the identity: neither is left in the kernel."""
    args = (torch.randn(12, 7), torch.randn(7))
    with wrapgen.config.patch(cpu_kernels=language):
        program = wrapgen.lower(_shifted_gradient, args)
        compiled = wrapgen.compile(_shifted_gradient, args, target="python")
    sources = "\n".join(line.source for line in program.lines if isinstance(line, KernelDefinition))
    assert "min" in sources
    assert "wg_floordiv" not in sources and "wg_mod" not in sources and "// 5" not in sources and "% 5" not in sources
    fresh = (torch.randn(12, 7), torch.randn(7))
    torch.testing.assert_close(compiled(*fresh), _shifted_gradient(*fresh))


class _ReshapedResidualLayer(torch.nn.Module):
    """An OPT decoder layer's residual pattern: the sum is read through a reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        h = h.reshape(-1, 16)
        return (h + self.proj(self.norm(h))).view(shape)


def test_a_residual_sum_read_through_a_reshape_is_not_recomputed_by_every_later_layer() -> None:
    """Each layer's sum is read by the next LayerNorm and the next sum, both through a reshape.
    Counting the reshape as its only reader inlined every sum into every later LayerNorm: the
    last layer's kernel read every earlier layer's projection (quadratic work in the depth)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_ReshapedResidualLayer() for _ in range(10)]).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        program = wrapgen.lower(model, (x,))
        widest = max(len(call.uses()) for call in lines_of(program, KernelCall))
        assert widest <= 7, str(program)  # LayerNorm weight and bias, its output, and a few sums
        torch.testing.assert_close(wrapgen.compile(model, (x,))(x), model(x))


def test_a_pooled_value_read_from_several_tensors_is_computed_once_before_the_windows_read_it() -> None:
    """Each output of a 3x3 pooling reads its source nine times: inlined, a sum of two tensors
    would load both nine times per output (PoolFormer pools a normalized residual stream)."""

    def pool_of_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(a + b, 3, 1, 1, count_include_pad=False) - torch.relu(b)

    a, b = torch.randn(2, 4, 9, 9), torch.randn(2, 4, 9, 9)
    program = wrapgen.lower(pool_of_sum, (a, b))
    pooling = [call for call in lines_of(program, KernelCall) if "avg_pool2d" in call.kernel]
    assert pooling and all("args_0" not in call.uses() for call in pooling), str(program)  # reads the sum, in memory
    torch.testing.assert_close(wrapgen.compile(pool_of_sum, (a, b))(a, b), pool_of_sum(a, b))
