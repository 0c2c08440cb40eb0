"""In-place scatters into state (`index_copy_`, `index_put_`: a KV-cache update) are stored by
the generated kernel that computes the written values, at the positions the index tensor holds,
on every target; an index out of range raises and writes nothing; what a kernel cannot store
(accumulate) stays the library's scatter. Results and state equal eager's."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir import ExternKernel, KernelCall

TARGETS = ["python", "cpp", "fx", "interpret"]


class RotaryCache(torch.nn.Module):
    """A layer's cache write: keys rotated (a rotary embedding's arithmetic) and stored at the
    step's position, values stored as they come; attention then reads both caches."""

    def __init__(self, length: int = 16) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, length, 8))
        self.register_buffer("values", torch.zeros(1, 2, length, 8))

    def forward(self, q, k, v, cos, sin, position):
        half = k.shape[-1] // 2
        rotated = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        self.keys.index_copy_(2, position, k * cos + rotated * sin)
        self.values.index_copy_(2, position, v)
        return torch.nn.functional.scaled_dot_product_attention(q, self.keys, self.values)


def _step_inputs(step: int) -> tuple:
    g = torch.Generator().manual_seed(step)
    q, k, v = (torch.randn(1, 2, 1, 8, generator=g) for _ in range(3))
    cos, sin = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)
    return q, k, v, cos, sin, torch.tensor([step])


@pytest.mark.parametrize("target", TARGETS)
def test_cache_writes_equal_eager(target, kernels):
    torch._dynamo.reset()
    model, reference = RotaryCache(), RotaryCache()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    for step in range(5):
        inputs = _step_inputs(step)
        torch.testing.assert_close(compiled(*inputs), reference(*inputs))
        torch.testing.assert_close(model.keys, reference.keys)
        torch.testing.assert_close(model.values, reference.values)


def test_rotated_keys_are_stored_by_the_kernel_computing_them():
    """Both cache writes are one generated kernel that reads k, v and the tables (no buffer for
    the rotated keys, no library scatter)."""
    program = wrapgen.lower(RotaryCache(), _step_inputs(3))
    text = str(program)
    caches = {c.name for c in program.constants}  # the two cache buffers
    writers = [line for line in program.lines if caches & set(getattr(line, "writes", ()))]
    assert len(writers) == 1 and isinstance(writers[0], KernelCall), text
    assert set(writers[0].writes) == caches, text
    assert not any(isinstance(line, ExternKernel) and "index" in str(line) for line in program.lines), text


def _index_put(cache, index, values):
    cache[:, index] = values * 3
    return cache + 1


def _index_put_two_dims(cache, rows, cols, values):
    cache[rows, cols] = values.exp()
    return cache.sum(0)


@pytest.mark.parametrize("target", TARGETS)
def test_index_put_forms(target, kernels):
    """Negative indices count from the end, int32 indices, broadcast values, two indexed dims."""
    torch._dynamo.reset()
    cases = [
        (_index_put, lambda: (torch.randn(3, 10, 4), torch.tensor([-1, 2, -4]), torch.randn(3, 1, 4))),
        (_index_put, lambda: (torch.randn(3, 10, 4), torch.tensor([7, 0], dtype=torch.int32), torch.randn(4))),
        (_index_put_two_dims, lambda: (torch.randn(5, 6, 2), torch.tensor([[0], [4]]), torch.tensor([1, -2, 3]),
                                       torch.randn(2, 3, 2))),
    ]
    for fn, make in cases:
        compiled = torch.compile(fn, backend="wrapgen", options={"target": target}, dynamic=False)
        for _ in range(2):
            args = make()
            mine = [a.clone() for a in args]
            torch.testing.assert_close(compiled(*mine), fn(*args))
            torch.testing.assert_close(mine[0], args[0])


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_index_out_of_range_raises_and_writes_nothing(target):
    def fn(cache, index, values):
        cache.index_copy_(0, index, values + 1)
        return cache.sum()

    compiled = wrapgen.compile(fn, (torch.zeros(6, 4), torch.tensor([1]), torch.randn(1, 4)), target=target)
    cache = torch.zeros(6, 4)
    with pytest.raises(IndexError, match="out of range"):
        compiled(cache, torch.tensor([6]), torch.randn(1, 4))
    assert cache.eq(0).all()
    values = torch.randn(1, 4)
    torch.testing.assert_close(compiled(cache, torch.tensor([5]), values), (values + 1).sum())
    torch.testing.assert_close(cache[5], values[0] + 1)


def test_accumulating_index_put_stays_a_library_call():
    def fn(cache, index, values):
        cache.index_put_((index,), values * 2, accumulate=True)
        return cache * 1

    args = (torch.zeros(5, 3), torch.tensor([1, 1, 4]), torch.randn(3, 3))
    program = wrapgen.lower(fn, args)
    assert any(isinstance(line, ExternKernel) and "index_put" in str(line) for line in program.lines), str(program)
    compiled = wrapgen.compile(fn, args)
    mine = [a.clone() for a in args]
    torch.testing.assert_close(compiled(*mine), fn(*[a.clone() for a in args]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("target", ["python", "cpp"])
@pytest.mark.parametrize("graphs", [False, True])
def test_cache_writes_cuda(target, graphs):
    """Triton kernels store the rotated keys and the values into the caches, with and without
    CUDA graphs (the position is read on the device at each replay)."""
    torch._dynamo.reset()
    model, reference = RotaryCache().cuda(), RotaryCache().cuda()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target, "cuda_graphs": graphs})
    for step in range(5):
        inputs = tuple(t.cuda() for t in _step_inputs(step))
        torch.testing.assert_close(compiled(*inputs), reference(*inputs))
        torch.testing.assert_close(model.keys, reference.keys)
        torch.testing.assert_close(model.values, reference.values)
