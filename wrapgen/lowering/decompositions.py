"""Which ops torch decomposes before lowering, for each way a graph is captured.

Attention stays one library call: its fused kernels (flash / memory-efficient) are far
faster and leaner than the math decomposition.
"""

from __future__ import annotations

import torch


def export_table() -> dict:
    """torch.export's core-ATen table, keeping `scaled_dot_product_attention` whole."""
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    return table


def aot_autograd_table() -> dict:
    """The core-ATen decompositions, less those that are wrong under autograd.

    torch's decomposition of `_scaled_dot_product_flash_attention_for_cpu` (meant for
    torch.export) returns the attention matrix where the op returns its logsumexp, so a
    backward graph that calls the op's backward on the saved logsumexp gets the wrong
    tensor (torch/_decomp/decompositions.py: "this decomp rule should be excluded by
    inductor"; inductor excludes it too). The op stays a library call instead.
    """
    from torch._decomp import core_aten_decompositions

    table = core_aten_decompositions()
    table.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    return table
