"""A sum over a one-hot value (cross entropy's backward: -1 scattered into zeros at each row's
target, summed over the vocabulary by log_softmax's backward) folds to the term it picks: no
reduction is left, and results equal eager's, NaN and out-of-range picks included, on every
target (one_hot_sums.py)."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir.lines import KernelDefinition

TARGETS = ["python", "cpp", "fx", "interpret"]


def reduced_ops(program) -> list[str]:
    """The ops of each generated kernel that reduces (by its metadata)."""
    ops = [dict(line.metadata).get("ops", "") for line in program.lines if isinstance(line, KernelDefinition)]
    return [o for o in ops if "sum" in o.split(",")]


def scattered_gradient(logits, target, scale):
    """log_softmax's backward of cross entropy's scatter of -scale at the targets."""
    grad = torch.scatter(torch.zeros_like(logits), 1, target[:, None], -1.0) * scale[:, None]
    return grad - torch.softmax(logits, 1) * grad.sum(1, keepdim=True)


def compared_one_hot(values, picks):
    """A one-hot made by comparing with an arange: a pick outside [0, 7) selects nothing."""
    hot = torch.where(picks[:, None] == torch.arange(7), values[:, None], 0.0)
    return hot.sum(1), hot.sum(-1, keepdim=True) * 2


def weighted_rows(x, target):
    """The factor reads the reduced index: a real reduction, left alone."""
    return (torch.scatter(torch.zeros_like(x), 1, target[:, None], -1.0) * x).sum(1)


@pytest.mark.parametrize("target", TARGETS)
def test_one_hot_sum_is_folded(target: str) -> None:
    logits, picks, scale = torch.randn(6, 40), torch.randint(0, 40, (6,)), torch.randn(6)
    compiled = wrapgen.compile(scattered_gradient, (logits, picks, scale), target=target)
    assert reduced_ops(compiled.program) == [], compiled.program  # the softmax's own sums only
    torch.testing.assert_close(compiled(logits, picks, scale), scattered_gradient(logits, picks, scale))
    nan_scale = torch.tensor([1.0, float("inf"), float("nan"), -2.0, 0.5, 3.0])  # 0 * inf is NaN in eager
    torch.testing.assert_close(compiled(logits, picks, nan_scale), scattered_gradient(logits, picks, nan_scale),
                               equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
def test_out_of_range_picks_sum_to_zero(target: str) -> None:
    values, picks = torch.randn(5), torch.tensor([0, 6, -1, 7, 3])
    compiled = wrapgen.compile(compared_one_hot, (values, picks), target=target)
    assert reduced_ops(compiled.program) == [], compiled.program
    torch.testing.assert_close(compiled(values, picks), compared_one_hot(values, picks))


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_a_factor_reading_the_reduced_index_keeps_the_sum(target: str) -> None:
    x, picks = torch.randn(4, 9), torch.randint(0, 9, (4,))
    compiled = wrapgen.compile(weighted_rows, (x, picks), target=target)
    assert reduced_ops(compiled.program), compiled.program
    torch.testing.assert_close(compiled(x, picks), weighted_rows(x, picks))
