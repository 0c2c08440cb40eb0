"""Small tensors built from Python numbers alone (`scalar_tensor(0)`, `full((4,), 1.5)`,
`zeros`, `ones`, `arange(8)`) computed once at compile time and kept as program constants.

Such an op that stays a library call costs a launch per run for a value that never changes,
and some cannot cross the C++ target's stable shim at all (`scalar_tensor`'s Scalar). A
constant is only made where nothing can observe that it is shared between runs: the value is
not returned, not written in place and not viewed (a view could be returned or written).
Larger ones stay ops (a generated kernel or a library call): a constant costs memory for the
whole program's life.
"""

from __future__ import annotations

import torch
import torch.fx

FOLDABLE_OPS = frozenset({"aten::scalar_tensor", "aten::full", "aten::zeros", "aten::ones", "aten::arange"})
FOLD_LIMIT = 1024  # elements


def _is_plain(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.fx.Node, torch.Tensor)):
        return False
    return value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format))


def argument_aliases(user: torch.fx.Node, node: torch.fx.Node) -> list:
    """The schema alias annotations of the arguments through which the op call `user` receives
    `node` (alone or in a list); None entries for plain reads."""
    arguments = user.target._schema.arguments  # type: ignore[union-attr]
    given = (*user.args, *(user.kwargs.get(a.name) for a in arguments[len(user.args):]))
    return [argument.alias_info for argument, value in zip(arguments, given)
            if value is node or (isinstance(value, (list, tuple)) and node in value)]


def only_read(node: torch.fx.Node) -> bool:
    """Whether every user reads `node` without keeping it (no output, no write, no view)."""
    for user in node.users:
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return False
        schema = user.target._schema
        if user.target.is_view or any(r.alias_info is not None for r in schema.returns):
            return False
        if any(alias is not None for alias in argument_aliases(user, node)):
            return False
    return True


def folded_value(node: torch.fx.Node) -> torch.Tensor | None:
    """The tensor `node` always computes, when it is worth keeping as a constant, else None."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op._schema.name not in FOLDABLE_OPS:
        return None
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor) or fake.numel() > FOLD_LIMIT or not all(isinstance(s, int) for s in fake.shape):
        return None
    if not _is_plain(node.args) or not _is_plain(tuple(node.kwargs.values())) or not only_read(node):
        return None
    value = op(*node.args, **node.kwargs)
    return value if value.dtype == fake.dtype and value.shape == fake.shape else None
