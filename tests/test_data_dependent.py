"""Values read from tensor data (`.item()`, `.tolist()`): bound at run time as unbacked symbols
(`bind u0 = buf.item()`), the sizes they drive bound from the results, on every target."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.errors import InputMismatchError

TARGETS = ["python", "fx", "cpp"]


def count_positive_prefix(x):
    n = (x > 0).sum().item()
    return x[:n] * 2


def split_at_tensor(x, idx):
    return torch.tensor_split(x, idx)


def scale_by_max(x):
    return x * x.max().item()


def rows_between(x, idx):
    a, b = idx.tolist()
    return x[a:b].sum(0)


def checked_count(x):
    n = x.argmax().item()
    torch._check(n >= 1)
    torch._check(n < 100)
    return x.new_zeros(n) + 1


def _inputs(fn, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    if fn is split_at_tensor:
        a = int(torch.randint(0, 5, (), generator=g))
        return torch.randn(10 + seed, generator=g), torch.tensor([a, a + 3])
    if fn is rows_between:
        a = int(torch.randint(0, 4, (), generator=g))
        return torch.randn(9 + seed, 3, generator=g), torch.tensor([a, a + 2 + seed])
    if fn is checked_count:
        x = torch.randn(8 + seed, generator=g)
        x[0] = -100.0  # argmax >= 1, as the program checks
        return (x,)
    return (torch.randn(8 + seed, generator=g),)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [count_positive_prefix, split_at_tensor, scale_by_max, rows_between, checked_count])
def test_item_driven_programs_match_eager(fn, target, dynamic):
    compiled = wrapgen.compile(fn, _inputs(fn, 0), target=target, dynamic=dynamic)
    # a static program keeps the input shapes: fresh data of the same shapes; a dynamic one also new sizes
    for seed in (1, 2, 3):
        inputs = _inputs(fn, seed if dynamic else 0)
        if not dynamic:
            inputs = tuple(torch.randn_like(t) if t.is_floating_point() else t for t in inputs)
            if fn is checked_count:
                inputs[0][0] = -100.0
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def test_item_is_a_bind_line_with_the_range_torch_proved():
    text = str(wrapgen.lower(checked_count, _inputs(checked_count, 0)))
    assert ".item()  in [1, 99]" in text, text
    text = str(wrapgen.lower(count_positive_prefix, _inputs(count_positive_prefix, 0)))
    assert ".item()  in [-inf, inf]" in text, text
    # the slice's size is not known until the slice ran: bound from its result
    assert ".size(0)  in [0, 8]" in text, text


@pytest.mark.parametrize("target", TARGETS)
def test_item_outside_its_checked_range_raises(target):
    compiled = wrapgen.compile(checked_count, _inputs(checked_count, 0), target=target)
    x = torch.randn(8)
    x[0] = 100.0  # argmax 0, which torch._check(n >= 1) excludes
    with pytest.raises((InputMismatchError, RuntimeError), match="u0|Runtime assertion"):
        compiled(x)


@pytest.mark.parametrize("target", ["python", "fx"])
def test_item_with_triton_kernels(target):
    def fn(x):
        n = (x > 0).sum().item()
        return (x[:n] * 2).relu() + 1

    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):
        compiled = wrapgen.compile(fn, (torch.randn(16),), target=target)
    for _ in range(3):
        x = torch.randn(16)
        torch.testing.assert_close(compiled(x), fn(x))
