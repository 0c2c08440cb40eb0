"""Attention's dropout RNG state (philox seed/offset) as program inputs.

Eager keeps these 0-dim tensors on the host (on the device only while a CUDA graph is being
captured) while the fake tensors that describe them say the attention op's device, so the
backward program of a training step with attention dropout got CPU tensors where it checked
for CUDA ones. Inputs used only as that state are checked for everything but their device.
"""

from __future__ import annotations

import pytest
import torch

from wrapgen.api import build
from wrapgen.errors import InputMismatchError
from wrapgen.lowering.graph_lowering import _is_philox_state
from wrapgen.wrapper_ir import AssertInput, ExternKernel, Output, Program, TensorRef
from wrapgen.wrapper_ir.program import TensorInput
from wrapgen.wrapper_ir.values import TensorType

TARGETS = ("python", "fx", "cpp", "interpret")


def _backward_graph() -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    g = torch.fx.Graph()
    nodes = {n: g.placeholder(n) for n in ("grad", "q", "k", "v", "out", "lse", "seed", "offset")}
    op = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    n = nodes
    bw = g.call_function(op, (n["grad"], n["q"], n["k"], n["v"], None, n["out"], n["lse"], n["seed"], n["offset"], 0.1, (True, True, False, False)))
    g.output(bw)
    return g, nodes


def test_only_the_philox_arguments_are_recognized():
    _, nodes = _backward_graph()
    assert _is_philox_state(nodes["seed"]) and _is_philox_state(nodes["offset"])
    assert not any(_is_philox_state(nodes[n]) for n in ("grad", "q", "lse"))


def test_a_philox_input_with_another_use_keeps_its_device_check():
    g, nodes = _backward_graph()
    g.call_function(torch.ops.aten.add.Tensor, (nodes["seed"], 1))
    assert not _is_philox_state(nodes["seed"])


def _program() -> Program:
    cpu = torch.device("cpu")
    seed_type = TensorType(torch.int64, cpu, (), ())
    lines = (
        AssertInput("seed", torch.int64, None, (), ()),
        ExternKernel("y", "aten::clone.default", (TensorRef("seed"),), result=seed_type),
        Output((TensorRef("y"),)),
    )
    return Program("p", (TensorInput("seed", seed_type),), (), (), lines)


def test_the_unchecked_device_is_visible_in_the_text_form():
    assert "assert_input seed: i64[] strides [] any device" in str(_program())


@pytest.mark.parametrize("target", TARGETS)
def test_an_input_whose_device_is_not_checked_accepts_any_device(target):
    artifact = build(_program(), target)
    for value in (torch.tensor(7), torch.tensor(8, device="meta")):
        (got,) = artifact.call([value])
        assert got.device == value.device
        if value.device.type == "cpu":
            assert int(got) == 7
    with pytest.raises(InputMismatchError, match="input seed: expected dtype torch.int64"):
        artifact.call([torch.tensor(1.0)])
