"""Constant attention masks in TorchDynamo's graph, before aot_autograd: dropped or `is_causal`.

`constant_masks` rewrites the ATen graphs wrapgen lowers; in training that is too late, since
aot_autograd has already saved the mask for the backward's attention. Here the rewrite happens
on the torch-level graph dynamo hands the backend, so the forward and the backward that
aot_autograd derives from it both run the unmasked or causal kernels (and the CPU and CUDA
flash backwards skip the masked half). The mask's subgraph must be made of the pure tensor
functions and methods below, read no input, no weight and no module, and have static sizes; it
is evaluated once, on the mask's device, and `constant_masks.mask_kind` decides.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from wrapgen.lowering.graph_passes.attention_broadcast import TRACED_ATTENTION
from wrapgen.lowering.graph_passes.constant_masks import constant_kind, erase_evaluated, pure_closure

_PURE_FUNCTIONS = frozenset({
    torch.arange, torch.ones, torch.zeros, torch.full, torch.ones_like, torch.zeros_like, torch.full_like,
    torch.tril, torch.triu, torch.diff, torch.cumsum, torch.where, torch.cat, torch.stack, torch.broadcast_to,
    torch.logical_and, torch.logical_or, torch.logical_not, torch.bitwise_and, torch.bitwise_or, torch.bitwise_not,
    torch.le, torch.lt, torch.ge, torch.gt, torch.eq, torch.ne,
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, operator.and_,
    operator.or_, operator.xor, operator.invert, operator.le, operator.lt, operator.ge, operator.gt, operator.eq,
    operator.ne, operator.getitem,
})
_PURE_METHODS = frozenset({
    "unsqueeze", "squeeze", "expand", "expand_as", "view", "reshape", "to", "bool", "float", "long", "int",
    "new_ones", "new_zeros", "new_full", "cumsum", "diff", "le", "lt", "ge", "gt", "eq", "ne", "masked_fill",
    "__and__", "__or__", "__xor__", "__invert__", "__getitem__", "contiguous", "clone", "transpose", "permute",
    "flatten", "type_as", "logical_and", "logical_or", "logical_not", "tril", "triu", "repeat", "narrow",
    # operators called as methods (`padding_mask.__eq__(...)`): dynamo records them as call_method
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__", "__rsub__",
    "__mul__", "__rmul__", "__floordiv__", "__mod__", "__neg__", "__rand__", "__ror__", "__rxor__",
})


def _mask_argument(node: torch.fx.Node) -> tuple[object, bool]:
    """(the attn_mask argument of an SDPA call, its is_causal flag)."""
    mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
    causal = node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False)
    return mask, bool(causal)


def _pure(node: torch.fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in _PURE_FUNCTIONS
    return node.op == "call_method" and node.target in _PURE_METHODS


def _closure(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    return pure_closure(mask, _pure, "example_value")


def drop_traced_masks(gm: torch.fx.GraphModule) -> bool:
    """Rewrite dynamo's graph in place; True when an attention call changed."""
    values: dict[torch.fx.Node, torch.Tensor | None] = {}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in TRACED_ATTENTION or len(node.args) < 3:
            continue
        mask, causal = _mask_argument(node)
        if not isinstance(mask, torch.fx.Node) or causal:
            continue
        query, key = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
        kind = constant_kind(mask, query, key, _closure, values)
        if kind is None:
            continue
        args, kwargs = list(node.args[:3]), dict(node.kwargs)  # positional mask and flags become keywords
        for name, position in (("dropout_p", 4), ("is_causal", 5)):
            if len(node.args) > position:
                kwargs[name] = node.args[position]
        kwargs["attn_mask"] = None
        kwargs["is_causal"] = kind == "causal"
        node.args, node.kwargs = tuple(args), kwargs
        changed = True
    if changed:
        erase_evaluated(values, lambda user: False)
        gm.graph.lint()
        gm.recompile()
    return changed
