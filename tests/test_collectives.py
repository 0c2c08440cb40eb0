"""Collectives in the Wrapper IR: lowering to start/wait lines, the verifier's in-flight rules,
the overlap pass, memory planning around buffers in flight, and the C++ target's routes.

No process group is needed here: graphs are traced with fake tensors (the collectives' meta
kernels) and programs are built by hand. tests/test_collectives_distributed.py runs them on
real gloo ranks.
"""

from __future__ import annotations

import re

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import wrapgen
from wrapgen.api import optimize
from wrapgen.backends.cpp.collectives import FORWARDING_NAMESPACE, collective_shims, group_name_is_str
from wrapgen.backends.cpp.emitter import CppEmitter
from wrapgen.backends.fx.emitter import FxEmitter
from wrapgen.backends.python.emitter import PythonEmitter
from wrapgen.lowering.capture import capture_aten_graph
from wrapgen.lowering.lower import lower_captured
from wrapgen.wrapper_ir import (
    Allocate,
    AssertInput,
    CollectiveStart,
    CollectiveWait,
    ExternKernel,
    Free,
    Output,
    Program,
    ReuseBuffer,
    TensorInput,
    TensorRef,
    TensorType,
    VerificationError,
    verify,
)
from wrapgen.wrapper_ir.passes import plan_memory, schedule_collectives

c10d = torch.ops._c10d_functional
CPU = torch.device("cpu")


def f32(*sizes: int) -> TensorType:
    strides, running = [], 1
    for size in reversed(sizes):
        strides.insert(0, sympy.Integer(running))
        running *= size
    return TensorType(torch.float32, CPU, tuple(sympy.Integer(s) for s in sizes), tuple(strides))


def lower_fn(fn, *shapes: tuple[int, ...]) -> Program:
    """Trace `fn` with fake tensors (no process group needed) and lower it with library calls."""
    gm = make_fx(fn, tracing_mode="fake")(*(torch.randn(*s) for s in shapes))
    with wrapgen.config.patch(kernels=False):
        return verify(lower_captured(capture_aten_graph(gm)))


def text_lines(program: Program) -> list[str]:
    """The numbered lines of str(program), without their numbers."""
    body = str(program).split("lines:\n", 1)[1]
    return [line.split(None, 1)[1] for line in body.splitlines()]


def wait_text(program: Program) -> str:
    """The text of the (first) collective's wait line."""
    start = next(line for line in program.lines if isinstance(line, CollectiveStart))
    return str(CollectiveWait(start.name, start.input))


def independent_work(x, w, v):
    """An all_reduce whose result is needed only after an independent matrix product (the graph
    waits right after the start, as traced graphs do)."""
    reduced = c10d.wait_tensor(c10d.all_reduce(torch.mm(x, w), "sum", "0"))
    other = torch.mm(x, v).relu()
    return reduced + other


# -- lowering ------------------------------------------------------------------------------
def test_functional_collectives_become_start_and_wait_lines():
    def fsdp_like(x, shard):
        full = c10d.wait_tensor(c10d.all_gather_into_tensor(shard, 2, "7"))
        grad = c10d.wait_tensor(c10d.reduce_scatter_tensor(torch.mm(x, full), "avg", 2, "7"))
        return grad

    program = lower_fn(fsdp_like, (4, 8), (4, 8))
    lines = text_lines(program)
    assert "buf0: f32[8, 8] strides [8, 1] cpu = collective_start all_gather_into_tensor(shard_1, group_size=2) group '7'" in lines
    assert "collective_wait buf0  (input shard_1)" in lines
    start = next(line for line in program.lines if isinstance(line, CollectiveStart) and line.collective == "reduce_scatter_tensor")
    assert (start.reduce_op, start.group_size, start.group) == ("avg", 2, "7")
    assert start.type.sizes == (2, 8)
    # the all_gather's input stays alive until its wait (its Free comes after it)
    order = [str(line) for line in program.lines]
    assert order.index("collective_wait buf0  (input shard_1)") < order.index("free shard_1")


def test_a_read_before_wait_tensor_gets_the_wait_first():
    def reads_early(x):
        started = c10d.all_reduce(x, "sum", "0")
        early = started * 2  # a graph should not do this; the program must still wait first
        return early + c10d.wait_tensor(started)

    lines = text_lines(lower_fn(reads_early, (4,)))
    wait = lines.index("collective_wait buf0  (input x_1)")
    first_read = next(i for i, line in enumerate(lines) if "aten::mul" in line)
    assert wait < first_read
    assert sum(line.startswith("collective_wait") for line in lines) == 1


# -- the overlap pass ----------------------------------------------------------------------
def test_overlap_moves_the_wait_past_independent_calls_and_is_visible():
    program = lower_fn(independent_work, (4, 8), (8, 8), (8, 8))
    with wrapgen.config.patch(memory_planning="none"):
        on = optimize(program)
        with wrapgen.config.patch(overlap_collectives=False):
            off = optimize(program)
    on_lines, off_lines = text_lines(on), text_lines(off)
    wait = wait_text(on)
    mm = next(line for line in on_lines if "aten::mm.out" in line and "v_1" in line)
    relu = next(line for line in on_lines if "aten::relu" in line)
    # on: the independent mm and relu run while the all_reduce is in flight
    assert on_lines.index(mm) < on_lines.index(wait) and on_lines.index(relu) < on_lines.index(wait)
    assert "collective overlap: on: 1 collective(s), 2 call(s) run while one is in flight" in str(on)
    # off: start and wait where the graph has them, nothing in between
    assert off_lines.index(wait) == off_lines.index(next(line for line in off_lines if "collective_start" in line)) + 1
    assert "collective overlap: off: 1 collective(s), 0 call(s)" in str(off)
    # the input's Free followed the wait
    assert on_lines[on_lines.index(wait) + 1] == f"free {wait.split('input ')[1][:-1]}"


def test_starts_move_up_in_order_and_waits_keep_their_order():
    def two(x, y, w):
        busy = torch.mm(torch.mm(x, w), w)  # independent work the graph puts first
        a = c10d.all_reduce(x, "sum", "0")
        b = c10d.all_reduce(y, "max", "0")
        return busy + c10d.wait_tensor(a) + c10d.wait_tensor(b)

    with wrapgen.config.patch(memory_planning="none"):
        lines = text_lines(optimize(lower_fn(two, (8, 8), (8, 8), (8, 8))))
    starts = [i for i, line in enumerate(lines) if "collective_start" in line]
    waits = [i for i, line in enumerate(lines) if line.startswith("collective_wait")]
    first_call = next(i for i, line in enumerate(lines) if line.startswith("extern"))
    assert starts == [first_call - 2, first_call - 1]  # both before the matrix products, in order
    assert "reduce_op='sum'" in lines[starts[0]] and "reduce_op='max'" in lines[starts[1]]
    first_result = lines[starts[0]].split(":")[0]
    assert waits[0] < waits[1] and lines[waits[0]].startswith(f"collective_wait {first_result} ")
    assert all(lines.index(line) < starts[0] for line in lines if line.startswith("assert_input"))


def test_overlap_keeps_every_program_valid_and_memory_planning_respects_buffers_in_flight():
    program = lower_fn(independent_work, (64, 64), (64, 64), (64, 64))
    for mode in ("none", "reuse", "pooled"):
        planned = plan_memory(verify(schedule_collectives(program)), mode)
        verify(planned)
        text = text_lines(planned)
        wait = text.index(wait_text(planned))
        start = next(i for i, line in enumerate(text) if "collective_start" in line)
        source = wait_text(planned).split("input ")[1][:-1]
        # no buffer defined while the all_reduce reads its input takes the input's storage
        assert not any(f"reuse {source} " in line for line in text[start:wait]), mode


# -- the verifier --------------------------------------------------------------------------
def _program(*body) -> Program:
    inputs = (TensorInput("x", f32(4)),)
    end = () if body and isinstance(body[-1], Output) else (Output(()),)
    return Program("p", inputs, (), (), (AssertInput("x", torch.float32, CPU, (4,), (1,)), *body, *end))


START = CollectiveStart("r", "all_reduce", "a", "0", f32(4), reduce_op="sum")
COPY = ExternKernel(None, "aten::copy_.default", (TensorRef("a"), TensorRef("x")), writes=("a",))


@pytest.mark.parametrize(
    "body, message",
    [
        ((START, Output((TensorRef("r"),))), "never waited for: r (started at line 3)"),
        ((START, ExternKernel("y", "aten::neg.default", (TensorRef("r"),), result=f32(4)), CollectiveWait("r", "a"),
          Output((TensorRef("y"),))), "line 4 (y: f32[4] strides [1] cpu = extern aten::neg.default(r)): reads r before"),
        ((START, Free("r")), "frees r while its collective (started at line 3) is in flight"),
        ((START, COPY), "writes a, whose storage the collective started at line 3 still uses (input a)"),
        ((START, ReuseBuffer("b", "a", f32(4))), "reuses a, whose storage"),
        ((START, Free("a"), CollectiveWait("r", "a")), "uses a after it was freed at line 4"),
        ((CollectiveWait("r", "a"),), "waits for r, which no collective in flight defines"),
        ((START, CollectiveWait("r", "x")), "names input x, but the collective started at line 3 reads a"),
        ((CollectiveStart("r", "all_reduce", "a", "0", TensorType(torch.int64, CPU, (4,), (1,)), "sum"),),
         "dtype/device mismatch"),
        ((CollectiveStart("r", "all_gather_into_tensor", "a", "0", f32(4)),), "all_gather_into_tensor needs group_size"),
        ((CollectiveStart("r", "all_reduce", "a", "0", f32(4), reduce_op="mean"),), "unknown reduce_op 'mean'"),
    ],
)
def test_verifier_refuses_misuse_of_a_collective_in_flight(body, message):
    with pytest.raises(VerificationError, match=None) as error:
        verify(_program(Allocate("a", f32(4)), *body))
    assert message in str(error.value)


def test_verifier_accepts_a_wait_before_reads_and_a_free_of_the_input_after_it():
    verify(_program(Allocate("a", f32(4)), START, CollectiveWait("r", "a"), COPY, Free("a"), Output((TensorRef("r"),))))


def test_a_view_of_an_in_flight_input_cannot_be_written():
    from wrapgen.wrapper_ir import Reinterpret

    view = Reinterpret("v", "a", torch.float32, CPU, (4,), (1,))
    write = ExternKernel(None, "aten::zero_.default", (TensorRef("v"),), writes=("v",))
    with pytest.raises(VerificationError, match="writes v, whose storage"):
        verify(_program(Allocate("a", f32(4)), view, START, write))


# -- emitters ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gather_program() -> Program:
    def gather(shard):
        return c10d.wait_tensor(c10d.all_gather_into_tensor(shard, 2, "0")) + 1

    return optimize(lower_fn(gather, (4, 8)))


def test_python_and_fx_targets_call_the_functional_collective_and_wait(gather_program):
    source = PythonEmitter().emit(gather_program)
    assert "_c10d_functional_all_gather_into_tensor_default(shard_1, 2, '0')" in source
    assert "_c10d_functional_wait_tensor_default(buf0)" in source
    gm = FxEmitter().emit(gather_program)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert c10d.all_gather_into_tensor.default in targets and c10d.wait_tensor.default in targets
    wait = next(n for n in gm.graph.nodes if n.target is c10d.wait_tensor.default)
    assert all(wait in user.all_input_nodes or user is wait for user in wait.users)  # readers take the waited tensor


def test_cpp_target_routes_through_the_stable_shim(gather_program):
    shims = collective_shims("cpu")
    source = CppEmitter().emit(gather_program)
    if group_name_is_str("_c10d_functional::all_gather_into_tensor.default"):  # torch 2.11
        assert 'st.call("_c10d_functional::all_gather_into_tensor"' in source
    else:  # torch 2.13: the group name is `Any`, which a StableIValue cannot carry
        assert f'st.call("{FORWARDING_NAMESPACE}::all_gather_into_tensor"' in source
        assert f'"wrapgen_ops": ["{FORWARDING_NAMESPACE}::all_gather_into_tensor.default"]' in source
        schema = str(getattr(torch.ops, FORWARDING_NAMESPACE).all_gather_into_tensor.default._schema)
        assert schema.endswith("(Tensor input, int group_size, str group_name) -> Tensor")
    assert 'st.push(st.str("0"));' in source  # the group is named, resolved when the line runs
    if "aoti_torch_cpu__c10d_functional_wait_tensor" in shims:
        assert "aoti_torch_cpu__c10d_functional_wait_tensor(t_buf0.get(), &ret)" in source
        assert "#include <torch/csrc/inductor/aoti_torch/c/shim_cpu.h>" in source


def test_cpp_all_reduce_uses_the_c10d_shim_function_where_torch_has_one():
    if "aoti_torch_cpu__c10d_functional_all_reduce" not in collective_shims("cpu"):
        pytest.skip("this torch's shim_cpu.h has no c10d functions")
    source = CppEmitter().emit(optimize(lower_fn(independent_work, (4, 8), (8, 8), (8, 8))))
    assert re.search(r'aoti_torch_cpu__c10d_functional_all_reduce\(t_buf\d+\.get\(\), "sum", "0", &ret\)', source)
    assert "wrapgen_ops" not in source  # no op of wrapgen's own: the library needs only libtorch
