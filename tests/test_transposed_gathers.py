"""A gathered value read through a view that moves its innermost dimension is computed into its
own buffer first in Triton kernels (wrapgen/lowering/loop_ops/views.py): neighbouring lanes would
otherwise gather from different rows at positions Triton cannot prove contiguous."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import wrapgen
from wrapgen.wrapper_ir.lines import ExternKernel, KernelDefinition


def position_to_content(scores: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """DeBERTa-v2's position-to-content term: gathered along rows, then transposed."""
    n = scores.shape[-1]
    positions = torch.arange(n, device=scores.device)
    index = torch.clamp(positions.unsqueeze(0) - positions.unsqueeze(1) + n, 0, table.shape[-1] - 1)
    gathered = torch.gather(table, -1, index.unsqueeze(0).expand(scores.shape[0], n, n))
    return torch.softmax(scores + gathered.transpose(-1, -2), -1)


def content_to_position(scores: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    n = scores.shape[-1]
    positions = torch.arange(n, device=scores.device)
    index = torch.clamp(positions.unsqueeze(1) - positions.unsqueeze(0) + n, 0, table.shape[-1] - 1)
    gathered = torch.gather(table, -1, index.unsqueeze(0).expand(scores.shape[0], n, n))
    return torch.softmax(scores + gathered, -1)


def reshaped_lookup(scores: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A gather along rows viewed with its last dimension split (heads): read along its rows."""
    n = scores.shape[-1]
    positions = torch.arange(n, device=scores.device)
    index = torch.clamp(positions.unsqueeze(1) - positions.unsqueeze(0) + n, 0, table.shape[-1] - 1)
    gathered = torch.gather(table, -1, index.unsqueeze(0).expand(scores.shape[0], n, n))
    return torch.softmax(scores.view(4, 32, 2, 16) + gathered.view(4, 32, 2, 16), -1)


def _cuda_kernels(fn) -> list[KernelDefinition]:
    with FakeTensorMode(allow_non_fake_inputs=True):
        scores = torch.randn(4, 32, 32, device="cuda")
        table = torch.randn(4, 32, 64, device="cuda")
    program = wrapgen.lower(fn, (scores, table))
    assert not [line for line in program.lines if isinstance(line, ExternKernel)], str(program)
    return [line for line in program.lines if isinstance(line, KernelDefinition)]


def test_a_transposed_gather_is_its_own_kernel_on_cuda():
    kernels = _cuda_kernels(position_to_content)
    assert [k.name.split("_")[2] for k in kernels] == ["gather", "softmax"], [k.name for k in kernels]


def test_a_gather_read_along_its_rows_fuses_into_the_softmax_on_cuda():
    kernels = _cuda_kernels(content_to_position)
    assert len(kernels) == 1 and "softmax" in kernels[0].name


def test_a_reshaped_gather_still_fuses_on_cuda():
    kernels = _cuda_kernels(reshaped_lookup)
    assert len(kernels) == 1 and "softmax" in kernels[0].name, [k.name for k in kernels]


@pytest.mark.parametrize("fn", [position_to_content, content_to_position, reshaped_lookup])
@pytest.mark.parametrize("kernels", ["cpp", "triton"])
def test_gathers_read_through_views_match_eager(fn, kernels):
    scores, table = torch.randn(4, 32, 32), torch.randn(4, 32, 64)
    with wrapgen.config.patch(cpu_kernels=kernels):
        compiled = wrapgen.compile(fn, (scores, table))
    for _ in range(2):
        scores, table = torch.randn_like(scores), torch.randn_like(table)
        torch.testing.assert_close(compiled(scores, table), fn(scores, table))
