"""Attention masks that are compile-time constants: dropped where they mask nothing, replaced by
`is_causal=True` where they are exactly the causal mask.

A transformers model traced without a padding mask (by torch.export or torch.compile) still
builds one from `arange`s: all True for encoders (BERT, ViT), lower-triangular for decoders
(GPT-2, Llama). Handed to SDPA, a mask rules out the flash kernels on CUDA, adds a bias read per
score, a kernel that builds it and its memory; `is_causal` also lets the kernels skip the masked
half. The subgraph that computes such a mask reads no input and no weight, so it is evaluated
once here, on the mask's own device, and its value decides. Eager PyTorch skips the mask the
same way when it is not tracing; what SDPA computes is unchanged.

On an ATen graph only inference calls are rewritten: a call whose log-sum-exp (or any output
but the first) is used feeds a backward graph that would still see the mask. Training steps
under torch.compile lose their masks earlier, on dynamo's graph (`traced_masks`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx
from torch.utils import _pytree as pytree

from wrapgen.lowering.capture import CapturedGraph, with_graph
from wrapgen.lowering.kernel_lowering import holds_statically

aten = torch.ops.aten

# Attention ops that take a mask: (mask argument's name, is_causal argument's name).
ATTENTION_OPS = {
    aten.scaled_dot_product_attention.default: ("attn_mask", "is_causal"),
    aten._scaled_dot_product_flash_attention_for_cpu.default: ("attn_mask", "is_causal"),
    aten._scaled_dot_product_efficient_attention.default: ("attn_bias", "is_causal"),
    aten._scaled_dot_product_cudnn_attention.default: ("attn_bias", "is_causal"),
}
EVALUATION_LIMIT = 1 << 25  # elements of any tensor the mask's subgraph makes (compile-time memory)
_UNINITIALIZED = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                            "aten::new_empty_strided", "aten::empty_permuted"})


def _argument(node: torch.fx.Node, name: str) -> tuple[object, int | None]:
    """(the value of the argument `name` of an OpOverload call, its position in node.args or None)."""
    schema = node.target._schema  # type: ignore[union-attr]
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if name in node.kwargs:
                return node.kwargs[name], None
            if position < len(node.args) and not argument.kwarg_only:
                return node.args[position], position
            return argument.default_value, None
    raise KeyError(f"{schema.name} has no argument {name!r}")


def _set_argument(node: torch.fx.Node, name: str, value: object) -> None:
    """Set an argument where it is given; a keyword set to its default is left out."""
    _, position = _argument(node, name)
    if position is not None:
        node.args = (*node.args[:position], value, *node.args[position + 1:])
        return
    default = next(a.default_value for a in node.target._schema.arguments if a.name == name)  # type: ignore[union-attr]
    kwargs = {k: v for k, v in node.kwargs.items() if k != name}
    node.kwargs = kwargs if value is default else {**kwargs, name: value}


def _only_first_output_used(node: torch.fx.Node) -> bool:
    """Whether only the attention output is read (inference): no log-sum-exp kept for a backward."""
    if not isinstance(node.meta.get("val"), (tuple, list)):
        return True
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def pure_closure(mask: torch.fx.Node, pure: Callable[[torch.fx.Node], bool], meta_key: str,
                 leaves: frozenset[torch.fx.Node] = frozenset()) -> list[torch.fx.Node] | None:
    """The nodes that compute `mask`, in graph order, when every one is `pure` (so none reads an
    input or a constant but `leaves`, values the caller knows) and has a tensor value of static
    sizes in `node.meta[meta_key]`, of at most EVALUATION_LIMIT elements; else None."""
    seen: set[torch.fx.Node] = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in leaves:
            continue
        value = node.meta.get(meta_key)
        if not pure(node) or not isinstance(value, torch.Tensor):
            return None
        if not all(isinstance(s, int) for s in value.shape) or value.numel() > EVALUATION_LIMIT:
            return None
        arguments = pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)) for v in arguments):
            return None
        stack.extend(node.all_input_nodes)
    return [n for n in mask.graph.nodes if n in seen]


def pure_op(node: torch.fx.Node) -> bool:
    """An ATen op that neither writes, nor draws random numbers, nor leaves memory uninitialized."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    op = node.target
    return not (op._schema.is_mutable or op._schema.name in _UNINITIALIZED or torch.Tag.nondeterministic_seeded in op.tags)


def _closure(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    return pure_closure(mask, pure_op, "val")


def evaluate(nodes: list[torch.fx.Node], known: dict[torch.fx.Node, torch.Tensor] | None = None) -> torch.Tensor | None:
    """The value of the last of `nodes` (a closure in graph order, reading only each other and
    the values `known`), computed for real; None where it cannot be (a device that is not here, a
    meta tensor): the mask then stays, always correct."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    values: dict[torch.fx.Node, object] = dict(known or {})
    try:
        with torch.no_grad(), unset_fake_temporarily():
            for node in nodes:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
                if node.op == "call_method":
                    values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)  # type: ignore[arg-type]
                else:
                    values[node] = node.target(*args, **kwargs)  # type: ignore[operator]
            value = values[nodes[-1]]
            return value.cpu() if isinstance(value, torch.Tensor) and not value.is_meta else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def mask_kind(value: torch.Tensor, queries: int, keys: int) -> str | None:
    """"none" where `value` (a boolean mask or an additive 0/-inf one) masks nothing, "causal"
    where it is the square causal mask at every batch and head, else None."""
    value = value.detach().cpu()
    if value.dtype == torch.bool:
        allowed = value
    elif value.is_floating_point():
        allowed = value == 0
        if not (allowed | (value == float("-inf"))).all():
            return None
    else:
        return None
    if bool(allowed.all()):
        return "none"
    if queries != keys or allowed.dim() < 2:
        return None
    causal = torch.ones(queries, keys, dtype=torch.bool).tril()
    try:
        shape = torch.broadcast_shapes(allowed.shape, causal.shape)
    except RuntimeError:
        return None
    return "causal" if torch.equal(allowed.expand(shape), causal.expand(shape)) else None


def drop_constant_masks(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with constant attention masks dropped or turned into `is_causal` (on a copy of
    the graph: the caller's graph module is never changed), or `captured` itself."""
    gm = captured.graph_module
    if not any(n.op == "call_function" and n.target in ATTENTION_OPS for n in gm.graph.nodes):
        return captured
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    values: dict[torch.fx.Node, torch.Tensor | None] = {}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in ATTENTION_OPS or not _only_first_output_used(node):
            continue
        mask_name, causal_name = ATTENTION_OPS[node.target]  # type: ignore[index]
        mask, _ = _argument(node, mask_name)
        if not isinstance(mask, torch.fx.Node) or _argument(node, causal_name)[0]:
            continue
        query, key = (node.args[0].meta.get("val"), node.args[1].meta.get("val"))  # type: ignore[union-attr]
        kind = constant_kind(mask, query, key, _closure, values)
        if kind is None:
            continue
        _set_argument(node, mask_name, None)
        if kind == "causal":
            _set_argument(node, causal_name, True)
        changed = True
    if not changed:
        return captured
    erase_evaluated(values, holds_statically)  # a metadata check lowering drops keeps nothing alive
    graph.lint()
    return with_graph(captured, graph)


def constant_kind(mask: torch.fx.Node, query: object, key: object,
                  closure: Callable[[torch.fx.Node], list[torch.fx.Node] | None],
                  values: dict[torch.fx.Node, torch.Tensor | None]) -> str | None:
    """`mask_kind` of `mask` for attention of these query and key values (fake or example
    tensors), or None where the sizes are not static or `closure` finds the mask not constant.
    `values` keeps each mask's value (None: not constant) for the other calls that share it."""
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return None
    queries, keys = query.shape[-2], key.shape[-2]
    if not isinstance(queries, int) or not isinstance(keys, int):
        return None
    if mask not in values:
        nodes = closure(mask)
        values[mask] = None if nodes is None else evaluate(nodes)
    value = values[mask]
    return None if value is None else mask_kind(value, queries, keys)


def erase_evaluated(values: dict[torch.fx.Node, torch.Tensor | None],
                    removable: Callable[[torch.fx.Node], bool]) -> None:
    """Erase each evaluated mask (the calls that read it no longer do), then its inputs as they
    lose their last user. `removable(user)` says which users do not keep a value alive."""
    stack = [mask for mask, value in values.items() if value is not None]
    while stack:
        current = stack.pop()
        if getattr(current, "_erased", False) or current.op not in ("call_function", "call_method"):
            continue
        ignored = [user for user in current.users if removable(user)]
        if len(ignored) != len(current.users):
            continue
        for user in ignored:
            current.graph.erase_node(user)
        inputs = current.all_input_nodes
        current.graph.erase_node(current)
        stack.extend(inputs)

