"""Which ops torch decomposes before lowering, for each way a graph is captured.

Attention stays one library call: its fused kernels (flash / memory-efficient) are far
faster and leaner than the math decomposition.
"""

from __future__ import annotations

import torch

# Training-mode batch norm's functional forms (core_aten_decompositions leaves them whole): as
# library calls they are a pass for the statistics and another for the normalization that no
# neighbouring kernel can join; decomposed, the statistics are reductions and the normalization
# a pointwise body that fuses with the ReLU (and residual add) after it, and the running-stat
# updates become stores of those kernels (a CPU ResNet's forward kept 16 of them as library calls).
_TRAINING_BATCH_NORM = ("_native_batch_norm_legit_functional", "_batch_norm_with_update_functional",
                        "_native_batch_norm_legit", "_batch_norm_with_update")


def _batch_norm_decompositions() -> dict:
    from torch._decomp import decomposition_table

    ops = (getattr(torch.ops.aten, name).default for name in _TRAINING_BATCH_NORM if hasattr(torch.ops.aten, name))
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


def export_table() -> dict:
    """torch.export's core-ATen table, keeping `scaled_dot_product_attention` whole, plus
    training-mode batch norm's functional forms (as core_aten_decompositions has them): as library
    calls they are wrong for bf16/fp16 inputs, whose new running stats the CPU kernels return in
    the input's dtype where their meta functions (what the program is typed by) say float32."""
    from torch._decomp import decomposition_table

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    table[torch.ops.aten.baddbmm.default] = baddbmm_in_input_dtype
    for batch_norm in (torch.ops.aten._native_batch_norm_legit_functional.default,
                       torch.ops.aten._batch_norm_with_update_functional.default):
        if batch_norm in decomposition_table:
            table[batch_norm] = decomposition_table[batch_norm]
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
    table[torch.ops.aten.baddbmm.default] = baddbmm_in_input_dtype
    table.update(_training_decompositions())
    table.update(_batch_norm_decompositions())
    return table


def _training_decompositions() -> dict:
    """`_log_softmax` as its primitives (amax, sub, exp, sum, log), as Inductor decomposes it.
    Whole, the op's full-size result is what the partitioner must save for the backward
    (a cross entropy over a vocabulary: a logits-sized buffer written by the forward and read by
    the backward). Decomposed, the partitioner can save the logits (the matmul's output, saved
    anyway) and the per-row max and log-sum, and the backward recomputes the rest inside its
    fused kernel. The lowering fuses the primitives exactly as it fuses the whole op."""
    from torch._decomp import decomposition_table

    ops = (torch.ops.aten._log_softmax.default,)
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


_HALF = (torch.float16, torch.bfloat16)


def baddbmm_in_input_dtype(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *,
                           beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """`beta * self + alpha * (batch1 @ batch2)` with the product in the inputs' dtype.

    torch's own decomposition upcasts every argument of a half-precision call to float32 first,
    so the batched product runs as a float32 GEMM: in bf16 BLOOM (whose ALiBi scores are a
    `baddbmm`) that GEMM was a third of the GPU time. Here the product stays a half-precision
    library GEMM (float32 accumulation, as the whole op has) and only the scaling and the add
    run in float32, as a pointwise body that fuses into the kernel reading the scores.
    """
    aten = torch.ops.aten
    product = aten.bmm.default(batch1, batch2)
    if not product.is_floating_point() and not product.is_complex():
        beta, alpha = int(beta), int(alpha)
    compute = torch.float32 if product.dtype in _HALF else product.dtype
    result = product.to(compute) if alpha == 1 else product.to(compute) * alpha
    if beta != 0:  # beta 0 ignores `self`, NaNs included
        result = result + (self.to(compute) if beta == 1 else self.to(compute) * beta)
    return result.to(product.dtype)
