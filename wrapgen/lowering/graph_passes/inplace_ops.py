"""Multi-tensor (`_foreach_*`) and in-place ATen ops as the per-tensor functional ops and `copy_`s
the loop lowerings know, so an optimizer step or a running-statistics update becomes fused kernels.

An optimizer traced with `foreach=True` holds one `_foreach_*` node per arithmetic step over all
its tensors: as library calls, AdamW over GPT-2's 146 tensors is ~15 such calls, each a pass over
every parameter and a list of results. Split per tensor, each tensor's whole update (p, m, v)
inlines into the `copy_` that aot_autograd keeps for each mutated input, and becomes one kernel
that reads p, g, m, v once and writes p, m, v in place (lowering/mutation.py).

An in-place op (`x.add_(y)`, `_foreach_mul_`) becomes its functional op followed by a
`copy_` into the mutated argument; the `copy_` is the one mutation the lowering handles.

A node is rewritten only when every op that replaces it has a loop lowering on the graph's
kernel device (a `_foreach_` library call is faster than one library call per tensor), and the
per-tensor op is exactly the one the dispatcher chooses for those arguments.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from wrapgen.lowering.capture import CapturedGraph, rewrite_nodes

aten = torch.ops.aten


class _Resolve(TorchDispatchMode):
    """Records the first ATen overload a call dispatches to (the op a packet picks for its arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.op: torch._ops.OpOverload | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.op is None:
            self.op = func
        return func(*args, **(kwargs or {}))


def split_inplace_ops(captured: CapturedGraph, device_type: str) -> CapturedGraph:
    """`captured` with `_foreach_*` ops split per tensor and in-place pointwise ops made functional
    plus `copy_` (on a copy of the graph), or `captured` itself when nothing changes."""
    return rewrite_nodes(captured, _candidate,
                         lambda graph, node, _, fake_mode: _Splitter(graph, node, fake_mode, device_type).run())


def _candidate(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    name = target._schema.name
    return name.startswith("aten::_foreach_") or _inplace_pointwise(target) is not None


def _inplace_pointwise(op: torch._ops.OpOverload) -> torch._ops.OpOverloadPacket | None:
    """The functional packet of an in-place pointwise op (`add_` -> `add`), else None."""
    name = op._schema.name.removeprefix("aten::")
    if name.startswith("_") or not name.endswith("_") or not op._schema.arguments:
        return None
    first = op._schema.arguments[0]
    if first.alias_info is None or not first.alias_info.is_write:
        return None
    packet = getattr(aten, name[:-1], None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    if functional is None or torch.Tag.pointwise not in functional.tags:
        return None
    return packet


class _Splitter:
    def __init__(self, graph: torch.fx.Graph, node: torch.fx.Node, fake_mode, device_type: str) -> None:
        self.graph, self.node, self.fake_mode, self.device_type = graph, node, fake_mode, device_type
        self.added: list[torch.fx.Node] = []

    def run(self) -> bool:
        try:
            with self.graph.inserting_before(self.node):
                done = self._foreach() if self.node.target._schema.name.startswith("aten::_foreach_") else self._inplace()
        except Exception:  # noqa: BLE001 - arguments the per-tensor op refuses: keep the node
            done = False
        if not done:
            for new in reversed(self.added):
                self.graph.erase_node(new)
        return done

    def _call(self, op: object, args: tuple, kwargs: dict) -> torch.fx.Node | None:
        """A node for `op` (a packet: resolved to the overload the dispatcher takes), with its
        fake value; None when the per-tensor op is not what the packet names or has no lowering."""
        from wrapgen.lowering.loop_ops import supported

        fake_args = torch.fx.map_arg(args, lambda n: n.meta["val"])
        fake_kwargs = torch.fx.map_arg(kwargs, lambda n: n.meta["val"])
        if isinstance(op, torch._ops.OpOverloadPacket):
            resolve = _Resolve()
            with self.fake_mode, resolve:
                value = op(*fake_args, **fake_kwargs)
            overload = resolve.op
            if overload is None or overload._schema.name != op._qualified_op_name:
                return None
        else:
            with self.fake_mode:
                value = op(*fake_args, **fake_kwargs)
            overload = op
        new = self.graph.create_node("call_function", overload, args, kwargs, name=f"{self.node.name}_split")
        new.meta["val"] = value
        self.added.append(new)
        if overload is not aten.copy_.default and not supported(new, self.device_type):
            return None
        return new

    def _foreach(self) -> bool:
        op = self.node.target
        name = op._schema.name.removeprefix("aten::_foreach_")
        inplace = name.endswith("_")
        packet = getattr(aten, name.rstrip("_"), None)
        if packet is None:
            return False
        schema = op._schema.arguments
        args = list(self.node.args) + [self.node.kwargs[a.name] for a in schema[len(self.node.args):] if a.name in self.node.kwargs]
        names = [a.name for a in schema[:len(args)]]
        lists = [i for i, a in enumerate(schema[:len(args)]) if str(a.type) in ("List[Tensor]", "List[number]", "Tensor[]", "Scalar[]")]
        if not lists:
            return False
        count = len(args[lists[0]])
        results = []
        for k in range(count):
            element = [a[k] if i in lists else a for i, a in enumerate(args)]
            new = None
            # as the foreach op was called; else its trailing scalars (value, alpha) by name,
            # where the per-tensor op takes them keyword-only
            for split in dict.fromkeys((len(self.node.args), lists[-1] + 1)):
                try:
                    new = self._call(packet, tuple(element[:split]), dict(zip(names[split:], element[split:])))
                    break
                except Exception:  # noqa: BLE001 - the per-tensor op takes these otherwise
                    continue
            if new is None:
                return False
            results.append(new)
        if inplace:
            targets = args[0]
            copies = [self._call(aten.copy_.default, (t, r), {}) for t, r in zip(targets, results)]
            if any(c is None for c in copies) or self.node.users:
                return False
        else:
            expected = self.node.meta.get("val")
            if not isinstance(expected, (list, tuple)) or len(expected) != count:
                return False
            if any(r.meta["val"].shape != e.shape or r.meta["val"].dtype != e.dtype for r, e in zip(results, expected)):
                return False
            for user in list(self.node.users):
                if user.target is not operator.getitem:
                    return False
            for user in list(self.node.users):
                user.replace_all_uses_with(results[user.args[1]])
                self.graph.erase_node(user)
        self.graph.erase_node(self.node)
        return True

    def _inplace(self) -> bool:
        op = self.node.target
        packet = _inplace_pointwise(op)
        functional = getattr(packet, op._overloadname)
        target = self.node.args[0]
        result = self._call(functional, tuple(self.node.args), dict(self.node.kwargs))
        if result is None or not isinstance(target, torch.fx.Node):
            return False
        if result.meta["val"].shape != target.meta["val"].shape or result.meta["val"].dtype != target.meta["val"].dtype:
            return False  # a broadcast or a type promotion the in-place op refuses: its call says so
        copy = self._call(aten.copy_.default, (target, result), {})
        self.node.replace_all_uses_with(copy)
        self.graph.erase_node(self.node)
        return True
