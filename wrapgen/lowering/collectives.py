"""Functional collectives of an ATen graph as `CollectiveStart` / `CollectiveWait` lines.

torch.distributed's functional collectives (`funcol.all_reduce(t, "sum", group)`, FSDP's
all-gathers and reduce-scatters, a DDP gradient all_reduce in a backward graph) reach the
graph as `_c10d_functional.<collective>(input, ..., group_name)` followed by
`_c10d_functional.wait_tensor(result)`; the group is named by a string that the op resolves
when it runs. Each such pair becomes a start line and a wait line. A node that reads a
result before its `wait_tensor` (which a graph should not have) gets the wait right before
it, so no target ever reads a tensor still in flight.
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.errors import LoweringError
from wrapgen.wrapper_ir.collectives import COLLECTIVES, CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.values import TensorType


def collective_of(target: object) -> str | None:
    """The collective a graph node's target launches (`all_reduce`, ...), or None."""
    if not isinstance(target, torch._ops.OpOverload) or target._overloadname != "default":
        return None
    namespace, _, name = target._schema.name.partition("::")
    return name if namespace == "_c10d_functional" and name in COLLECTIVES else None


def is_wait(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.name == "_c10d_functional::wait_tensor"


def _bound(node: torch.fx.Node) -> dict[str, object]:
    """The node's arguments by schema name (defaults filled in)."""
    values: dict[str, object] = {}
    for index, argument in enumerate(node.target._schema.arguments):  # type: ignore[union-attr]
        if index < len(node.args):
            values[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            values[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
    return values


class InFlightCollectives:
    """Collectives started and not yet waited for while the graph is lowered."""

    def __init__(self) -> None:
        self.started: dict[str, CollectiveStart] = {}
        self.results: set[str] = set()  # every collective result, waited for or not

    def start(self, node: torch.fx.Node, collective: str, name: str, input_name: str, type_: TensorType) -> CollectiveStart:
        """The start line of `node` (input and result already named by the lowering)."""
        values = _bound(node)
        group = values.get("group_name")
        if not isinstance(group, str):
            raise LoweringError(
                f"node {node.name}: {collective} names its process group by {type(group).__name__}, not by a string "
                "(pass a ProcessGroup or a group name to torch.distributed._functional_collectives)"
            )
        extra: dict[str, object] = {}
        for key in COLLECTIVES[collective]:
            value = values.get(key)
            if key == "group_size" and (isinstance(value, bool) or not isinstance(value, int)):
                raise LoweringError(f"node {node.name}: {collective} needs a constant group_size, got {value!r}")
            extra[key] = value
        line = CollectiveStart(name, collective, input_name, group, type_, **extra)  # type: ignore[arg-type]
        try:
            line.check()
        except ValueError as error:
            raise LoweringError(f"node {node.name}: {error}") from None
        self.started[name] = line
        self.results.add(name)
        return line

    def wait(self, name: str) -> CollectiveWait | None:
        """The wait for `name` if it is still in flight (None once it was waited for)."""
        start = self.started.pop(name, None)
        return None if start is None else CollectiveWait(name, start.input)

    def waits_before(self, names: list[str]) -> list[CollectiveWait]:
        """Waits for the in-flight results among `names`, which a line is about to read."""
        return [w for w in (self.wait(name) for name in dict.fromkeys(names)) if w is not None]


__all__ = ["InFlightCollectives", "collective_of", "is_wait"]
