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
from torch.utils import _pytree as pytree

from wrapgen.lowering.constant_masks import EVALUATION_LIMIT, evaluate, mask_kind

_ATTENTION = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
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
    """The nodes computing `mask`, in graph order, when all are pure, read nothing from outside
    the graph and have static sizes; else None."""
    seen: set[torch.fx.Node] = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        value = node.meta.get("example_value")
        if not _pure(node) or not isinstance(value, torch.Tensor):
            return None
        if not all(isinstance(s, int) for s in value.shape) or value.numel() > EVALUATION_LIMIT:
            return None
        leaves = pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)) for v in leaves):
            return None
        stack.extend(node.all_input_nodes)
    return [n for n in mask.graph.nodes if n in seen]


def drop_traced_masks(gm: torch.fx.GraphModule) -> bool:
    """Rewrite dynamo's graph in place; True when an attention call changed."""
    values: dict[torch.fx.Node, torch.Tensor | None] = {}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ATTENTION or len(node.args) < 3:
            continue
        mask, causal = _mask_argument(node)
        query, key = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
        if not isinstance(mask, torch.fx.Node) or causal or not isinstance(query, torch.Tensor) \
                or not isinstance(key, torch.Tensor):
            continue
        queries, keys = query.shape[-2], key.shape[-2]
        if not isinstance(queries, int) or not isinstance(keys, int):
            continue
        if mask not in values:
            nodes = _closure(mask)
            values[mask] = None if nodes is None else evaluate(nodes)
        value = values[mask]
        kind = None if value is None else mask_kind(value, queries, keys)
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
        for mask, value in values.items():
            if value is not None:  # rewritten calls no longer read it
                _erase_unused(mask)
        gm.graph.lint()
        gm.recompile()
    return changed


def _erase_unused(node: torch.fx.Node) -> None:
    stack = [node]
    while stack:
        current = stack.pop()
        if getattr(current, "_erased", False) or current.users or not _pure(current):
            continue
        inputs = current.all_input_nodes
        current.graph.erase_node(current)
        stack.extend(inputs)
