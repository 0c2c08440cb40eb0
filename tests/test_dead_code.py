"""Pure values nothing reads leave the graph before lowering (no kernel, no launch); writes,
random draws and collectives stay."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import wrapgen
from wrapgen.lowering.capture import capture
from wrapgen.lowering.graph_passes.dead_code import remove_dead_code
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition

aten = torch.ops.aten
torch.library.define("wrapgen_test_dead::side_effect", "(Tensor x) -> Tensor")  # unknown effects: kept


def with_an_unread_check(x: torch.Tensor) -> torch.Tensor:
    unread = (x.cumsum(0) != 1).sum()  # noqa: F841  (the packed-sequence check's shape)
    return x + 1


def with_an_unread_draw(x: torch.Tensor) -> torch.Tensor:
    torch.rand_like(x)  # advances the generator: eager's later draws depend on it
    return x * 2


def test_an_unread_value_makes_no_kernel():
    x = torch.randn(8)
    program = wrapgen.lower(make_fx(with_an_unread_check)(x), [x])
    kernels = [line for line in program.lines if isinstance(line, KernelDefinition)]
    assert len(kernels) == 1 and "cumsum" not in kernels[0].name
    assert len([line for line in program.lines if isinstance(line, KernelCall)]) == 1
    for target in ("python", "cpp"):
        compiled = wrapgen.compile(make_fx(with_an_unread_check)(x), [x], target=target)
        fresh = torch.randn(8)
        torch.testing.assert_close(compiled(fresh), with_an_unread_check(fresh))


def test_a_random_draw_and_a_write_stay():
    def writes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.add_(1)
        return x * 2

    for fn, args, kept in ((with_an_unread_draw, [torch.randn(8)], {aten.rand_like.default, aten.rand.default}),
                           (writes, [torch.randn(8), torch.randn(8)], {aten.add_.Tensor, aten.copy_.default})):
        captured = capture(make_fx(fn)(*args), args, False)
        after = remove_dead_code(captured).graph_module.graph
        targets = {n.target for n in after.nodes if n.op == "call_function"}
        assert targets & kept, (fn.__name__, targets)


def test_the_callers_graph_is_not_changed():
    x = torch.randn(8)
    gm = make_fx(with_an_unread_check)(x)
    captured = capture(gm, [x], False)
    before = str(captured.graph_module.graph)
    rewritten = remove_dead_code(captured)
    assert rewritten.graph_module is not captured.graph_module
    assert str(captured.graph_module.graph) == before
    assert not any(n.target == aten.cumsum.default for n in rewritten.graph_module.graph.nodes)


def test_only_core_aten_ops_are_removed():
    from wrapgen.lowering.graph_passes.dead_code import _impure

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pure = graph.call_function(aten.relu.default, (x,))
    custom = graph.call_function(torch.ops.wrapgen_test_dead.side_effect.default, (x,))
    python = graph.call_function(print, (x,))
    graph.output(x)
    assert not _impure(pure) and _impure(custom) and _impure(python)
