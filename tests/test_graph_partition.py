"""CUDA-graph partitions on the CPU: the partition pass, its text form, the verifier's errors,
option plumbing, and every target running a partitioned program (regions run eagerly off CUDA).

The GPU side (recording, replay, static inputs, dynamic sizes, training) is tests/test_cuda_graphs.py.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest
import sympy
import torch

import wrapgen
from wrapgen import config
from wrapgen.api import optimize
from wrapgen.backends import get_backend
from wrapgen.backends.cpp.build import runtime_include_dir, torch_include_dirs
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AssertInput,
    BindSymbol,
    Constant,
    ExternKernel,
    Free,
    GraphBegin,
    GraphEnd,
    KernelCall,
    KernelDefinition,
    Output,
    Program,
    Reinterpret,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    VerificationError,
    verify,
)
from wrapgen.wrapper_ir.graphs import op_blocker, seeded_op_blocker
from wrapgen.wrapper_ir.passes import partition_graphs
from wrapgen.wrapper_ir.passes.graph_partition import OUTPUT_COPY
from wrapgen.wrapper_ir.values import contiguous_strides

CUDA = torch.device("cuda:0")
U0 = sympy.Symbol("u0", integer=True)


def ty(*sizes: int, device: torch.device = CUDA, dtype: torch.dtype = torch.float32) -> TensorType:
    shape = tuple(sympy.Integer(s) for s in sizes)
    return TensorType(dtype, device, shape, contiguous_strides(shape))


def split_program() -> Program:
    """CUDA work, a `.item()`, CUDA work, a copy to the CPU, CUDA work."""
    x, w = ty(4, 8), ty(8, 8)
    ref = TensorRef
    lines = [
        AssertInput("x", torch.float32, CUDA, x.sizes, x.strides),
        KernelDefinition("k0", "triton", "# k0"),
        KernelDefinition("k1", "triton", "# k1"),
        KernelDefinition("k2", "triton", "# k2"),
        Allocate("buf0", ty(4, 8)),
        ExternKernel(None, "aten::mm.out", (ref("x"), ref("w")), (("out", ref("buf0")),), writes=("buf0",)),
        Allocate("buf1", ty(dtype=torch.int64)),
        KernelCall("k0", (ref("buf0"), ref("buf1")), (sympy.Integer(1),), writes=("buf1",)),
        BindSymbol(U0, "buf1", "item", None, OBSERVED, None, None),
        Free("buf1"),
        Allocate("buf2", ty(4, 8)),
        KernelCall("k1", (ref("buf0"), ref("buf2")), (sympy.Integer(1),), writes=("buf2",)),
        Free("buf0"),
        ExternKernel("buf3", "aten::_to_copy.default", (ref("buf2"),), (("device", torch.device("cpu")),), result=ty(4, 8, device=torch.device("cpu"))),
        Allocate("buf4", ty(4, 8)),
        KernelCall("k2", (ref("buf2"), ref("buf4")), (sympy.Integer(1),), writes=("buf4",)),
        Free("buf2"),
        Output((ref("buf3"), ref("buf4"), U0)),
    ]
    return Program(
        "split",
        (TensorInput("x", x),),
        (SymbolInfo(U0, 0, None, None),),
        (Constant("w", w, "weight"),),
        tuple(lines),
    )


def text_lines(program: Program) -> list[str]:
    return [line.format() for line in program.lines]


def region(program: Program, graph: str) -> list[str]:
    lines = text_lines(program)
    start = next(i for i, t in enumerate(lines) if t.startswith(f"graph {graph} begin"))
    end = next(i for i, t in enumerate(lines) if t.startswith(f"graph {graph} end"))
    return lines[start : end + 1]


def test_partition_splits_around_item_and_cpu_op():
    program = verify(partition_graphs(verify(split_program())))
    text = str(program)
    assert region(program, "g0") == [
        "graph g0 begin cuda:0  inputs (x, w)  in_place (w)  key ()",
        "buf0 = allocate f32[4, 8] strides [8, 1] cuda:0",
        "extern aten::mm.out(x, w, out=buf0)  writes buf0",
        "buf1 = allocate i64[] strides [] cuda:0",
        "call k0(buf0, buf1) grid [1]  writes buf1",
        "graph g0 end  outputs (buf0, buf1)",
    ]
    # the .item() ends the first graph; an earlier graph's output is used in place by the next
    assert region(program, "g1")[0] == "graph g1 begin cuda:0  inputs (buf0)  in_place (buf0)  key ()"
    assert region(program, "g1")[-1] == "graph g1 end  outputs (buf2)"
    assert "graph g2 begin cuda:0  inputs (buf2)  in_place (buf2)  key ()" in text
    lines = text_lines(program)
    assert lines.index("bind u0 = buf1.item()  in [-inf, inf]") == lines.index("graph g0 end  outputs (buf0, buf1)") + 1
    to_cpu = next(i for i, t in enumerate(lines) if "aten::_to_copy" in t)
    assert lines[to_cpu - 1] == "graph g1 end  outputs (buf2)" and lines[to_cpu + 1].startswith("graph g2 begin")
    # the output in graph memory is copied into a fresh tensor; the CPU one is not
    assert lines[-4:] == [
        "# 1 output(s) copied out of graph memory",
        "buf4_out = allocate f32[4, 8] strides [8, 1] cuda:0",
        "extern aten::copy_.default(buf4_out, buf4)  writes buf4_out",
        "return (buf3, buf4_out, u0)",
    ]


def test_partition_of_a_cpu_program_is_the_identity():
    program = optimize(wrapgen.lower(_chain, (torch.randn(4, 8), torch.randn(8, 8))))
    assert partition_graphs(program) is program  # regions are for CUDA lines only


def test_data_dependent_sizes_and_uncapturable_ops_split():
    assert op_blocker("aten::nonzero.default") is not None
    assert op_blocker("aten::_local_scalar_dense.default") is not None
    assert op_blocker("aten::mm.out") is None
    assert op_blocker("aten::rand_like.default") is None and seeded_op_blocker("aten::rand_like.default") is not None
    qkv = (TensorRef("q"), TensorRef("k"), TensorRef("v"))
    sdpa = ExternKernel("o", "aten::scaled_dot_product_attention.default", qkv, result=ty(1, 2, 4, 8))
    assert seeded_op_blocker(sdpa) is None  # dropout 0: deterministic, recorded by the C++ target too
    assert seeded_op_blocker(replace(sdpa, kwargs=(("dropout_p", 0.1),))) is not None
    x = ty(4, 8)
    n = sympy.Symbol("u1", integer=True)
    lines = [
        AssertInput("x", torch.float32, CUDA, x.sizes, x.strides),
        ExternKernel("nz", "aten::nonzero.default", (TensorRef("x"),), result=TensorType(torch.int64, CUDA, (n, sympy.Integer(2)), (sympy.Integer(2), sympy.Integer(1)))),
        BindSymbol(n, "nz", "size", 0, OBSERVED, 0, None),
        Allocate("buf0", TensorType(torch.int64, CUDA, (n, sympy.Integer(2)), (sympy.Integer(2), sympy.Integer(1)))),
        ExternKernel(None, "aten::neg.out", (TensorRef("nz"),), (("out", TensorRef("buf0")),), writes=("buf0",)),
        Allocate("buf1", ty(4, 8)),
        ExternKernel(None, "aten::neg.out", (TensorRef("x"),), (("out", TensorRef("buf1")),), writes=("buf1",)),
        Output((TensorRef("buf0"), TensorRef("buf1"))),
    ]
    program = Program("dd", (TensorInput("x", x),), (SymbolInfo(n, 2, 0, None),), (), tuple(lines))
    parted = verify(partition_graphs(verify(program)))
    begins = [line for line in parted.lines if isinstance(line, GraphBegin)]
    # nonzero (data-dependent output) and the work on its size-u1 result stay outside; the rest is one graph
    assert len(begins) == 1 and begins[0].inputs == ("x",)
    assert region(parted, "g0")[1:3] == ["buf1 = allocate f32[4, 8] strides [8, 1] cuda:0", "extern aten::neg.out(x, out=buf1)  writes buf1"]


def test_inputs_the_program_writes_are_used_in_place():
    """State written in place (an optimizer's step, a KV cache) is read and written at the
    caller's address: a copy would take the write, and copying it in costs a pass per call."""
    x, y = ty(4, 8), ty(4, 8)
    lines = [
        AssertInput("x", torch.float32, CUDA, x.sizes, x.strides),
        AssertInput("y", torch.float32, CUDA, y.sizes, y.strides),
        Allocate("buf0", ty(4, 8)),
        ExternKernel(None, "aten::neg.out", (TensorRef("y"),), (("out", TensorRef("buf0")),), writes=("buf0",)),
        ExternKernel(None, "aten::add_.Tensor", (TensorRef("x"), TensorRef("buf0")), writes=("x",)),
        Output((TensorRef("buf0"),)),
    ]
    program = verify(Program("mut", (TensorInput("x", x), TensorInput("y", y)), (), (), tuple(lines)))
    parted = verify(partition_graphs(program))
    assert "extern aten::add_.Tensor(x, buf0)  writes x" in region(parted, "g0")
    assert region(parted, "g0")[0] == "graph g0 begin cuda:0  inputs (y, x)  in_place (x)  key ()"  # y is copied
    # a write into a copied input would stay outside its graph (the caller would not see it)
    from wrapgen.wrapper_ir.graphs import region_blocker

    assert region_blocker(lines[4], "g0", set(), {}, set()) is not None


def _replace_line(program: Program, index: int, *new) -> Program:
    lines = list(program.lines)
    lines[index : index + 1] = list(new)
    return program.with_lines(lines)


def _find(program: Program, prefix: str) -> int:
    return next(i for i, line in enumerate(program.lines) if line.format().startswith(prefix))


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda p: _replace_line(p, _find(p, "graph g2 end")), "the program ends inside graph g2"),
        (
            lambda p: _replace_line(p, _find(p, "buf1 = allocate"), p.lines[_find(p, "buf1 = allocate")], GraphBegin("g9", CUDA)),
            "graph regions do not nest",
        ),
        (
            lambda p: _replace_line(p, _find(p, "graph g0 begin"), replace(p.lines[_find(p, "graph g0 begin")], inputs=("w",), in_place=("w",))),
            "reads x, which graph g0 does not list as an input",
        ),
        (
            lambda p: _replace_line(p, _find(p, "graph g0 end"), GraphEnd("g0", ("buf1",))),
            "uses buf0, which graph g0 defines but does not list as an output",
        ),
        (
            lambda p: _replace_line(p, _find(p, "graph g0 end"), BindSymbol(sympy.Symbol("u7", integer=True), "buf1", "item", None, OBSERVED, None, None), p.lines[_find(p, "graph g0 end")]),
            "cannot be recorded in graph g0: reads tensor data on the host (.item())",
        ),
        (
            lambda p: _replace_line(p, _find(p, "graph g0 begin"), replace(p.lines[_find(p, "graph g0 begin")], in_place=("nope",))),
            "in_place names nope are not among the graph's inputs",
        ),
        (lambda p: _replace_line(p, _find(p, "graph g0 begin")), "ends graph g0, which is not open"),
    ],
)
def test_verifier_names_the_line_of_a_malformed_partition(break_it, message):
    program = verify(partition_graphs(verify(split_program())))
    broken = break_it(program)
    with pytest.raises(VerificationError) as info:
        verify(broken)
    assert message in str(info.value)
    assert info.value.line_number > 0 and str(info.value).startswith(f"line {info.value.line_number} (")


def test_partitioning_twice_is_refused():
    program = partition_graphs(verify(split_program()))
    with pytest.raises(ValueError, match="partitioned already"):
        partition_graphs(program)


# -- options ----------------------------------------------------------------------------------


def test_option_defaults_env_and_patch(monkeypatch):
    assert config.cuda_graphs is False
    monkeypatch.setenv("WRAPGEN_CUDA_GRAPHS", "1")
    assert config.OPTIONS["cuda_graphs"].parse_env() is True
    with pytest.raises(TypeError):
        config.validate({"cuda_graphs": "yes"})


def test_options_are_taken_at_compile_time():
    program = verify(split_program())
    with config.patch(cuda_graphs=True):
        inside = optimize(program)
    outside = optimize(program)
    assert any(isinstance(line, GraphBegin) for line in inside.lines)
    assert not any(isinstance(line, GraphBegin) for line in outside.lines)
    # the C++ target's rule keeps random ops out of its graphs
    with config.patch(cuda_graphs=True):
        assert any(isinstance(line, GraphBegin) for line in optimize(program, "cpp").lines)


def _chain(x, w):
    y = torch.relu(x @ w) + 1
    n = (y > 1.5).sum().item()
    return torch.sin(y) * 2 + n, y.cos()


def test_cpu_programs_are_unchanged_with_cuda_graphs():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with config.patch(cuda_graphs=True):
        fn = wrapgen.compile(_chain, (x, w))
        compiled = torch.compile(torch.nn.Linear(8, 4), backend="wrapgen", options={"cuda_graphs": True})
    assert "graph g0" not in str(fn.program)
    x2, w2 = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(fn(x2, w2), _chain(x2, w2))
    inputs = torch.randn(3, 8, requires_grad=True)
    out = compiled(inputs)
    out.sum().backward()
    assert inputs.grad is not None and inputs.grad.shape == (3, 8)


# -- every target runs a partitioned program ---------------------------------------------------


@pytest.mark.parametrize("target", ["python", "cpp", "fx", "interpret"])
@pytest.mark.parametrize("fn", ["_chain", "_two"])
def test_targets_run_a_partitioned_program(target, fn):
    fn = globals()[fn]
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    program = verify(partition_graphs(optimize(wrapgen.lower(fn, (x, w))), device_type="cpu"))
    text = str(program)
    assert "graph g0 begin cpu" in text and "bind u0 = " in text
    assert (fn is _two) == ("graph g1 begin cpu" in text)
    artifact = get_backend(target)().compile(program)
    for _ in range(3):  # warm-up, then what would be record and replay on CUDA
        a, b = torch.randn(4, 8), torch.randn(8, 8)
        torch.testing.assert_close(tuple(artifact.call([a.clone(), b.clone()])), fn(a, b))
    if target == "python":
        assert "_graph_g0((args_0, args_1), ())" in artifact.source
        assert "library_calls=False)" in artifact.source  # generated kernels only: no cuBLAS workspace made
    if target == "cpp":
        assert "wrapgen::graphs::Call wg_g0(" in artifact.source
        assert "wg_workspaces_cleared" in artifact.source  # told of cuBLAS workspace clears
    if target == "fx":
        tagged = [node for node in artifact.call.graph.nodes if node.meta.get("wrapgen_cuda_graph") == "g0"] if hasattr(artifact.call, "graph") else None
        assert tagged is None or tagged


def _logits(x, w):
    return torch.tanh(x @ w)[:, :, None] * torch.linspace(0, 1, 128)  # 2 MiB written by a kernel, as an LM head's logits


@pytest.mark.parametrize("target", ["python", "cpp", "fx", "interpret"])
def test_a_large_output_is_made_outside_the_graph_not_copied_out(target):
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    program = verify(partition_graphs(optimize(wrapgen.lower(_logits, (x, w))), device_type="cpu"))
    lines = text_lines(program)
    end = next(i for i, t in enumerate(lines) if t.startswith("graph g0 end"))
    product = next(i for i, t in enumerate(lines) if "aten::mm" in t)
    last_kernel = max(i for i, t in enumerate(lines) if t.startswith("call "))
    # the product stays in the graph (a library call outside it would make a cuBLAS workspace
    # for the caller's stream); the kernel writing the result runs after it
    assert product < end < last_kernel and not any("graph g1" in t for t in lines)
    assert not any(OUTPUT_COPY in t for t in lines)
    artifact = get_backend(target)().compile(program)
    results = []
    for _ in range(3):  # warm-up, then what would be record and replay on CUDA
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        results.append((artifact.call([a.clone(), b.clone()]), _logits(a, b)))
    for (got,), want in results:  # each call returned memory of its own
        torch.testing.assert_close(got, want)
    assert len({got.untyped_storage().data_ptr() for (got,), _ in results}) == 3
    if target == "python":  # its graph holds a library call: cuBLAS's workspace is made before recording
        assert "library_calls=True)" in artifact.source


@pytest.mark.parametrize("kernels", [1, 2])
def test_the_tail_left_outside_never_costs_more_launches_than_the_copies(kernels):
    """A 2 MiB output written by one kernel after the graph saves its copy; written by two, the
    two launches outside would cost more than one copy: it stays inside and is copied out."""
    x, w, big = ty(4, 8), ty(8, 8), ty(512, 1024)
    ref = TensorRef
    writers = [KernelCall("k0", (ref("buf0"), ref("buf1")), (sympy.Integer(1),), writes=("buf1",))]
    if kernels == 2:
        writers.append(KernelCall("k1", (ref("buf1"),), (sympy.Integer(1),), writes=("buf1",)))
    lines = [
        AssertInput("x", torch.float32, CUDA, x.sizes, x.strides),
        KernelDefinition("k0", "triton", "# k0"),
        KernelDefinition("k1", "triton", "# k1"),
        Allocate("buf0", ty(4, 8)),
        ExternKernel(None, "aten::mm.out", (ref("x"), ref("w")), (("out", ref("buf0")),), writes=("buf0",)),
        Allocate("buf1", big),
        *writers,
        Free("buf0"),
        Output((ref("buf1"),)),
    ]
    program = Program("tail", (TensorInput("x", x),), (), (Constant("w", w, "weight"),), tuple(lines))
    text = text_lines(verify(partition_graphs(verify(program))))
    end = text.index("graph g0 end  outputs (buf0)" if kernels == 1 else "graph g0 end  outputs (buf1)")
    assert (text.index(next(t for t in text if t.startswith("call k0"))) > end) == (kernels == 1)
    assert any(OUTPUT_COPY in t for t in text) == (kernels == 2)


def test_small_outputs_stay_in_the_graph_and_are_copied_out():
    x, w = torch.randn(4, 8), torch.randn(8, 8)  # 16 KiB
    program = verify(partition_graphs(optimize(wrapgen.lower(_logits, (x, w))), device_type="cpu"))
    lines = text_lines(program)
    last_kernel = max(i for i, t in enumerate(lines) if t.startswith("call "))
    assert last_kernel < lines.index(next(t for t in lines if t.startswith("graph g0 end")))
    assert any(OUTPUT_COPY in t for t in lines)


def test_cpp_refuses_a_random_op_inside_a_graph():
    program = wrapgen.lower(lambda a: torch.rand_like(a) + a.sin(), (torch.randn(4, 8),))
    parted = verify(partition_graphs(optimize(program), device_type="cpu", blocker=lambda op: None))
    assert "graph g0 begin cpu" in str(parted)
    with pytest.raises(UnsupportedLineError, match=r"line \d+ \(.*rand_like.*\): cannot be recorded in a C\+\+ graph"):
        get_backend("cpp")().emit(parted)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cuda_graphs_header_compiles_with_and_without_cuda(tmp_path):
    source = tmp_path / "use.cpp"
    source.write_text(
        '#include "wrapgen/cuda_graphs.h"\n'
        "int main() {\n"
        "  wrapgen::graphs::Program p; wrapgen::graphs::Region r;\n"
        "  wrapgen::graphs::workspace_epoch().fetch_add(1);\n"
    "  { wrapgen::graphs::RunGuard g(p, 0); wrapgen::graphs::Call c(p, r, 0, true, true); c.key({1, 2});\n"
        "    wrapgen::Tensor t; wrapgen::Value v; if (c.replay()) t = c.output(0);\n"
        "    c.begin_body(); c.release(t); c.release(v); c.end_body({&t}, {}); }\n"
        "  return 0;\n}\n"
    )
    includes = [f"-I{runtime_include_dir()}", *(f"-I{d}" for d in torch_include_dirs())]
    for flags in ([], ["-DUSE_CUDA"]):
        subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", *flags, *includes, str(source)], check=True)


# -- the Python target's record/replay logic, with a CPU stand-in for a CUDA graph -------------


class FakeGraph:
    """A CUDA graph's contract on the CPU: recording fixes the output tensors; a replay reads the
    static inputs and writes the results into those same tensors."""

    def __init__(self, fn, statics, key):
        self.fn, self.statics, self.key = fn, statics, key
        saved = [t.clone() for t in statics]
        self.outputs = tuple(fn(*statics, *key))  # recording runs nothing: undo what this run wrote
        for t, before in zip(statics, saved):
            t.copy_(before)

    def replay(self):
        for out, new in zip(self.outputs, self.fn(*self.statics, *self.key)):
            out.copy_(new)


@pytest.fixture
def fake_graphs(monkeypatch):
    from wrapgen.backends.python import graph_runtime

    def capture(self, statics, key):
        graph = FakeGraph(self.fn, statics, key)
        return graph, graph.outputs

    monkeypatch.setattr(graph_runtime.GraphRegion, "_capture", capture)

    def recording(artifact) -> list:
        found = [v for k, v in artifact.call.__globals__.items() if k.startswith("_graph_g")]
        for region in found:
            region.capture, region.eager = True, False  # record on the CPU, through FakeGraph
        return found

    return recording


def test_python_records_once_and_replays_on_fresh_inputs(fake_graphs):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    program = verify(partition_graphs(optimize(wrapgen.lower(_chain, (x, w))), device_type="cpu"))
    artifact = get_backend("python")().compile(program)
    (graph,) = fake_graphs(artifact)
    results = []
    for _ in range(5):
        a, b = torch.randn(4, 8), torch.randn(8, 8)
        results.append(((a, b), tuple(artifact.call([a, b]))))
    for (a, b), out in results:  # outputs held across calls stay correct: they were copied out
        torch.testing.assert_close(out, _chain(a, b))
    assert (graph.records, graph.replays) == (1, 4), graph


def test_python_in_place_input_with_a_new_address_is_recorded_again(fake_graphs):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    lowered = optimize(wrapgen.lower(_chain, (x, w)))
    program = verify(partition_graphs(lowered, static_inputs=("args_1",), device_type="cpu"))
    assert "in_place (args_1)" in str(program)
    artifact = get_backend("python")().compile(program)
    (graph,) = fake_graphs(artifact)
    for _ in range(3):
        a = torch.randn(4, 8)
        torch.testing.assert_close(tuple(artifact.call([a, w])), _chain(a, w))
    assert graph.records == 1
    w2 = torch.randn(8, 8)  # the "parameter" swapped for another tensor
    for _ in range(2):
        a = torch.randn(4, 8)
        torch.testing.assert_close(tuple(artifact.call([a, w2])), _chain(a, w2))
    assert graph.records == 2, graph


def test_python_dynamic_program_records_one_graph_per_size(fake_graphs):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    with torch.no_grad():
        program = verify(partition_graphs(optimize(wrapgen.lower(model, (torch.randn(4, 8),), dynamic=True)), device_type="cpu"))
        assert regions_key(program), str(program)
        artifact = get_backend("python")().compile(program)
        (graph,) = fake_graphs(artifact)
        for _ in range(4):
            for batch in (2, 3, 5):
                x = torch.randn(batch, 8)
                torch.testing.assert_close(artifact.call([x])[0], model(x))
    assert len(graph.graphs) == 3 and graph.records == 3, graph


def regions_key(program: Program) -> tuple:
    return next(line.key for line in program.lines if isinstance(line, GraphBegin))


def _two(x, w):
    y = torch.relu(x @ w) + 1
    n = (y > 1.5).sum().item()  # ends the first graph; the work after it is the second
    return torch.sin(y) * 2, y.cos(), n


def test_python_two_graphs_in_one_call(fake_graphs):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    program = verify(partition_graphs(optimize(wrapgen.lower(_two, (x, w))), device_type="cpu"))
    artifact = get_backend("python")().compile(program)
    graphs = fake_graphs(artifact)
    assert len(graphs) == 2, str(program)
    for _ in range(5):
        a, b = torch.randn(4, 8), torch.randn(8, 8)
        torch.testing.assert_close(tuple(artifact.call([a, b])), _two(a, b))
    assert [(g.records, g.replays) for g in graphs] == [(1, 4), (1, 4)]


def test_a_returned_view_of_an_input_stays_a_view_of_the_callers_tensor():
    x = ty(4, 8)
    lines = [
        AssertInput("x", torch.float32, CUDA, x.sizes, x.strides),
        Allocate("buf0", ty(4, 8)),
        ExternKernel(None, "aten::neg.out", (TensorRef("x"),), (("out", TensorRef("buf0")),), writes=("buf0",)),
        Reinterpret("v", "x", torch.float32, CUDA, (sympy.Integer(3), sympy.Integer(8)), (sympy.Integer(8), sympy.Integer(1)), sympy.Integer(8)),
        Output((TensorRef("buf0"), TensorRef("v"))),
    ]
    program = verify(partition_graphs(verify(Program("view", (TensorInput("x", x),), (), (), tuple(lines)))))
    text = text_lines(program)
    assert text.index("v = reinterpret x as f32[3, 8] strides [8, 1] offset 8 cuda:0") < text.index("graph g0 begin cuda:0  inputs (x)  key ()")
    assert text[-1] == "return (buf0_out, v)"


def test_cpp_dynamic_program_with_a_keyed_graph():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    with torch.no_grad():
        program = verify(partition_graphs(optimize(wrapgen.lower(model, (torch.randn(4, 8),), dynamic=True)), device_type="cpu"))
        artifact = get_backend("cpp")().compile(program)
        assert ".key({" in artifact.source
        for batch in (2, 3, 5, 3, 2):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(artifact.call([x])[0], model(x))


def test_python_falls_back_to_eager_when_recording_fails(fake_graphs, monkeypatch):
    from wrapgen.backends.python import graph_runtime

    def fail(self, statics, key):
        raise RuntimeError("operation not permitted when stream is capturing")

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    artifact = get_backend("python")().compile(verify(partition_graphs(optimize(wrapgen.lower(_chain, (x, w))), device_type="cpu")))
    (graph,) = fake_graphs(artifact)
    monkeypatch.setattr(graph_runtime.GraphRegion, "_capture", fail)
    with pytest.warns(UserWarning, match="could not be recorded"):
        for _ in range(3):
            a, b = torch.randn(4, 8), torch.randn(8, 8)
            torch.testing.assert_close(tuple(artifact.call([a, b])), _chain(a, b))
    assert graph.eager and not graph.graphs
