"""A training step as a benchmark workload: forward and backward of a loss module, returning the
loss and every parameter's gradient, so the harness checks gradients against eager's the way it
checks inference outputs, and times whole steps.

Contenders compile the loss module (through torch.compile, so aot_autograd builds the backward);
the step around it, gradient bookkeeping included, is the same plain Python for all of them.
The model stays in eval mode (dropout off): a step is then deterministic and comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Step = Callable[..., tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]]


def run_step(
    loss_fn: Callable[..., torch.Tensor], module: nn.Module, inputs: tuple[Any, ...]
) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """loss_fn(*inputs).backward() from cleared gradients; (loss, gradients in parameter order).

    The gradients are taken off the parameters before returning, so a step's gradient memory is
    freed with its result and is not counted in the next contender's baseline."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    with torch.enable_grad():
        loss = loss_fn(*inputs)
        loss.backward()
    grads = tuple(p.grad for p in params)
    for p in params:
        p.grad = None
    return loss.detach(), grads


class TrainingStep(nn.Module):
    """Eager's training step of `loss`: calling it is the reference every contender must match."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
        return run_step(self.loss, self.loss, inputs)


def compiled_step(
    model: nn.Module, compile_module: Callable[[nn.Module, tuple], Callable[..., Any]] | None, inputs: tuple
) -> Step:
    """The step with `model.loss` compiled by `compile_module` (a contender's `train_build`)."""
    if not isinstance(model, TrainingStep):
        raise TypeError(f"a training workload's model must be a TrainingStep, got {type(model).__name__}")
    if compile_module is None:
        raise ValueError("this contender has no training build")
    loss_fn = compile_module(model.loss, inputs)
    return lambda *args: run_step(loss_fn, model.loss, args)
