"""Values a graph computes from no input and no weight, computed once at compile time.

A model that builds a table in `forward` from Python numbers alone (BEiT's relative-position
index: `arange`, `meshgrid`, subtractions, a `zeros` filled by slices) is traced by torch.export
as the ops that build it, so the program would rebuild it on every call. Worse, BEiT builds it on
the CPU and indexes a CUDA table with it: every call then copies it to the GPU from pageable
memory, a copy the host waits for (12 per call, which made BEiT run at half of Inductor's speed
on an H200 with a GPU time within 10% of it). Dynamo evaluates such code while tracing; this pass
does the same on the ATen graph: each value that reads no input and no weight (weights can
change between calls; tensors the traced code made from Python data, which torch.export lifts
into constants, cannot), draws no random numbers and writes nothing, and that a value depending
on an input reads, is evaluated for real and becomes a program constant.
A CPU value read only as the indices of an indexing op on another device becomes a constant on
that device, where the op would have copied it.

Not folded: values the program returns or that are viewed or written by what reads them (a
constant is shared between calls, and eager returns a fresh tensor each time), values larger than
`FOLD_BYTES`, and subgraphs of creation ops alone (`zeros`, `full`, `arange`: a kernel fills them at
memory speed without holding memory for the program's life; `constant_folding.py` keeps small ones).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, graph_fake_mode, with_graph
from wrapgen.lowering.constant_folding import FOLDABLE_OPS, argument_aliases, only_read
from wrapgen.lowering.graph_passes.constant_masks import evaluate, pure_closure, pure_op

FOLD_BYTES = 16 << 20  # a folded value is held for the program's life
_INDEXING_OPS = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_put", "aten::_unsafe_index_put"})


def fold_input_free_values(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with every foldable input-free value replaced by a constant placeholder (a new
    graph), or `captured` itself when there is none."""
    graph = captured.graph_module.graph
    # constants the traced code made from Python data (torch.export's lifted tensors, the tensor
    # attributes of aot_autograd's graphs) are leaves of known value; parameters and buffers are
    # not: they can change between calls
    known = {n: captured.constants[n.name][1] for n in graph.nodes
             if n.op in ("placeholder", "get_attr") and n.name in captured.frozen and n.name in captured.constants}
    input_free: set[torch.fx.Node] = set(known)
    for node in graph.nodes:
        if pure_op(node) and all(a in input_free for a in node.all_input_nodes):
            input_free.add(node)
    frontier = [n for n in graph.nodes if n in input_free and n not in known
                and any(u not in input_free for u in n.users)]
    folds: dict[str, tuple[torch.Tensor, str]] = {}
    for node in frontier:
        value = _folded(node, input_free, known)
        if value is not None:
            folds[node.name] = value
    if not folds:
        return captured
    return _with_constants(captured, folds, _repeated_values(folds))


def _repeated_values(folds: dict[str, tuple[torch.Tensor, str]]) -> dict[str, str]:
    """For each folded value equal to an earlier one (sizes, strides, dtype, device and every
    element), that earlier one's name: the program holds it once. Each layer of a model builds
    the same table (ConViT's ten attention layers each made its [batch * 196 * 196, 3] relative
    positions: 74 MB held at batch 32 in bf16 where 7.4 do)."""
    kept: dict[tuple, list[str]] = {}
    same: dict[str, str] = {}
    for name, (value, _) in folds.items():
        key = (tuple(value.shape), tuple(value.stride()), value.dtype, value.device)
        candidates = kept.setdefault(key, [])
        first = next((c for c in candidates if torch.equal(folds[c][0], value)), None)
        if first is None:
            candidates.append(name)
        else:
            same[name] = first
    return same


def _folded(node: torch.fx.Node, input_free: set[torch.fx.Node], known: dict[torch.fx.Node, torch.Tensor]
            ) -> tuple[torch.Tensor, str] | None:
    """(`node`'s value, on the device it is read on; what the constant is) when it is worth
    folding and nothing can observe that it is shared between calls, else None."""
    closure = pure_closure(node, lambda n: n in input_free, "val", leaves=frozenset(known))
    if closure is None or not only_read(node) or any(_written_later(n, input_free) for n in closure):
        return None
    calls = [n for n in closure if n not in known]
    if all(n.target._schema.name in FOLDABLE_OPS for n in calls):  # type: ignore[union-attr]
        return None
    fake = node.meta["val"]
    if fake.numel() * fake.element_size() > FOLD_BYTES or not _dense(fake):
        return None
    value = evaluate(calls, {n: known[n] for n in closure if n in known})
    if value is None or value.dtype != fake.dtype or value.shape != fake.shape:
        return None
    constant = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=_index_device(node) or fake.device)
    constant.copy_(value)  # its own storage, at exactly the traced strides
    ops = list(dict.fromkeys(n.target._schema.name.removeprefix("aten::") for n in calls))  # type: ignore[union-attr]
    return constant, f"computed at compile time from no input ({', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''})"


def _written_later(node: torch.fx.Node, input_free: set[torch.fx.Node]) -> bool:
    """Whether a reader outside the input-free values may write `node` in place (an earlier pass
    made an update in-place): a value computed from it before the write would be stale."""
    for user in node.users:
        if user in input_free or user.op == "output":
            continue
        if not isinstance(user.target, torch._ops.OpOverload):
            return True
        if any(alias is not None and alias.is_write for alias in argument_aliases(user, node)):
            return True
    return False


def _dense(fake: torch.Tensor) -> bool:
    """Strides that a tensor of its own storage can have (no overlap, no gaps): the constant is
    made at exactly the traced layout."""
    return fake.is_contiguous() or fake.is_contiguous(memory_format=torch.channels_last) or fake.dim() <= 1


def _index_device(node: torch.fx.Node) -> torch.device | None:
    """The device of the tensor a CPU `node` indexes, when every reader uses it as indices of an
    indexing op on one other device (the op would copy it there on every call)."""
    if node.meta["val"].device.type != "cpu":
        return None
    devices = set()
    for user in node.users:
        op = user.target
        if not isinstance(op, torch._ops.OpOverload) or op._schema.name not in _INDEXING_OPS:
            return None
        indices = user.args[1] if len(user.args) > 1 else user.kwargs.get("indices")
        source = user.args[0]
        if (not isinstance(indices, (list, tuple)) or node not in indices or node is source
                or not isinstance(source, torch.fx.Node)):
            return None
        devices.add(source.meta["val"].device)
    (device,) = devices if len(devices) == 1 else (None,)
    return device if device is not None and device.type != "cpu" else None


def _static_fake(value: torch.Tensor, fake_mode: object) -> torch.Tensor:
    """A fake tensor of `value`'s sizes and strides as plain integers (`from_tensor` would give it
    size symbols no input binds)."""
    if fake_mode is None:
        return value
    with fake_mode:  # type: ignore[attr-defined]
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def _with_constants(captured: CapturedGraph, folds: dict[str, tuple[torch.Tensor, str]],
                    same: dict[str, str]) -> CapturedGraph:
    """A copy of the graph where each folded value is a new placeholder after the old ones (so
    `with_graph` pairs the old placeholders up as before), one for values in `same` and the one
    they equal, and the nodes only they read are gone."""
    old = captured.graph_module.graph
    new = torch.fx.Graph()
    new._codegen = old._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    fake_mode = graph_fake_mode(old)
    added: dict[str, tuple[str, torch.Tensor]] = {}
    first_call: torch.fx.Node | None = None
    placeholders: dict[str, torch.fx.Node] = {}
    for node in old.nodes:
        if node.name in same:  # equal to a value folded before it (earlier in the graph)
            env[node] = placeholders[same[node.name]]
            continue
        if node.name in folds:
            value, origin = folds[node.name]
            assert first_call is not None  # a folded value is computed by calls
            with new.inserting_before(first_call):
                placeholder = new.placeholder(f"{node.name}_folded")
            placeholder.meta["val"] = _static_fake(value, fake_mode)
            added[placeholder.name] = (origin, value)
            env[node] = placeholders[node.name] = placeholder
            continue
        env[node] = new.node_copy(node, lambda n: env[n])
        if first_call is None and node.op != "placeholder":
            first_call = env[node]
    new.eliminate_dead_code()
    new.lint()
    rewritten = with_graph(captured, new)
    present = {n.name for n in new.nodes}  # a get_attr constant only folded values read is gone
    kept = {name: c for name, c in rewritten.constants.items() if name in present}
    return dataclasses.replace(rewritten, constants={**kept, **added})
