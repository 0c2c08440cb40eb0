"""The scheduler on hand-made compute nodes: can_fuse, score_fusion, ordering, no duplicated reductions."""

from __future__ import annotations

from dataclasses import replace

import sympy
import torch

import wrapgen
from wrapgen.loop_ir import Apply, ComputeNode, Load, red_vars, row_vars
from wrapgen.lowering.scheduler import can_fuse, schedule, score_fusion, start_group
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition

F32 = torch.float32
x0, x1 = row_vars(2)
(r0,) = red_vars(1)


def pointwise(name: str, source: str, sizes=(4, 8)) -> ComputeNode:
    index = x0 * sizes[1] + x1 if len(sizes) == 2 else x0
    return ComputeNode(name, F32, tuple(sympy.Integer(s) for s in sizes), Apply("exp", (Load(source, index, F32),), F32), index)


def row_sum(name: str, source: str) -> ComputeNode:
    body = Load(source, 8 * x0 + r0, F32)
    return ComputeNode(name, F32, (sympy.Integer(4),), body, x0, "sum", (sympy.Integer(8),),
                       (sympy.Integer(4), sympy.Integer(8)), (x0, r0), torch.float64)


def test_pointwise_fuses_with_same_shape_only() -> None:
    group = start_group(pointwise("a", "in"))
    assert can_fuse(group, pointwise("b", "a")) is not None
    assert can_fuse(group, pointwise("c", "in", sizes=(32,))) is None


def test_reduction_takes_in_its_prologue_and_epilogue() -> None:
    group = start_group(pointwise("a", "in"))
    fused = can_fuse(group, row_sum("s", "a"))
    assert fused is not None
    group, member = fused
    assert member.level == "reduction" and group.members[0].level == "inner"
    epilogue = ComputeNode("e", F32, (sympy.Integer(4), sympy.Integer(8)),
                           Apply("div", (Load("a", 8 * x0 + x1, F32), Load("s", x0, F32)), F32), 8 * x0 + x1)
    fused = can_fuse(group, epilogue)
    assert fused is not None and fused[1].level == "inner"


def test_read_of_another_element_blocks_fusion() -> None:
    group = start_group(pointwise("a", "in"))
    shifted = ComputeNode("b", F32, (sympy.Integer(4), sympy.Integer(8)), Load("a", 8 * x0 + 7 - x1, F32), 8 * x0 + x1)
    assert can_fuse(group, shifted) is None


def test_score_prefers_the_producer() -> None:
    group = start_group(pointwise("a", "in"))
    assert score_fusion(group, pointwise("b", "a")) > score_fusion(group, pointwise("c", "other"))


def test_a_reader_in_between_keeps_groups_apart() -> None:
    a, b = pointwise("a", "in"), pointwise("b", "a")
    # An extern at position 1 reads `a`: fusing `b` (position 2) would move `a` past it.
    groups = schedule([a, b], {"a": 0, "b": 2}, {"a": [1, 2]})
    assert len(groups) == 2
    groups = schedule([a, b], {"a": 0, "b": 2}, {"a": [2]})
    assert len(groups) == 1


def test_layer_norm_reductions_are_computed_once() -> None:
    model = torch.nn.LayerNorm(16)
    program = wrapgen.lower(lambda x: (model(x), model(x).sum(-1)), (torch.randn(4, 16),))
    kernels = [line for line in program.lines if isinstance(line, KernelDefinition)]
    calls = [line for line in program.lines if isinstance(line, KernelCall)]
    reductions = sum(k.source.count("reduction(+:") for k in kernels)
    # two layer norms (mean, variance each) and one sum: five reduction loops, none repeated
    assert reductions == 5
    assert len(calls) <= 2


def _column_sums(g, x, g2, x2):
    return g.sum(0), (g * x).sum(0), g2.sum(0), (g2 * x2).sum(0)


def test_unrelated_reductions_share_a_kernel_on_the_cpu_only() -> None:
    """Triton kernels keep reductions that share no input apart (one kernel would run them one
    after another in each program); C++ kernels fuse them (one parallel loop)."""
    args = [torch.randn(64, 32) for _ in range(4)]
    calls = {}
    for language in ("cpp", "triton"):
        with wrapgen.config.patch(cpu_kernels=language):
            program = wrapgen.lower(_column_sums, args)
        calls[language] = [line for line in program.lines if isinstance(line, KernelCall)]
    assert len(calls["cpp"]) == 1
    assert len(calls["triton"]) == 2  # (g.sum, (g*x).sum) share g; likewise g2


def test_a_column_reduction_reads_whole_memory_sectors_per_row() -> None:
    """A reduction over the strided dimension takes COLUMN_XBLOCK neighbouring columns per
    program (32 bytes of float32 per row); a row reduction keeps its blocks."""
    from wrapgen.kernels.triton.launch_config import COLUMN_XBLOCK

    args = (torch.randn(2048, 768), torch.randn(2048, 768))
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(lambda g, x: (g.sum(0), x.sum(1)), args)
    blocks = [dict(dict(k.metadata)["constexprs"]) for k in program.lines if isinstance(k, KernelDefinition)]
    configs = sorted(blocks, key=lambda c: c["RBLOCK"])
    assert configs == [{"XBLOCK": 1, "RBLOCK": 1024}, {"XBLOCK": COLUMN_XBLOCK, "RBLOCK": 2048}]


def test_a_long_column_reduction_loops_over_its_rows() -> None:
    """8 columns of 4096 rows would hold 32768 values in registers: such a column reduction
    loops over its rows in blocks of 2048 instead (and matches eager, in Triton's interpreter)."""
    from wrapgen.kernels.triton.launch_config import COLUMN_XBLOCK, choose_config

    config = choose_config(sympy.Integer(768), sympy.Integer(4096), {}, column=True)
    assert (config.xblock, config.rblock, config.persistent) == (COLUMN_XBLOCK, 2048, False)
    g = torch.randn(4096, 24)
    with wrapgen.config.patch(cpu_kernels="triton"):
        compiled = wrapgen.compile(lambda t: t.sum(0), (g,), target="python")
    torch.testing.assert_close(compiled(g), g.sum(0))


def test_a_reduction_takes_in_a_producer_whose_store_index_keeps_a_size_one_dimension() -> None:
    """[1, 4, 8] stored at 32*x0 + 8*x1 + x2 and reduced over its last dimension by a read at
    8*x1 + r0: x0 only takes 0, so both name one element and the two fuse (a Llama-style
    model's residual sum and the RMS norm that reduces it)."""
    one, four, eight = sympy.Integer(1), sympy.Integer(4), sympy.Integer(8)
    x2 = row_vars(3)[2]
    add = ComputeNode("h", F32, (one, four, eight), Apply("exp", (Load("in", 8 * x1 + x2, F32),), F32),
                      32 * x0 + 8 * x1 + x2)
    total = ComputeNode("s", F32, (one, four), Load("h", 8 * x1 + r0, F32), 4 * x0 + x1, "sum", (eight,),
                        (one, four, eight), (x0, x1, r0), torch.float32)
    fused = can_fuse(start_group(add), total)
    assert fused is not None
    assert [m.level for m in fused[0].members] == ["inner", "reduction"]
    shifted = ComputeNode("t", F32, (one, four), Load("h", 8 * x1 + r0 + 1, F32), 4 * x0 + x1, "sum", (eight,),
                          (one, four, eight), (x0, x1, r0), torch.float32)
    assert can_fuse(start_group(add), shifted) is None  # another element: still apart


def test_a_checked_or_gathered_read_of_a_member_keeps_the_kernels_apart() -> None:
    """A load with an indirect part reads its buffer in memory (a scatter's index copied with
    a range check): its producer must be stored first, so the two do not fuse, even where the
    indices name one element (they did once size-1 dimensions stopped hiding that)."""
    from wrapgen.loop_ir import Indirect

    one, sixteen = sympy.Integer(1), sympy.Integer(16)
    index = ComputeNode("i", torch.int64, (sixteen, one), Load("in", x0, torch.int64), x0 + x1)
    entry = Load("i", x0, torch.int64)
    checked = Load("i", x0, torch.int64, (Indirect(sympy.Symbol("tmp0", integer=True), entry, sympy.Integer(64)),))
    copy = ComputeNode("c", torch.int64, (sixteen, one), checked, x0 + x1)
    assert can_fuse(start_group(index), copy) is None
    assert can_fuse(start_group(index), ComputeNode("d", torch.int64, (sixteen, one), entry, x0 + x1)) is not None


def test_independent_parts_of_a_pointwise_group_run_one_after_another() -> None:
    """cluster_members puts each independent part's members together (an optimizer step's write-backs
    no longer wait for every parameter's update) and keeps the order of members that share a
    produced value or written storage, a write into state and a later read of it included."""
    from wrapgen.lowering.scheduler import cluster_members

    nodes = [pointwise("a", "in1"), pointwise("b", "in2"), pointwise("c", "a"), pointwise("d", "b"),
             replace(pointwise("w", "c"), target="state"), pointwise("e", "in3"), pointwise("r", "state")]
    group = start_group(nodes[0])
    for node in nodes[1:]:
        fused = can_fuse(group, node)
        assert fused is not None
        group = fused[0]
    clustered = cluster_members(group)
    assert [m.node.name for m in clustered.members] == ["a", "c", "w", "r", "b", "d", "e"]
    assert clustered.parts == (4, 2, 1)
    assert cluster_members(start_group(nodes[0])).parts == ()


def _norm_kernels(program) -> list[set[str]]:
    """The ops of each kernel that computes a layer norm."""
    ops = [set(dict(line.metadata)["ops"].split(",")) for line in program.lines if isinstance(line, KernelDefinition)]
    return [o for o in ops if "layer_norm" in o]


def _norm_then_transposed_copy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    return y.permute(1, 0, 2).contiguous().view(-1, x.shape[-1]) @ w


def test_a_norm_read_by_a_row_permuted_copy_stores_its_rows_there(kernels) -> None:
    """A layer norm read only by a copy that moves its rows (batch-first tokens to sequence-first,
    as aot_autograd traces `nn.MultiheadAttention`) is one kernel: the norm stores each row where
    the copy puts it. Sizes that repeat ([8, 8, 16]) leave two candidate orders; the one whose
    reads match is taken. A copy that moves the innermost dimension stays a kernel of its own."""
    for shape in ((4, 6, 16), (8, 8, 16)):
        x, w = torch.randn(*shape), torch.randn(shape[-1], 12)
        program = wrapgen.lower(_norm_then_transposed_copy, (x, w))
        assert _norm_kernels(program) == [{"layer_norm", "aten::clone.default"}]
        compiled = wrapgen.compile(_norm_then_transposed_copy, (x, w), target="python")
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x, w), _norm_then_transposed_copy(x, w))

    def innermost_moved(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],)).transpose(1, 2).contiguous()

    x = torch.randn(4, 8, 8)
    program = wrapgen.lower(innermost_moved, (x,))
    assert _norm_kernels(program) == [{"layer_norm"}]
    torch.testing.assert_close(wrapgen.compile(innermost_moved, (x,), target="python")(x), innermost_moved(x))


def test_both_entry_points_lower_a_batch_first_attention_block_alike() -> None:
    """`nn.MultiheadAttention(batch_first=True)` traced by torch.export and by aot_autograd: the
    same kernels and library calls (aot_autograd's graph copies the normed tokens to sequence-first
    before the projection; export's folds the transpose into the product)."""
    from benchmarks.model_lowering import count
    from benchmarks.suite import run
    from wrapgen.dynamo import ensure_registered

    ensure_registered()
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    norm = torch.nn.LayerNorm(32)

    def block(x: torch.Tensor) -> torch.Tensor:
        y = norm(x)
        return x + attention(y, y, y, need_weights=False)[0]

    x = torch.randn(3, 7, 32)
    with torch.no_grad():
        with run.recorded_programs() as exported:
            compiled = wrapgen.compile(block, (x,), target="python")
        with run.recorded_programs() as traced:
            dynamo = torch.compile(block, backend="wrapgen", options={"target": "python"})
            dynamo(x)
        x = torch.randn(3, 7, 32)
        torch.testing.assert_close(compiled(x), block(x))
        torch.testing.assert_close(dynamo(x), block(x))
    ours, theirs = count(exported[0]), count(traced[0])
    assert (ours.kernels, ours.launches) == (theirs.kernels, theirs.launches)
