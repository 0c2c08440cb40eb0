"""Dynamic programs serve sizes 0 and 1 (issue 17, item 1).

torch.export proves a dynamic graph only for sizes >= 2; `wrapgen.compile(..., dynamic=True)`
serves a call with a dynamic size of 0 or 1 through a program traced at that call's sizes
(wrapgen/specialize.py). Every check compares with eager on fresh random inputs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.errors import InputMismatchError
from wrapgen.specialize import SizeSpecializations

TARGETS = ["python", "fx", "cpp"]


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


class FeatureReduction(torch.nn.Module):
    """Row reductions over the feature dim (layer norm, softmax, sum, amax)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        y = self.norm(x)
        return torch.softmax(y, -1) * y.sum(-1, keepdim=True), y.amax(-1)


class BroadcastView(torch.nn.Module):
    """A broadcast against a [1, N] parameter, views whose sizes depend on the batch, a batch sum."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, 8))

    def forward(self, x):
        y = (x + self.bias).reshape(x.shape[0], 2, 4)
        return y.amax(-1).flatten() * 2, y.view(-1, 4).sum(0)


MODELS = {"mlp": Mlp, "feature_reduction": FeatureReduction, "broadcast_view": BroadcastView}


def check(model, compiled, *shapes, **tolerances) -> None:
    for shape in shapes:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(compiled(x), expected, **tolerances)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(MODELS))
def test_dynamic_program_serves_batch_0_and_1(case: str, target: str) -> None:
    model = MODELS[case]().eval()
    compiled = wrapgen.compile(model, (torch.randn(4, 8),), target=target, dynamic=True)
    check(model, compiled, (1, 8), (0, 8), (4, 8), (7, 8), (1, 8), rtol=1e-4, atol=1e-5)
    assert compiled.program.symbols[0].min == 2, "the dynamic program keeps the range torch proved"
    patterns = compiled.specializations.compiled()
    assert set(patterns) == {((1, None),), ((0, None),)}, patterns
    assert all(fn.target == target for fn in patterns.values())


def test_specialized_program_is_compiled_once_and_static_in_the_0_1_dim() -> None:
    model = Mlp().eval()
    compiled = wrapgen.compile(model, (torch.randn(4, 8),), dynamic=True)
    primary, sizes_seen = compiled._call, []
    compiled._call = lambda flat: sizes_seen.append(flat[0].shape[0]) or primary(flat)
    check(model, compiled, (1, 8), (5, 8), (1, 8))
    assert sizes_seen == [1, 5], "the second batch-1 call goes straight to its own program"
    (specialized,) = compiled.specializations.compiled().values()
    assert specialized.program.inputs[0].type.sizes == (1, 8), str(specialized.program)
    assert not specialized.program.symbols
    with pytest.raises(InputMismatchError, match=r"size symbol s0 = 1 is outside \[2, inf\]"):
        compiled.artifact.call([torch.randn(1, 8)])  # the dynamic program itself still refuses 1


class SizeBranch(torch.nn.Module):
    """Decisions a graph traced at batch 4 gets wrong at batch 1: torch.export's [2, inf] is why."""

    def forward(self, x):
        scale = 2.0 if x.shape[0] == 1 else 3.0  # Python control flow on the size
        return x.squeeze(0) * scale  # squeeze drops dim 0 only where it is 1


def test_batch_1_is_traced_at_batch_1() -> None:
    model = SizeBranch()
    compiled = wrapgen.compile(model, (torch.randn(4, 3),), dynamic=True)
    check(model, compiled, (4, 3), (1, 3), (6, 3))
    x = torch.randn(1, 3)
    assert compiled(x).shape == (3,)
    torch.testing.assert_close(compiled(x), x[0] * 2)


def test_example_of_batch_1_serves_other_batches() -> None:
    """The example's own 0/1 sizes are static in the first program; other sizes get a dynamic one."""
    model = BroadcastView()
    compiled = wrapgen.compile(model, (torch.randn(1, 8),), dynamic=True)
    assert compiled.program.inputs[0].type.sizes == (1, 8)
    check(model, compiled, (1, 8), (4, 8), (9, 8), (0, 8))
    (dynamic,) = [fn for fn in compiled.specializations.compiled().values() if fn.program.symbols]
    assert dynamic.program.symbols[0].min == 2


def seq_model(x):  # [batch, time, features]
    return x.mean(1) + x[:, -1], torch.relu(x).sum(-1)


def test_every_dynamic_dim_may_be_1() -> None:
    compiled = wrapgen.compile(seq_model, (torch.randn(4, 5, 8),), dynamic=True)
    check(seq_model, compiled, (1, 5, 8), (4, 1, 8), (1, 1, 8), (6, 7, 8), (3, 1, 8))
    assert set(compiled.specializations.compiled()) == {((1, None, None),), ((None, 1, None),), ((1, 1, None),)}


def test_inputs_that_differ_in_more_than_0_1_sizes_are_refused_clearly() -> None:
    compiled = wrapgen.compile(Mlp().eval(), (torch.randn(4, 8),), dynamic=True)
    with pytest.raises(InputMismatchError, match=r"input x: expected shape \(s0, 8\), got \(1, 5\)"):
        compiled(torch.randn(1, 5))
    with pytest.raises(InputMismatchError, match="input x: expected dtype torch.float32, got torch.float64"):
        compiled(torch.randn(1, 8, dtype=torch.float64))
    with pytest.raises(InputMismatchError, match=r"input x: expected shape \(4, 8\), got \(4, 9\)"):
        compiled(torch.randn(4, 9))  # the dynamic program's own refusal
    assert not compiled.specializations.compiled(), "nothing was compiled for refused inputs"

    scaled = wrapgen.compile(lambda x, k: x * k, (torch.randn(4, 3), 2), dynamic=True)
    with pytest.raises(InputMismatchError, match="input args_1: the program was compiled for the value 2, got 3"):
        scaled(torch.randn(1, 3), 3)  # a traced number stays fixed at every size


def test_a_size_eager_refuses_is_an_input_mismatch() -> None:
    def batch_max(x):  # eager: amax over an empty dim is an error
        return x.amax(0)

    compiled = wrapgen.compile(batch_max, (torch.randn(4, 3),), dynamic=True)
    for _ in range(2):  # the failed trace is remembered: same error, no second trace
        with pytest.raises(
            InputMismatchError, match=r"size symbol s0 = 0 .*args_0\.size\(0\) = 0 could not be compiled"
        ):
            compiled(torch.randn(0, 3))
    check(batch_max, compiled, (1, 3), (5, 3))


def test_static_program_still_refuses_batch_1() -> None:
    compiled = wrapgen.compile(Mlp().eval(), (torch.randn(4, 8),))
    assert compiled.specializations is None
    with pytest.raises(InputMismatchError, match=r"expected shape \(4, 8\), got \(1, 8\)"):
        compiled(torch.randn(1, 8))


def test_least_recently_used_pattern_is_dropped_beyond_the_limit() -> None:
    program = wrapgen.lower(seq_model, (torch.randn(4, 5, 8),), dynamic=True)
    built: list[tuple[int, ...]] = []

    def build(args: tuple):
        built.append(tuple(args[0].shape))
        return lambda *a: None

    cache = SizeSpecializations(program, build, limit=2)
    refusal = InputMismatchError("refused")
    for shape in [(1, 5, 8), (4, 1, 8), (1, 6, 8), (1, 1, 8), (1, 5, 8)]:
        x = torch.randn(shape)
        cache.serve((x,), [x], refusal)
    # (1, 6, 8) reuses (1, 5, 8)'s program and makes it the most recent: (4, 1, 8)'s is dropped.
    assert built == [(1, 5, 8), (4, 1, 8), (1, 1, 8)]
    assert set(cache.compiled()) == {((1, None, None),), ((1, 1, None),)}
    x = torch.randn(4, 1, 8)
    cache.serve((x,), [x], refusal)  # dropped: compiled again
    assert built[-1] == (4, 1, 8)
    with pytest.raises(InputMismatchError, match="refused"):  # its own sizes: the program's refusal stands
        cache.serve((torch.randn(4, 5, 8),), [torch.randn(4, 5, 8)], refusal)


@pytest.mark.parametrize("target", TARGETS)
def test_torch_compile_dynamic_serves_batch_0_and_1(target: str) -> None:
    """dynamo specializes 0/1 itself and recompiles; the wrapgen backend compiles each graph."""
    model = FeatureReduction().eval()
    compiled = torch.compile(model, backend="wrapgen", dynamic=True, options={"target": target})
    check(model, compiled, (4, 8), (1, 8), (0, 8), (7, 8), (1, 8), rtol=1e-4, atol=1e-5)
