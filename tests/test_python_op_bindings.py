"""The python target calls library ops through torch's Python bindings where one takes exactly the
op's arguments (wrapgen/backends/python/runtime.py): each binding must compute what the op does,
for the arguments the generated code passes (schema order, keyword names)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.backends.python.runtime import _BOUND_OPS, _PYTHON_BINDINGS, op_callable
from wrapgen.backends.runtime import resolve_op


def test_every_binding_is_the_op_of_that_name():
    assert _PYTHON_BINDINGS, "no bindings found"
    for qualified, binding in _PYTHON_BINDINGS.items():
        name = qualified.removeprefix("aten::").split(".")[0]
        assert name in _BOUND_OPS
        assert binding.__name__ == name, qualified
        assert op_callable(qualified) is binding


def test_an_op_without_a_binding_calls_the_dispatcher_entry():
    assert op_callable("aten::add.Tensor") is torch.ops.aten.add.Tensor._op


def _cases() -> list[tuple[str, tuple, dict]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    q, k, v = r(2, 3, 8, 16), r(2, 3, 8, 16), r(2, 3, 8, 16)
    return [
        ("aten::convolution.default", (r(2, 4, 9, 9), r(6, 2, 3, 3), r(6), [2, 1], [1, 0], [1, 1], False, [0, 0], 2), {}),
        ("aten::convolution.default", (r(2, 4, 5, 5), r(4, 3, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1), {}),
        ("aten::cat.default", ([r(2, 3), r(4, 3)], 0), {}),
        ("aten::cat.out", ([r(2, 3), r(2, 1)], 1), {"out": torch.empty(2, 4)}),
        ("aten::embedding.default", (r(10, 4), torch.tensor([[1, 9], [0, 3]]), -1, False, False), {}),
        ("aten::native_layer_norm.default", (r(3, 5), [5], r(5), r(5), 1e-5), {}),
        ("aten::_native_batch_norm_legit_no_training.default",
         (r(2, 3, 4, 4), r(3), r(3), r(3), r(3).abs() + 0.5, 0.1, 1e-5), {}),
        ("aten::_softmax.default", (r(3, 7), 1, False), {}),
        ("aten::_softmax.out", (r(3, 7), 0, False), {"out": torch.empty(3, 7)}),
        ("aten::_log_softmax.default", (r(3, 7), 1, False), {}),
        ("aten::_log_softmax.out", (r(3, 7), 0, False), {"out": torch.empty(3, 7)}),
        ("aten::max_pool2d_with_indices.default", (r(1, 2, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], False), {}),
        ("aten::mm.default", (r(3, 4), r(4, 5)), {}),
        ("aten::mm.out", (r(3, 4), r(4, 5)), {"out": torch.empty(3, 5)}),
        ("aten::bmm.default", (r(2, 3, 4), r(2, 4, 5)), {}),
        ("aten::bmm.out", (r(2, 3, 4), r(2, 4, 5)), {"out": torch.empty(2, 3, 5)}),
        ("aten::addmm.default", (r(5), r(3, 4), r(4, 5)), {"beta": 2.0, "alpha": 1.0}),
        ("aten::addmm.out", (r(5), r(3, 4), r(4, 5)), {"beta": 1.0, "alpha": 0.5, "out": torch.empty(3, 5)}),
        ("aten::baddbmm.default", (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {"beta": 0.5, "alpha": 2.0}),
        ("aten::baddbmm.out", (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {"beta": 1.0, "alpha": 1.0,
                                                                        "out": torch.empty(2, 3, 5)}),
        ("aten::scaled_dot_product_attention.default", (q, k, v, None, 0.0, True), {"scale": 0.3}),
        ("aten::_scaled_dot_product_flash_attention_for_cpu.default", (q, k, v, 0.0, True), {"scale": None}),
    ]


# Attention kernels that run on CUDA only: the CUDA test below covers them.
_CUDA_ONLY = frozenset({
    "aten::_scaled_dot_product_flash_attention.default",
    "aten::_scaled_dot_product_efficient_attention.default",
    "aten::_scaled_dot_product_cudnn_attention.default",
})


def test_every_binding_has_a_case():
    covered = {qualified for qualified, _, _ in _cases()} | _CUDA_ONLY
    assert set(_PYTHON_BINDINGS) <= covered, sorted(set(_PYTHON_BINDINGS) - covered)


@pytest.mark.parametrize("qualified, args, kwargs", _cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_binding_computes_what_the_op_computes(qualified: str, args: tuple, kwargs: dict):
    binding = op_callable(qualified)
    assert binding is _PYTHON_BINDINGS[qualified]
    expected_kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    expected = resolve_op(qualified)(*args, **expected_kwargs)
    actual = binding(*args, **kwargs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    if "out" in kwargs:
        torch.testing.assert_close(kwargs["out"], expected_kwargs["out"], rtol=0, atol=0)


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.head(y.mean((2, 3))).softmax(-1)


def test_python_target_with_bound_convolutions_matches_eager():
    model = _ConvNet().eval()
    compiled = wrapgen.compile(model, (torch.randn(2, 3, 16, 16),), target="python")
    assert "aten::convolution" in compiled.source
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 16, 16)
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qualified", sorted(_CUDA_ONLY))
def test_cuda_attention_binding_computes_what_the_op_computes(qualified: str):
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    name = qualified.removeprefix("aten::").split(".")[0]
    args: tuple = {
        "_scaled_dot_product_flash_attention": (q, k, v, 0.0, True, False),
        "_scaled_dot_product_efficient_attention": (q, k, v, None, False, 0.0, True),
        "_scaled_dot_product_cudnn_attention": (q, k, v, None, False, 0.0, True, False),
    }[name]
    try:
        expected = resolve_op(qualified)(*args)
    except RuntimeError as error:  # this GPU or build lacks the kernel
        pytest.skip(f"{qualified}: {error}")
    actual = op_callable(qualified)(*args)
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)
