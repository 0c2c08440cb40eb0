"""Tuple results of library calls (`ExternKernel` returning several tensors, picked apart by
`MultiOutput` lines) and CUDA-graph partitions.

Why: on CUDA, flash and cuDNN attention (`_scaled_dot_product_flash_attention`,
`_scaled_dot_product_cudnn_attention`) return tuples with entries that are not tensors (SymInts,
undefined tensors), so `line_blocker` keeps the call out of the graphs. Its picks used to open the
next graph, making the tuple a graph input: the python target asked it for `.stride()`, the C++
target bound it as a `wrapgen::Tensor` and called `.at({0})` on that. A pick now stays with its
tuple: both inside one graph, or both outside and the picked tensors cross as inputs.

The CPU tests partition CPU programs (`device_type="cpu"`; regions run eagerly off CUDA, the
python target also records through a CPU stand-in); the `cuda` tests compile attention with a
KV-cache update through torch.compile on a GPU.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import sympy
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.api import optimize
from wrapgen.backends import get_backend
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AssertInput,
    BindSymbol,
    ExternKernel,
    Free,
    GraphBegin,
    GraphEnd,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Program,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    VerificationError,
    verify,
)
from wrapgen.wrapper_ir.passes import partition_graphs
from wrapgen.wrapper_ir.values import contiguous_strides

CPU, CUDA = torch.device("cpu"), torch.device("cuda:0")
TARGETS = ["python", "cpp", "fx", "interpret"]


def ty(*sizes: int, device: torch.device = CPU, dtype: torch.dtype = torch.float32, strided: bool = True) -> TensorType:
    shape = tuple(sympy.Integer(s) for s in sizes)
    return TensorType(dtype, device, shape, contiguous_strides(shape) if strided else None)


def tuple_inputs(program: Program) -> list[str]:
    types = program.value_types()
    return [n for line in program.lines if isinstance(line, GraphBegin) for n in line.inputs if isinstance(types.get(n), tuple)]


def inside_graphs(program: Program) -> set[str]:
    """Names defined between a GraphBegin and its GraphEnd."""
    inside, names = False, set()
    for line in program.lines:
        if isinstance(line, (GraphBegin, GraphEnd)):
            inside = isinstance(line, GraphBegin)
        elif inside:
            names.update(line.defines())
    return names


def picks_on_tensors(source: str) -> list[str]:
    """Names the C++ source declares as `wrapgen::Tensor` and indexes with `.at(` (a tuple's pick)."""
    tensors = set(re.findall(r"wrapgen::Tensor t_(\w+)\b", source))
    return sorted(tensors & set(re.findall(r"\bt_(\w+)\.at\(", source)))


def assert_tuples_stay_with_their_picks(program: Program) -> None:
    """No tuple is a graph input, and each pick is on the same side of the graphs as its tuple."""
    assert tuple_inputs(program) == []
    inside = inside_graphs(program)
    for line in program.lines:
        if isinstance(line, MultiOutput):
            assert (line.name in inside) == (line.source in inside), line.format()


@pytest.fixture
def record_on_cpu(monkeypatch):
    """The python target's regions record and replay through a CPU stand-in for a CUDA graph
    (copied inputs go through `GraphRegion`'s static buffers, as on CUDA)."""
    from wrapgen.backends.python import graph_runtime

    class Recorded:
        def __init__(self, fn, statics, key):
            self.fn, self.statics, self.key = fn, statics, key
            self.outputs = tuple(fn(*statics, *key))

        def replay(self):
            for out, new in zip(self.outputs, self.fn(*self.statics, *self.key)):
                out.copy_(new)

    def capture(self, statics, key):
        graph = Recorded(self.fn, statics, key)
        return graph, graph.outputs

    monkeypatch.setattr(graph_runtime.GraphRegion, "_capture", capture)

    def recording(artifact) -> list:
        regions = [v for k, v in artifact.call.__globals__.items() if k.startswith("_graph_g")]
        for region in regions:
            region.capture, region.eager = True, False
        return regions

    return recording


# -- a lowered program: torch.sort's (values, indices) ----------------------------------------


def _sorted(x):
    values, indices = torch.sort(x.cos(), dim=-1)
    return values.sin() * 2, indices + 1


def _block_sort(line: ExternKernel) -> str | None:
    """Keeps sort out of the graphs, as `line_blocker` keeps attention out on CUDA."""
    return "kept out, as attention's tuple with off-device entries is on CUDA" if line.op.startswith("aten::sort") else None


def _sorted_program(blocked: bool) -> Program:
    program = optimize(wrapgen.lower(_sorted, (torch.randn(4, 8),)))
    return verify(partition_graphs(program, device_type="cpu", blocker=_block_sort if blocked else None))


def test_picks_of_a_tuple_made_outside_the_graphs_stay_outside():
    program = _sorted_program(blocked=True)
    assert_tuples_stay_with_their_picks(program)
    picks = [line for line in program.lines if isinstance(line, MultiOutput)]
    assert len(picks) == 2 and not {p.name for p in picks} & inside_graphs(program)
    # the picked tensors cross into the next graph instead of the tuple
    inputs = {n for line in program.lines if isinstance(line, GraphBegin) for n in line.inputs}
    assert {p.name for p in picks} <= inputs, str(program)


def test_a_capturable_tuple_stays_inside_with_its_picks():
    program = _sorted_program(blocked=False)
    assert_tuples_stay_with_their_picks(program)
    (sort,) = [line for line in program.lines if isinstance(line, ExternKernel) and line.op.startswith("aten::sort")]
    assert sort.name in inside_graphs(program)
    outputs = {n for line in program.lines if isinstance(line, GraphEnd) for n in line.outputs}
    assert sort.name not in outputs


@pytest.mark.parametrize("blocked", [True, False], ids=["tuple-outside", "tuple-inside"])
@pytest.mark.parametrize("target", TARGETS)
def test_targets_run_a_tuple_across_graphs(target, blocked, record_on_cpu):
    program = _sorted_program(blocked)
    artifact = get_backend(target)().compile(program)
    regions = record_on_cpu(artifact) if target == "python" else []
    for _ in range(4):  # warm-up, record, replays
        x = torch.randn(4, 8)
        torch.testing.assert_close(tuple(artifact.call([x.clone()])), _sorted(x))
    if target == "python":
        assert regions and all(r.records == 1 and r.replays >= 2 for r in regions), regions
    if target == "cpp":
        assert "wrapgen::graphs::Call wg_g0(" in artifact.source
        assert picks_on_tensors(artifact.source) == []


# -- a tuple whose picks a host line separates: the call is forced out, its picks with it --------


def _split_picks_program() -> Program:
    """sort, its values picked and reduced, a `.item()`, then its indices picked: the tuple
    would be an output of the first graph (it is not a tensor), so the pass keeps sort outside."""
    x = ty(4, 8)
    u0 = sympy.Symbol("u0", integer=True)
    ref = TensorRef
    lines = [
        AssertInput("x", torch.float32, CPU, x.sizes, x.strides),
        Allocate("buf0", ty(4, 8)),
        ExternKernel(None, "aten::cos.out", (ref("x"),), (("out", ref("buf0")),), writes=("buf0",)),
        ExternKernel("buf1", "aten::sort.default", (ref("buf0"),), result=(ty(4, 8, strided=False), ty(4, 8, dtype=torch.int64, strided=False))),
        MultiOutput("buf2", "buf1", (0,), ty(4, 8, strided=False)),
        Allocate("buf3", ty(4, 8)),
        ExternKernel(None, "aten::sin.out", (ref("buf2"),), (("out", ref("buf3")),), writes=("buf3",)),
        ExternKernel("buf4", "aten::argmax.default", (ref("buf3"),), result=ty(dtype=torch.int64)),
        BindSymbol(u0, "buf4", "item", None, OBSERVED, 0, None),
        MultiOutput("buf5", "buf1", (1,), ty(4, 8, dtype=torch.int64, strided=False)),
        Free("buf1"),
        Allocate("buf6", ty(4, 8, dtype=torch.int64)),
        ExternKernel(None, "aten::mul.out", (ref("buf5"), ref("buf5")), (("out", ref("buf6")),), writes=("buf6",)),
        Output((ref("buf3"), ref("buf6"), u0)),
    ]
    return Program("split_picks", (TensorInput("x", x),), (SymbolInfo(u0, 3, 0, None),), (), tuple(lines))


def _split_picks_eager(x: torch.Tensor) -> tuple:
    values, indices = torch.sort(x.cos())
    out = values.sin()
    return out, indices * indices, int(out.argmax())


@pytest.mark.parametrize("target", TARGETS)
def test_a_tuple_forced_out_of_a_graph_takes_its_picks_along(target, record_on_cpu):
    program = verify(partition_graphs(verify(_split_picks_program()), device_type="cpu"))
    assert_tuples_stay_with_their_picks(program)
    assert not {"buf1", "buf2", "buf5"} & inside_graphs(program), str(program)
    assert sum(isinstance(line, GraphBegin) for line in program.lines) >= 2
    artifact = get_backend(target)().compile(program)
    record_on_cpu(artifact) if target == "python" else None
    for _ in range(4):
        x = torch.randn(4, 8)
        got = tuple(artifact.call([x.clone()]))
        torch.testing.assert_close(got, _split_picks_eager(x))
    if target == "cpp":
        assert picks_on_tensors(artifact.source) == []


# -- attention on CUDA, as torch.compile lowers it on an H100 (pass and emitters only) -----------

# op: (its arguments after q, k, v; its results after the output, as lowering typed them on an
# H100 with torch 2.11: None for the SymInts and undefined tensors, which keep the call outside)
_ATTENTION = {
    "aten::_scaled_dot_product_cudnn_attention.default": (
        (None, False, 0.0, True), ("lse4", None, None, None, None, "seed", "offset", None)),
    "aten::_scaled_dot_product_flash_attention.default": (
        (0.0, True), ("lse", None, None, None, None, "seed2", "offset", "debug")),
    "aten::_scaled_dot_product_efficient_attention.default": ((None, False, 0.0, True), ("lse", "seed", "offset")),
}


def _attention_program(op: str) -> Program:
    """q, k, v made by a kernel, attention as a library call, a kernel on its output."""
    qkv = ty(1, 4, 8, 64, device=CUDA, dtype=torch.bfloat16)
    kinds = {
        "lse": ty(1, 4, 8, device=CUDA, strided=False),
        "lse4": ty(1, 4, 8, 1, device=CUDA, strided=False),
        "seed": ty(dtype=torch.int64, device=CUDA, strided=False),
        "seed2": ty(2, dtype=torch.uint64, device=CUDA, strided=False),
        "offset": ty(dtype=torch.int64, device=CUDA, strided=False),
        "debug": ty(0, device=CUDA, dtype=torch.bfloat16, strided=False),
        None: None,
    }
    args, results = _ATTENTION[op]
    result = (replace(qkv, strides=None), *(kinds[k] for k in results))
    ref = TensorRef
    lines = [
        AssertInput("x", torch.bfloat16, CUDA, qkv.sizes, qkv.strides),
        *(KernelDefinition(k, "triton", f"# {k}", (("arg_names", ("in_ptr0", "out_ptr0")),)) for k in ("k0", "k1")),
        Allocate("buf0", qkv),
        KernelCall("k0", (ref("x"), ref("buf0")), (sympy.Integer(1),), writes=("buf0",)),
        ExternKernel("buf1", op, (ref("buf0"), ref("buf0"), ref("buf0"), *args), result=result),
        MultiOutput("buf2", "buf1", (0,), replace(qkv, strides=None)),
        Free("buf1"),
        Allocate("buf3", qkv),
        KernelCall("k1", (ref("buf2"), ref("buf3")), (sympy.Integer(1),), writes=("buf3",)),
        Free("buf2"),
        Output((ref("buf3"),)),
    ]
    return Program("attention", (TensorInput("x", qkv),), (), (), tuple(lines))


@pytest.mark.parametrize("op", sorted(_ATTENTION))
def test_cuda_attention_tuple_is_never_a_graph_input(op):
    program = verify(partition_graphs(verify(_attention_program(op))))
    assert_tuples_stay_with_their_picks(program)
    begins = [line for line in program.lines if isinstance(line, GraphBegin)]
    python_source = get_backend("python")().emit(program)
    cpp_source = get_backend("cpp")().emit(program)
    assert picks_on_tensors(cpp_source) == []
    # the call and its pick are recorded together: the untyped entries of flash and cuDNN
    # attention's tuples (SymInts, undefined tensors) are never picked, so they keep nothing out
    assert [b.inputs for b in begins] == [("x",)] and {"buf1", "buf2"} <= inside_graphs(program), str(program)
    assert "wrapgen::Value t_buf1;" in cpp_source and "t_buf1.at({0})" in cpp_source
    assert "_graph_g0(" in python_source


def _tuple_as_input(program: Program) -> Program:
    """A graph that starts at the pick, listing the tuple it picks from as an input."""
    lines = list(program.lines)
    pick = next(i for i, line in enumerate(lines) if isinstance(line, MultiOutput))
    lines.insert(pick, GraphBegin("g1", CUDA, inputs=("buf1",)))
    output = next(i for i, line in enumerate(lines) if isinstance(line, Output))
    lines.insert(output, GraphEnd("g1", outputs=("buf3",)))
    return program.with_lines(lines)


def test_verifier_and_emitters_refuse_a_tuple_as_a_graph_input():
    broken = _tuple_as_input(_attention_program("aten::_scaled_dot_product_cudnn_attention.default"))
    with pytest.raises(VerificationError, match=r"lists buf1, a tuple result, as an input"):
        verify(broken)
    for target in ("python", "cpp"):
        with pytest.raises(UnsupportedLineError, match=r"graph g1 begin .*: input buf1 is a tuple result"):
            get_backend(target)().emit(broken)


# -- on a GPU: attention with a KV-cache update, through torch.compile with CUDA graphs ----------


class CachedAttention(torch.nn.Module):
    """One decoding step of attention over a static KV cache (transformers' StaticCache): the new
    key and value are written into buffers in place at `position`, then attention reads them."""

    def __init__(self, heads: int = 4, head_dim: int = 64, length: int = 16) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = torch.nn.Linear(heads * head_dim, 3 * heads * head_dim, bias=False)
        self.out = torch.nn.Linear(heads * head_dim, heads * head_dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, heads, length, head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, length, head_dim))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        self.k_cache.index_copy_(2, position, k)
        self.v_cache.index_copy_(2, position, v)
        attended = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        return self.out(attended.transpose(1, 2).reshape(batch, tokens, -1))


_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", sorted(_BACKENDS))
@pytest.mark.parametrize("target", ["python", "cpp"])
def test_cuda_attention_with_a_cache_update_in_graphs_matches_eager(target, backend, monkeypatch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import wrapgen.api

    torch.manual_seed(0)
    eager = CachedAttention().cuda().to(torch.bfloat16).eval()
    compiled_model = CachedAttention().cuda().to(torch.bfloat16).eval()
    compiled_model.load_state_dict(eager.state_dict())
    programs: list[Program] = []
    optimize_ = wrapgen.api.optimize

    def keep(program, *args, **kwargs):
        programs.append(optimize_(program, *args, **kwargs))
        return programs[-1]

    monkeypatch.setattr(wrapgen.api, "optimize", keep)
    step = torch.compile(compiled_model.forward, backend="wrapgen", options={"cuda_graphs": True, "target": target})
    with sdpa_kernel([getattr(SDPBackend, _BACKENDS[backend])]), torch.no_grad():
        x0 = torch.randn(1, 1, 256, device="cuda", dtype=torch.bfloat16)
        try:
            eager(x0, torch.tensor([0], device="cuda"))
        except RuntimeError as error:  # not built in, or not for this GPU
            pytest.skip(f"{backend} attention does not run here: {error}")
        eager.k_cache.zero_(), eager.v_cache.zero_()
        for position in range(6):  # warm-up, record, replays, the cache filling up
            x = torch.randn(1, 1, 256, device="cuda", dtype=torch.bfloat16)
            where = torch.tensor([position], device="cuda")
            torch.testing.assert_close(step(x, where), eager(x, where), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(compiled_model.k_cache, eager.k_cache)
    torch.testing.assert_close(compiled_model.v_cache, eager.v_cache)
    assert programs and any(isinstance(line, GraphBegin) for p in programs for line in p.lines)
    for program in programs:
        assert tuple_inputs(program) == [], str(program)
