"""Target "interpret": the Wrapper IR's reference semantics. Every end-to-end model runs through it
with the sanitizer on, in every memory-planning mode, static and dynamic, and agrees with eager."""

from __future__ import annotations

import pytest
import sympy
import torch
from test_end_to_end import MLP, ConvNet, CountingModule, MHABlock, SDPABlock
from torch.utils import _pytree as pytree

import wrapgen
from wrapgen import wrapper_ir
from wrapgen.backends import InterpretEmitter, registered_backends
from wrapgen.backends.emitter import method_name
from wrapgen.errors import InputMismatchError, UnsupportedLineError
from wrapgen.wrapper_ir import KernelDefinition, ReuseBuffer, WrapperLine

MODES = ["none", "reuse", "pooled"]

# name: (model, example shape, another shape for the dynamic program)
MODELS = {
    "mlp": (MLP, (4, 8), (3, 8)),
    "conv_bn_pool": (ConvNet, (2, 3, 8, 8), (3, 3, 8, 8)),
    "multihead_attention": (MHABlock, (2, 5, 16), (3, 7, 16)),
    "sdpa": (SDPABlock, (2, 5, 16), (3, 7, 16)),
}


def run_flat(artifact, inputs: list) -> list:
    with torch.no_grad():
        return list(artifact.call(list(inputs)))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", list(MODELS))
def test_models_interpreted_with_sanitizer_match_eager(case, dynamic):
    build, shape, other = MODELS[case]
    model = build().eval()
    with torch.no_grad():
        program = wrapgen.lower(model, (torch.randn(shape),), dynamic=dynamic)
    planned = set()
    for mode in MODES:
        with wrapgen.config.patch(memory_planning=mode, sanitize=True):
            artifact = wrapgen.build(program, "interpret")
        planned.add(artifact.source)
        for size in [shape, other] if dynamic else [shape]:
            x = torch.randn(size)
            with torch.no_grad():
                expected = pytree.tree_leaves(model(x))
            torch.testing.assert_close(run_flat(artifact, [x]), expected, rtol=1e-5, atol=1e-5)
    assert len(planned) == len(MODES), "each memory-planning mode gave its own program"


def test_inplace_buffer_update_interpreted():
    """Functionalized buffer mutations are written back into the module's buffers, as eager does."""
    eager, model = CountingModule(), CountingModule()
    with wrapgen.config.patch(target="interpret", sanitize=True, memory_planning="pooled"):
        compiled = wrapgen.compile(model, (torch.randn(2, 3),))
    model.load_state_dict(eager.state_dict())
    for _ in range(3):
        x = torch.randn(2, 3)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), eager(x))
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()))


def test_reuse_mode_reuses_in_the_interpreted_models():
    """The reuse plan is exercised (ReuseBuffer lines run under the sanitizer above)."""
    with torch.no_grad(), wrapgen.config.patch(memory_planning="reuse"):
        program = wrapgen.api.optimize(wrapgen.lower(MHABlock().eval(), (torch.randn(2, 5, 16),)))
    assert any(isinstance(line, ReuseBuffer) for line in program.lines)


def test_interpret_is_registered_and_handles_every_line_type():
    assert "interpret" in registered_backends()
    exported = [getattr(wrapper_ir, name) for name in wrapper_ir.__all__]
    line_types = [t for t in exported if isinstance(t, type) and issubclass(t, WrapperLine) and t is not WrapperLine]
    assert len(line_types) >= 17
    missing = [t.__name__ for t in line_types if not hasattr(InterpretEmitter, method_name(t))]
    assert missing == []


def test_dynamic_refusals_are_input_mismatches():
    """A size outside the program's range is the same InputMismatchError the python target raises
    (CompiledFunction serves sizes 0 and 1 from a specialized program after it)."""
    fn = lambda x: x.sin() * 2  # noqa: E731
    with wrapgen.config.patch(target="interpret"):
        compiled = wrapgen.compile(fn, (torch.randn(4, 3),), dynamic=True)
    s0 = next(s for s in compiled.program.symbols if str(s.symbol) == "s0")
    assert s0.min == 2
    with pytest.raises(InputMismatchError, match="s0 = 1 is outside"):
        compiled.artifact.call([torch.randn(1, 3)])
    torch.testing.assert_close(compiled(torch.randn(1, 3).fill_(1.0)), fn(torch.ones(1, 3)))
    with pytest.raises(InputMismatchError, match="expected dtype"):
        compiled(torch.randn(4, 3, dtype=torch.float64))


def test_unknown_kernel_language_is_refused_naming_the_line():
    program = wrapgen.lower(lambda x: x + 1, (torch.randn(2, 3),))
    bad = KernelDefinition("k_metal", "metal", "kernel void k() {}")
    program = program.with_lines((bad, *program.lines))
    with pytest.raises(UnsupportedLineError, match=r"line 1 \(kernel k_metal \[metal\]"):
        wrapgen.build(program, "interpret")


@pytest.mark.skipif(not hasattr(BaseException, "add_note"), reason="exception notes are Python 3.11+")
def test_errors_inside_a_line_name_it():
    """A library op failing at run time carries a note naming the line it ran."""
    with wrapgen.config.patch(kernels=False):
        program = wrapgen.lower(lambda x: torch.mm(x, x.t()), (torch.randn(2, 3),))
    line = next(i for i, c in enumerate(program.lines) if isinstance(c, wrapper_ir.ExternKernel))
    broken = wrapper_ir.ExternKernel(None, "aten::mm.out", (program.lines[line].args[0],) * 2,
                                     program.lines[line].kwargs, None, program.lines[line].writes)
    program = program.with_lines(program.lines[:line] + (broken,) + program.lines[line + 1 :])
    artifact = wrapgen.build(program, "interpret")
    with pytest.raises(RuntimeError) as caught:
        artifact.call([torch.randn(2, 3)])
    assert any(f"line {line + 1} (extern aten::mm.out" in note for note in caught.value.__notes__)


def test_symbolic_values_are_evaluated_like_python():
    """Size expressions (FloorDiv from solving `2*s0`) evaluate to ints in the interpreter."""
    def cat_with_doubled(x, y):
        return torch.cat([x, x]) + y, y[::2] - x

    with wrapgen.config.patch(target="interpret", sanitize=True):
        compiled = wrapgen.compile(cat_with_doubled, (torch.randn(5, 4), torch.randn(10, 4)), dynamic=True)
    assert any(isinstance(s.symbol, sympy.Symbol) for s in compiled.program.symbols)
    x, y = torch.randn(6, 4), torch.randn(12, 4)
    torch.testing.assert_close(compiled(x, y), cat_with_doubled(x, y))
    with pytest.raises(InputMismatchError):
        compiled(torch.randn(3, 4), torch.randn(7, 4))
