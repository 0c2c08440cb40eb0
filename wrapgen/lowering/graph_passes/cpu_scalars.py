"""0-dim CPU tensors of known value, read by generated kernels as numbers.

DeBERTa-v2 divides its attention scores by `torch.sqrt(torch.tensor(d) * s)` and builds its
position buckets with `torch.tensor(mid - 1)` and `torch.log(torch.tensor(...))`: CPU tensors
made from Python data, which torch.export lifts into constants. A CUDA kernel cannot read a CPU
tensor, so each CUDA op reading one stayed a library call, and what it read was materialized:
the relative-position gathers became kernels of their own, read back from memory by the softmax
(DeBERTa-v2 ran at 0.87x Inductor on an H200). Eager reads a 0-dim CPU tensor in a CUDA op as a
scalar; this pass does the same at compile time. Each 0-dim CPU value computed only from such
constants becomes a Python number in the tensor arguments of the ops with a loop lowering that
read it, where the op's result keeps its dtype, sizes, strides and device with the number in
place (type promotion treats a 0-dim tensor and a number alike within a dtype category, not
across categories: the check keeps such a read a tensor). On the CPU it saves the kernel a load,
and eager's binary ops read a CPU scalar and a number the same way.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._subclasses.fake_tensor import is_fake

from wrapgen.lowering.capture import CapturedGraph, graph_fake_mode, with_graph
from wrapgen.lowering.graph_passes.constant_masks import evaluate, pure_closure, pure_op
from wrapgen.lowering.loop_ops.common import LOWERINGS, op_key, supported

aten = torch.ops.aten


def cpu_scalars_as_numbers(captured: CapturedGraph, device_type: str) -> CapturedGraph:
    """`captured` with each known 0-dim CPU value read by a loop op on `device_type` replaced by
    its number there (on a copy of the graph), or `captured` itself when none is."""
    old = captured.graph_module.graph
    if not any(_readers(n, device_type) for n in old.nodes if _is_scalar(n)):
        return captured
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(old, env))
    fake_mode = graph_fake_mode(graph)
    if fake_mode is None:
        return captured
    leaves = {env[n]: captured.constants[n.name][1] for n in old.nodes
              if n.op in ("placeholder", "get_attr") and n.name in captured.frozen and n.name in captured.constants}
    changed = False
    numbers: dict[torch.fx.Node, object] = {}
    for node in [n for n in graph.nodes if _is_scalar(n)]:
        readers = _readers(node, device_type)
        number = _known_number(node, leaves, numbers) if readers else None
        if number is None:
            continue
        for reader in readers:
            changed |= _read_as_number(reader, node, number, fake_mode, device_type)
    if not changed:
        return captured
    graph.lint()
    return with_graph(captured, graph)


def _is_scalar(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dim() == 0


def _readers(node: torch.fx.Node, device_type: str) -> list[torch.fx.Node]:
    """The ops with a loop lowering on `device_type` that read `node` as a tensor argument other
    than their first (the operand a loop lowering may take as a number)."""
    found = []
    for user in node.users:
        if user.op != "call_function" or op_key(user) not in LOWERINGS:
            continue
        value = user.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.device.type != device_type:
            continue
        if any(position > 0 for position, _ in _tensor_slots(user, node)):
            found.append(user)
    return found


def _tensor_slots(user: torch.fx.Node, node: torch.fx.Node) -> list[tuple[int, str]]:
    """(position, name) of each `Tensor` / `Tensor?` argument of `user` given as `node`."""
    slots = []
    for position, argument in enumerate(user.target._schema.arguments):  # type: ignore[union-attr]
        kind = argument.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        if not isinstance(kind, torch.TensorType):
            continue
        given = user.args[position] if position < len(user.args) else user.kwargs.get(argument.name)
        if given is node:
            slots.append((position, argument.name))
    return slots


def _known_number(node: torch.fx.Node, leaves: dict[torch.fx.Node, torch.Tensor],
                  numbers: dict[torch.fx.Node, object]) -> bool | int | float | None:
    """The number the 0-dim `node` always holds, when it is computed only from `leaves`
    (constants of fixed value): by pure ops on the CPU, then perhaps copied to the device
    (`torch.tensor(mid - 1).type_as(cuda_tensor)`, one copy from host memory per call); else None."""
    if node not in numbers:
        numbers[node] = _number_of(node, leaves, numbers)
    return numbers[node]  # type: ignore[return-value]


def _number_of(node: torch.fx.Node, leaves: dict[torch.fx.Node, torch.Tensor],
               numbers: dict[torch.fx.Node, object]) -> bool | int | float | None:
    fake = node.meta["val"]
    if fake.device.type != "cpu":
        source = node.args[0] if node.target is aten._to_copy.default and node.args else None
        if not isinstance(source, torch.fx.Node) or not _is_scalar(source):
            return None
        number = _known_number(source, leaves, numbers)
        if number is None:
            return None
        return torch.tensor(number, dtype=source.meta["val"].dtype).to(fake.dtype).item()
    if node in leaves:
        value: torch.Tensor | None = leaves[node]
    else:
        closure = pure_closure(node, pure_op, "val", leaves=frozenset(leaves))
        if closure is None:
            return None
        value = evaluate([n for n in closure if n not in leaves], {n: leaves[n] for n in closure if n in leaves})
    if value is None or is_fake(value) or value.dim() != 0 or value.dtype != fake.dtype or value.is_complex():
        return None
    return value.item()


def _read_as_number(reader: torch.fx.Node, node: torch.fx.Node, number: object, fake_mode: object,
                    device_type: str) -> bool:
    """Put `number` in place of `node` in `reader`'s arguments after the first, if the op (or
    another overload of it that takes a number there: `where.self` -> `where.ScalarSelf`) then
    computes a result of the same dtype, sizes, strides and device and has a loop lowering."""
    slots = [(p, name) for p, name in _tensor_slots(reader, node) if p > 0]
    args, kwargs = list(reader.args), dict(reader.kwargs)
    for position, name in slots:
        if position < len(args):
            args[position] = number
        else:
            kwargs[name] = number
    before = reader.meta["val"]
    fake_args, fake_kwargs = torch.fx.map_arg((tuple(args), kwargs), lambda n: n.meta["val"])
    old = reader.target, reader.args, reader.kwargs
    for overload in _overloads(reader.target):  # type: ignore[arg-type]
        try:
            with fake_mode:  # type: ignore[attr-defined]
                after = overload(*fake_args, **fake_kwargs)
        except (RuntimeError, TypeError, NotImplementedError):
            continue
        if not isinstance(after, torch.Tensor) or (after.dtype, after.shape, after.stride(), after.device) != (
                before.dtype, before.shape, before.stride(), before.device):
            continue
        reader.target, reader.args, reader.kwargs = overload, tuple(args), kwargs
        if supported(reader, device_type):
            return True
        reader.target, reader.args, reader.kwargs = old
    return False


def _overloads(op: torch._ops.OpOverload) -> list[torch._ops.OpOverload]:
    """`op`, then the other functional overloads of its packet."""
    packet = op.overloadpacket
    others = [getattr(packet, name) for name in packet.overloads() if name != op._overloadname]
    return [op] + [o for o in others if not o._schema.is_mutable]
