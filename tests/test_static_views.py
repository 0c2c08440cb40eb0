"""Static inputs (parameters under torch.compile) and the python target's kept views of them.

Each call through torch.compile hands the parameters in as inputs; the views a program takes of
them (a linear layer's transposed weight) are kept between calls and made again only when the
caller hands other storage. Results must follow the parameters however the caller changes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

import wrapgen
from wrapgen.wrapper_ir.program import Program, TensorInput
from wrapgen.wrapper_ir.values import TensorType

IN, HIDDEN, OUT, ROWS = 128, 256, 64, 64  # large enough for library matrix products


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _code(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.rglob("code.py")))


def _programs(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.rglob("program.txt")))


def test_parameters_are_static_inputs_and_their_views_are_kept(tmp_path: Path) -> None:
    model = TwoLinear().eval()
    compiled = torch.compile(model, backend="wrapgen", options={"target": "python", "debug_dir": str(tmp_path)})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(ROWS, IN)
            torch.testing.assert_close(compiled(x), model(x))
    text, code = _programs(tmp_path), _code(tmp_path)
    assert text.count("  static") == 4  # two weights, two biases; not the activation
    assert code.count("def _keep_views_of_") == 2  # one per transposed weight
    assert "_kept_address_" in code.split("def call(args):")[1]


@pytest.mark.parametrize("change", ["replace", "data", "copy_"])
def test_kept_views_follow_the_parameters(change: str) -> None:
    model = TwoLinear().eval()
    compiled = torch.compile(model, backend="wrapgen", options={"target": "python"})
    x = torch.randn(ROWS, IN)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        new = torch.randn(HIDDEN, IN)
        if change == "replace":
            model.fc1.weight = nn.Parameter(new)
        elif change == "data":
            model.fc1.weight.data = new
        else:
            model.fc1.weight.copy_(new)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("target", ["python", "cpp", "fx"])
def test_training_steps_with_kept_views_match_eager(target: str) -> None:
    torch.manual_seed(0)
    reference = TwoLinear()
    model = TwoLinear()
    model.load_state_dict(reference.state_dict())
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, model)]
    for _ in range(3):  # the optimizer's in-place updates must reach the next step's views
        x, weights = torch.randn(ROWS, IN), torch.randn(ROWS, OUT) / ROWS
        losses = [(reference(x) * weights).sum(), (compiled(x) * weights).sum()]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[1], losses[0])
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()


def test_written_static_inputs_keep_no_views(tmp_path: Path) -> None:
    """A buffer the program writes (running statistics) is state: nothing derived from it is kept."""

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm1d(8)
            self.register_buffer("scale", torch.randn(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.scale.mul_(0.5)
            return self.norm(x) @ self.scale.t()

    model, reference = Norm().train(), Norm().train()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="wrapgen", options={"target": "python", "debug_dir": str(tmp_path)})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x), reference(x))
    torch.testing.assert_close(model.scale, reference.scale)
    torch.testing.assert_close(model.norm.running_mean, reference.norm.running_mean)
    assert "_keep_views_of_" not in _code(tmp_path)


def test_static_inputs_are_printed_and_checked() -> None:
    program = Program("p", (TensorInput("w", TensorType(torch.float32, torch.device("cpu"), (2, 2), (2, 1))),), (), (), ())
    marked = program.with_static_inputs(["w"])
    assert marked.static_input_names() == ["w"]
    assert "w: f32[2, 2] strides [2, 1] cpu  static" in str(marked)
    assert "static" not in str(program)
    with pytest.raises(ValueError, match="no tensor input named nope"):
        program.with_static_inputs(["nope"])


def test_wrapgen_compile_has_no_static_inputs() -> None:
    program = wrapgen.lower(TwoLinear().eval(), (torch.randn(ROWS, IN),))
    assert program.static_input_names() == []
