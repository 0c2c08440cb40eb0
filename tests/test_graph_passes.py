"""The graph passes (wrapgen/lowering/graph_passes/): ordered lists run by one loop, each pass's
options read when the graph is compiled, and with `debug_dir` the graph dumped after each pass
that changed it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.lowering.graph_passes import ATEN_PASSES, TRACED_PASSES, GraphPass, run_passes


def test_the_passes_in_order():
    assert [(p.name, p.options) for p in ATEN_PASSES] == [
        ("input_layouts", ()),
        ("common_subexpressions", ()),
        ("cpu_scalars", ("kernels",)),
        ("conv_layout", ("layout_optimization",)),
        ("broadcast_bmm", ()),
        ("accumulate_into_add", ()),
        ("constant_masks", ("constant_masks",)),
        ("attention_broadcast", ()),
        ("transposed_operands", ()),
        ("product_weights", ("kernels",)),
        ("addmm_bias", ("kernels", "bias_in_kernels")),
        ("conv_bias", ("kernels", "bias_in_kernels")),
        ("reinplace", ("kernels",)),
        ("inplace_ops", ("kernels",)),
        ("state_write_order", ("kernels",)),
        ("attention_masks", ("kernels",)),
        ("input_free", ()),
        ("dead_code", ()),
    ]
    assert [(p.name, p.options) for p in TRACED_PASSES] == [("traced_masks", ("constant_masks",)),
                                                            ("traced_attention_broadcast", ()),
                                                            ("traced_attention_masks", ())]


def test_a_pass_runs_only_with_all_its_options_on():
    ran: list[str] = []
    passes = [GraphPass(name, options, lambda g, name=name: ran.append(name) or g)
              for name, options in (("always", ()), ("kernels", ("kernels",)), ("both", ("kernels", "cuda_graphs")))]
    with wrapgen.config.patch(kernels=True, cuda_graphs=False, debug_dir=None):
        assert run_passes(passes, "graph", "test") == "graph"
    assert ran == ["always", "kernels"]
    ran.clear()
    with wrapgen.config.patch(kernels=False, cuda_graphs=True, debug_dir=None):
        run_passes(passes, "graph", "test")
    assert ran == ["always"]


class MaskedProduct(torch.nn.Module):
    """A bmm against one weight broadcast over the batch (broadcast_bmm makes it one mm) and
    attention under a causal mask built from aranges (constant_masks makes it is_causal)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(96, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.bmm(x, self.weight.expand(x.shape[0], *self.weight.shape)).relu()[:, None]
        rows = torch.arange(q.shape[-2])[:, None]
        cols = torch.arange(q.shape[-2])[None, :]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=cols <= rows)


def _dumps(root) -> dict[str, dict[str, str]]:
    """{graph folder: {file: text}} under <debug_dir>/graph_passes."""
    return {folder.name: {f.name: f.read_text() for f in sorted(folder.iterdir())}
            for folder in sorted((root / "graph_passes").iterdir())}


def test_debug_dir_holds_the_graph_after_each_pass_that_changed_it(tmp_path):
    model, x = MaskedProduct(), torch.randn(2, 16, 96)
    with wrapgen.config.patch(debug_dir=str(tmp_path)), torch.no_grad():
        wrapgen.lower(model, (x,))
    (folder, files), = _dumps(tmp_path).items()
    assert folder.endswith("_forward")
    # the mask's two equal aranges become one, the bmm an mm, the causal mask is_causal
    assert list(files) == ["00-input.txt", "02-common_subexpressions.txt", "05-broadcast_bmm.txt", "07-constant_masks.txt"]
    given, _, folded, unmasked = files.values()
    assert "torch.ops.aten.bmm.default" in given and "torch.ops.aten.bmm.default" not in folded
    assert "torch.ops.aten.mm.default" in folded
    assert folded.startswith("# after pass 5, broadcast_bmm (always on)\n")
    assert "arange" in folded and "arange" not in unmasked and "is_causal = True" in unmasked
    assert unmasked.startswith("# after pass 7, constant_masks (constant_masks)\n")
    assert "f32[2, 16, 8][128, 8, 1]cpu" in folded  # sizes, strides and device


def test_options_are_read_when_the_graph_is_compiled(tmp_path):
    model, x = MaskedProduct(), torch.randn(2, 16, 96)
    with wrapgen.config.patch(debug_dir=str(tmp_path), constant_masks=False), torch.no_grad():
        wrapgen.lower(model, (x,))
    (files,) = _dumps(tmp_path).values()
    # the mask stays, made additive, and computed once at compile time (it reads no input)
    assert list(files) == ["00-input.txt", "02-common_subexpressions.txt", "05-broadcast_bmm.txt", "16-attention_masks.txt",
                           "17-input_free.txt"]
    assert "scaled_dot_product" in files["17-input_free.txt"] and "arange" not in files["17-input_free.txt"]


def test_no_dump_without_debug_dir_or_without_a_change(tmp_path):
    x = torch.randn(4, 4)
    with wrapgen.config.patch(debug_dir=str(tmp_path)):
        wrapgen.lower(lambda a: a.relu() + 1, (x,))  # no pass changes it
    assert not (tmp_path / "graph_passes").exists()
    with wrapgen.config.patch(debug_dir=None), torch.no_grad():
        wrapgen.lower(MaskedProduct(), (torch.randn(2, 16, 96),))
    assert not (tmp_path / "graph_passes").exists()


def test_torch_compile_dumps_dynamos_graph_too(tmp_path):
    def causal(q: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(q.shape[-2])[:, None]
        cols = torch.arange(q.shape[-2])[None, :]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=cols <= rows)

    torch._dynamo.reset()
    q = torch.randn(2, 3, 8, 4)
    compiled = torch.compile(causal, backend="wrapgen", dynamic=False,
                             options={"debug_dir": str(tmp_path), "kernels": False})
    torch.testing.assert_close(compiled(q), causal(q))
    dumps = _dumps(tmp_path)
    (traced,) = [files for folder, files in dumps.items() if folder.endswith("_dynamo")]
    assert list(traced) == ["00-input.txt", "01-traced_masks.txt"]
    assert "is_causal = True" in traced["01-traced_masks.txt"]


def test_repeated_pure_calls_are_computed_once():
    """Two layers converting one mask the same way: one kernel does it; a mutation between two
    equal calls keeps both (they read different versions)."""
    def layers(x, mask):
        out = x
        for _ in range(2):
            out = out + torch.where(mask, 0.0, float("-inf")).exp()
        return out

    from wrapgen.lowering.capture import capture
    from wrapgen.lowering.graph_passes.common_subexpressions import eliminate_common_subexpressions

    x, mask = torch.randn(4, 8), torch.rand(4, 8) > 0.5
    captured = capture(layers, (x, mask), dynamic=False)
    merged = eliminate_common_subexpressions(captured)

    def count(c, op):
        return sum(n.target is op for n in c.graph_module.graph.nodes)

    assert count(captured, torch.ops.aten.exp.default) == 2 and count(merged, torch.ops.aten.exp.default) == 1
    compiled = wrapgen.compile(layers, (x, mask))
    torch.testing.assert_close(compiled(x, mask), layers(x, mask))

    from torch.fx.experimental.proxy_tensor import make_fx

    from wrapgen.lowering.capture import capture_aten_graph

    def mutated(x, y):
        a = x * 2
        x.copy_(y)
        return a + x * 2

    gm = make_fx(mutated, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    later = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor][1]
    later.args = (gm.graph.find_nodes(op="placeholder")[0], 2)  # x itself, read after its copy_
    gm.recompile()
    kept = eliminate_common_subexpressions(capture_aten_graph(gm))
    assert count(kept, torch.ops.aten.mul.Tensor) == 2  # equal calls on either side of a write


def test_random_calls_and_returned_results_are_not_merged():
    """Two random draws stay two, two returned clones stay two tensors, and equal pure calls
    elsewhere in the same graph still merge."""
    from wrapgen.lowering.capture import capture
    from wrapgen.lowering.graph_passes.common_subexpressions import eliminate_common_subexpressions

    def draws(x):
        signed = (x * 0.0).sum() + (x * -0.0).sum()  # equal floats, different products
        return x.clone(), x.clone(), torch.rand_like(x) + torch.rand_like(x), (x * 3).sum() + (x * 3).sum() + signed

    captured = capture(draws, (torch.randn(4, 8),), dynamic=False)
    merged = eliminate_common_subexpressions(captured)

    def count(c, test):
        return sum(1 for n in c.graph_module.graph.nodes if n.op == "call_function" and test(n.target))

    def seeded(t):
        return isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags

    assert count(captured, seeded) == count(merged, seeded) == 2
    assert count(merged, lambda t: t is torch.ops.aten.clone.default) == 2
    assert count(captured, lambda t: t is torch.ops.aten.mul.Tensor) == 4
    assert count(merged, lambda t: t is torch.ops.aten.mul.Tensor) == 3  # x * 3 once, x * 0.0 and x * -0.0
    x = torch.randn(4, 8)
    a, b, noise, total = wrapgen.compile(draws, (x,))(x)
    assert a.data_ptr() != b.data_ptr() and not torch.equal(noise, 2 * noise[0, 0].expand_as(noise))
    torch.testing.assert_close(total, (x * 3).sum() * 2 + (x * 0.0).sum() + (x * -0.0).sum())


def test_a_first_compile_does_not_import_inductors_lowering():
    """The elimination is wrapgen's own: aot_autograd's imports Inductor's pattern matcher and
    lowering (1.6 s of a process's first compile on the 2-core VM)."""
    import subprocess
    import sys

    code = ("import sys, torch, wrapgen\n"
            "f = lambda x: (x * 2).exp() + (x * 2).exp()\n"
            "x = torch.randn(8)\n"
            "torch.testing.assert_close(wrapgen.compile(f, (x,))(x), f(x))\n"
            "print(sorted(m for m in ('torch._inductor.pattern_matcher', 'torch._inductor.lowering') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
