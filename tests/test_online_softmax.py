"""The online `sum(exp(v - max(v)))`: softmax and log-sum-exp over rows too long for registers
read each row once for the max and the sum (wrapgen.kernels.online_softmax), in Triton kernels
(run here in Triton's interpreter), with eager's results, NaN and infinities included."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir.lines import KernelDefinition

WIDE = 9000  # above PERSISTENT_LIMIT: a looped reduction


def _kernels(fn, args) -> list[str]:
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(fn, args)
    return [line.source for line in program.lines if isinstance(line, KernelDefinition)]


def _compiled(fn, args, target: str):
    with wrapgen.config.patch(cpu_kernels="triton"):
        return wrapgen.compile(fn, args, target=target)


def _cross_entropy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(x, y)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


def _sum_of_exp(x: torch.Tensor) -> torch.Tensor:
    return (x - x.amax(-1, keepdim=True)).exp().sum(-1)


def test_cross_entropy_reads_the_logits_once_for_max_and_sum() -> None:
    """The log-sum-exp kernel has one loop over the vocabulary, not two."""
    args = (torch.randn(6, WIDE), torch.randint(0, WIDE, (6,)))
    sources = [s for s in _kernels(_cross_entropy, args) if "for roffset" in s]
    assert len(sources) == 1
    assert sources[0].count("for roffset") == 1


@pytest.mark.parametrize("target", ["python", "fx"])
@pytest.mark.parametrize("fn", [_cross_entropy, _softmax, _log_softmax], ids=["cross_entropy", "softmax", "log_softmax"])
def test_online_softmax_matches_eager(fn, target: str) -> None:
    x = torch.randn(5, WIDE) * 4
    args = (x, torch.randint(0, WIDE, (5,))) if fn is _cross_entropy else (x,)
    compiled = _compiled(fn, args, target)
    for _ in range(2):
        fresh = (torch.randn(5, WIDE) * 4,) + args[1:]
        torch.testing.assert_close(compiled(*fresh), fn(*fresh))


def test_softmax_takes_two_passes_instead_of_three() -> None:
    sources = [s for s in _kernels(_softmax, (torch.randn(3, WIDE),)) if "for roffset" in s]
    assert sum(s.count("for roffset") for s in sources) == 2


def test_infinities_and_nan_as_eager() -> None:
    """Rows of -inf values (a fully masked row: NaN), -inf before and after the finite values
    (masked positions), +inf and NaN."""
    x = torch.randn(6, WIDE)
    x[0] = float("-inf")
    x[1, : WIDE // 2] = float("-inf")
    x[2, WIDE // 2:] = float("-inf")
    x[3, 17] = float("inf")
    x[4, 4000] = float("nan")
    x[5, ::3] = float("-inf")
    for fn in (_softmax, _log_softmax):
        compiled = _compiled(fn, (x,), "python")
        torch.testing.assert_close(compiled(x), fn(x), equal_nan=True)
    lse = _compiled(lambda t: torch.logsumexp(t, -1), (x,), "python")
    torch.testing.assert_close(lse(x), torch.logsumexp(x, -1), equal_nan=True)
    denominator = _compiled(_sum_of_exp, (x,), "python")
    torch.testing.assert_close(denominator(x), _sum_of_exp(x), equal_nan=True)


def test_half_precision_softmax() -> None:
    x = torch.randn(4, WIDE, dtype=torch.bfloat16) * 3
    compiled = _compiled(_softmax, (x,), "python")
    fresh = torch.randn(4, WIDE, dtype=torch.bfloat16) * 3
    torch.testing.assert_close(compiled(fresh), _softmax(fresh))


def test_a_stored_difference_keeps_two_passes() -> None:
    """`v - max` stored as an output needs the final maximum: the passes stay apart."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shifted = x - x.amax(-1, keepdim=True)
        return shifted, shifted.exp().sum(-1)

    x = torch.randn(3, WIDE)
    sources = [s for s in _kernels(fn, (x,)) if "for roffset" in s]
    assert sum(s.count("for roffset") for s in sources) == 2
    compiled = _compiled(fn, (x,), "python")
    for got, want in zip(compiled(x), fn(x)):
        torch.testing.assert_close(got, want)


def test_a_sum_of_another_function_of_the_max_is_not_merged() -> None:
    """sum(exp(2v - max)) is not the online pattern (the exp is not of v - max(v))."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (2 * x - x.amax(-1, keepdim=True)).exp().sum(-1)

    x = torch.randn(3, WIDE)
    sources = [s for s in _kernels(fn, (x,)) if "for roffset" in s]
    assert sum(s.count("for roffset") for s in sources) == 2
    torch.testing.assert_close(_compiled(fn, (x,), "python")(x), fn(x))


def test_dynamic_width_softmax() -> None:
    """A reduced size known only at run time loops too (and merges)."""
    x = torch.randn(3, WIDE)
    with wrapgen.config.patch(cpu_kernels="triton"):
        program = wrapgen.lower(_softmax, (x,), dynamic=True)
        compiled = wrapgen.compile(_softmax, (x,), target="python", dynamic=True)
    sources = [line.source for line in program.lines if isinstance(line, KernelDefinition)]
    assert sum(s.count("for roffset") for s in sources) == 2
    for width in (WIDE, 700, 12000):
        fresh = torch.randn(2, width)
        torch.testing.assert_close(compiled(fresh), _softmax(fresh))


class _LanguageModelHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(WIDE, 16)
        self.head = torch.nn.Linear(16, WIDE, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(ids))
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_training_step_merges_the_forward_log_sum_exp(monkeypatch) -> None:
    """aot_autograd's log-softmax keeps a copy of the maximum between the passes (a row value):
    the passes merge around it, and the loss and gradients are eager's."""
    from wrapgen.dynamo import ensure_registered
    from wrapgen.kernels.triton import codegen

    ensure_registered()
    merged: list[dict[str, str]] = []
    original = codegen.merge_online_softmax

    def recording(items, stored):
        result = original(items, stored)
        merged.append(result[1])
        return result

    monkeypatch.setattr(codegen, "merge_online_softmax", recording)
    torch.manual_seed(0)
    model = _LanguageModelHead()
    ids = torch.randint(0, WIDE, (2, 12))
    with wrapgen.config.patch(cpu_kernels="triton"):
        compiled = torch.compile(model, backend="wrapgen", options={"target": "python"})
        loss = compiled(ids)
        loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(ids)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert any(merged)


ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("_", [pytest.param(None, marks=ON_CUDA)])
def test_online_softmax_on_cuda(target: str, dtype: torch.dtype, _) -> None:
    """Compiled Triton (not the interpreter): a vocabulary-wide cross-entropy and softmax with
    masked (-inf) positions and a fully masked row, against eager."""
    x = torch.randn(64, 50257, device="cuda", dtype=dtype) * 3
    y = torch.randint(0, 50257, (64,), device="cuda")
    x[1] = float("-inf")
    x[2, :25000] = float("-inf")
    for fn, args in ((_cross_entropy, (x[3:], y[3:])), (_softmax, (x,)), (_sum_of_exp, (x,))):
        compiled = wrapgen.compile(fn, args, target=target)
        torch.testing.assert_close(compiled(*args), fn(*args), equal_nan=True)
