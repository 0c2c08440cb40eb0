"""Writes into storage the program does not own (inputs, parameters, buffers, constants, views
of them), and into buffers a library call updates in place, as ordinary steps of the lowering.

Three rules keep every read on the version the source program meant (ARCHITECTURE.md, rule 6):
- Before a line writes a storage, every value still held as a loop body (inlined into later
  consumers, not yet in memory) that reads that storage is computed into a buffer of its own:
  a deferred read must not move past the write (`MutationTracker.before_write`).
- A `copy_` into such storage (aot_autograd's input-mutation epilogue, torch.export's write-back,
  or an in-place op) becomes a compute node that stores into it (`ComputeNode.target`): the new
  value is written once, in place, by the kernel that computes it, when the value reads the
  storage only at the element it writes (else it is computed into a buffer first).
- The scheduler moves a node only where no access of the same storage lies between
  (`StateOrder.blocked`): a kernel runs where its group's last member was, so a member reading a
  storage may not pass a write of it, nor a member writing it pass another access; inside one
  kernel, a write fuses only with reads of the very element it writes, made before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import ComputeNode, Load, LoopValue, compute_dtype, loads, node_loads, row_vars
from wrapgen.lowering.graph_lowering import Buffer
from wrapgen.lowering.scheduler import FusionGroup, Member, unit_vars
from wrapgen.wrapper_ir.lines import WrapperLine

_COPY = "aten::copy_.default"


class MutationTracker:
    """Per-graph state: which buffer lives in which storage, which values are deferred reads of
    which storage, and which storages the program writes in place."""

    def __init__(self, lowering) -> None:
        self.lowering = lowering
        self.root_of: dict[str, str] = {}
        self.deferred: dict[str, set[torch.fx.Node]] = {}  # root -> nodes whose loop value loads it
        self.mutated: set[str] = set()  # roots written in place
        self.active = True  # whether the graph writes anything in place (else nothing is indexed)

    def root(self, name: str) -> str:
        return self.root_of.get(name, name)

    def record(self, node: torch.fx.Node, value: object) -> None:
        """Note the storages of a lowered value, and the storages a deferred value reads."""
        if not self.active:
            return
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, Buffer):
                self.root_of[v.name] = v.root
            elif isinstance(v, LoopValue):
                for ld in loads(v.body):
                    self.deferred.setdefault(self.root(ld.buffer), set()).add(node)

    def before_write(self, roots: Iterable[str], writer: object, keep: object = None) -> None:
        """Compute into memory every deferred value that reads one of `roots` and that a node
        not lowered yet reads. `keep` (the value `writer` stores) stays deferred when `writer` is
        its only reader left: the writing kernel reads it at each element before storing it."""
        low = self.lowering
        for root in roots:
            self.mutated.add(root)
            for node in sorted(self.deferred.pop(root, ()), key=lambda n: n.name):
                value = low.values.get(node)
                pending = [u for u in node.users if u not in low.values and not (node is keep and u is writer)]
                if not pending or not _reads_root(value, root, self.root):
                    if node is keep:
                        self.deferred.setdefault(root, set()).add(node)
                    continue
                low.values[node] = _realized(low, node, value)
                self.record(node, low.values[node])

    def realize_in_place(self, node: torch.fx.Node, value: LoopValue, placeholder: torch.fx.Node) -> Buffer | None:
        """Compute `value` (node's, to be stored into `placeholder` at the end) into the
        placeholder's storage now, so it is written once; the later store then copies the
        storage onto itself, which `copy_into` drops. None where a kernel cannot store it there."""
        destination = self.lowering.values.get(placeholder)
        if not isinstance(destination, Buffer):
            return None
        self.before_write({destination.root}, node, None)
        if not self.copy_into(destination, value, "in_place"):
            return None
        return destination

    def written_roots(self, node: torch.fx.Node) -> set[str]:
        """The storages a library call (or copy_) writes, from its schema's mutable arguments."""
        from wrapgen.lowering.graph_lowering import _mutated_argument_indices
        from wrapgen.lowering.user_triton import is_user_triton

        target = node.target
        values = self.lowering.values
        if is_user_triton(target):  # a user kernel may write any tensor it is given
            return {v.root for n in node.all_input_nodes if isinstance(v := values.get(n), Buffer)}
        if not isinstance(target, torch._ops.OpOverload):
            return set()
        roots = set()
        for index in _mutated_argument_indices(target):
            argument = target._schema.arguments[index]
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            for v in value if isinstance(value, (list, tuple)) else (value,):
                lowered = values.get(v) if isinstance(v, torch.fx.Node) else None
                if isinstance(lowered, Buffer):
                    roots.add(lowered.root)
        return roots

    def copy_into(self, destination: Buffer, source: object, origin: str) -> bool:
        """Store `source` (a lowered value) into `destination` with a generated kernel; False
        when a library call must do it (another device, dtype, an overlapping destination)."""
        low = self.lowering
        if low.language is None or not _writable(low, destination):
            return False
        if isinstance(source, Buffer):
            if source.name == destination.name:
                return True
            if source.type.device != destination.type.device:
                return False
            value = low.load(source)
        elif isinstance(source, LoopValue):
            value = source
        else:
            return False
        from wrapgen.lowering.loop_ops.common import SUPPORTED_DTYPES, broadcast, cast

        if value.dtype not in SUPPORTED_DTYPES or destination.type.dtype not in SUPPORTED_DTYPES:
            return False
        sizes = destination.type.sizes
        if len(value.sizes) > len(sizes):
            return False
        target = low.load(destination).body
        assert isinstance(target, Load)
        body = cast(broadcast(value, sizes), compute_dtype(destination.type.dtype))
        unit = {x: sympy.Integer(0) for x, n in zip(row_vars(len(sizes)), sizes) if sympy.sympify(n) == 1}
        for ld in loads(body):
            if self.root(ld.buffer) == destination.root and not _same_element(ld, target, unit):
                # it reads other elements of what it overwrites: compute it into a buffer first
                buffer = low.realize_dense(value, "copy_source")
                self.root_of[buffer.name] = buffer.name
                body = cast(broadcast(low.load(buffer), sizes), compute_dtype(destination.type.dtype))
                break
        self.mutated.add(destination.root)
        node = ComputeNode(low.fresh("write"), destination.type.dtype, sizes, body, target.index, origin=origin,
                           target=destination.name)
        low._add_compute(node)
        return True


def written_back(graph: torch.fx.Graph, mutations: dict[int, str]) -> dict[torch.fx.Node, torch.fx.Node]:
    """Values the graph ends by storing into a placeholder (source node -> placeholder) whose old
    value nothing reads after the source is computed: such a value may be computed straight into
    the placeholder's storage, once (`MutationTracker.realize_in_place`). The stores are
    aot_autograd's `copy_(input, value)` epilogues and torch.export's mutation outputs."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    pairs: list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]] = []  # (source, placeholder, store)
    for node in nodes:
        if is_copy(node) and all(isinstance(a, torch.fx.Node) for a in node.args[:2]) and node.args[0].op == "placeholder":
            pairs.append((node.args[1], node.args[0], node))
    output = next(n for n in reversed(nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    for index, name in mutations.items():
        if index < len(values) and isinstance(values[index], torch.fx.Node) and name in placeholders:
            pairs.append((values[index], placeholders[name], output))
    found: dict[torch.fx.Node, torch.fx.Node] = {}
    stores = [p for _, p, _ in pairs]
    for source, placeholder, store in pairs:
        if source.op != "call_function" or stores.count(placeholder) != 1 or source in found:
            continue
        fake, target = source.meta.get("val"), placeholder.meta.get("val")
        if not (isinstance(fake, torch.Tensor) and isinstance(target, torch.Tensor)):
            continue
        if fake.shape != target.shape or fake.dtype != target.dtype:
            continue
        if any(order[u] > order[source] and u is not store for u in placeholder.users):
            continue  # the old value is read after the new one exists
        found[source] = placeholder
    return found


def _reads_root(value: object, root: str, root_of: Callable[[str], str]) -> bool:
    values = value if isinstance(value, tuple) else (value,)
    return any(isinstance(v, LoopValue) and any(root_of(ld.buffer) == root for ld in loads(v.body)) for v in values)


def _realized(low, node: torch.fx.Node, value: object) -> object:
    fakes = node.meta.get("val")
    if isinstance(value, tuple):
        return tuple(low.realize(v, f, "before_write") if isinstance(v, LoopValue) else v for v, f in zip(value, fakes))
    return low.realize(value, fakes, "before_write")


def _same_element(ld: Load, target: Load, unit: dict) -> bool:
    return (ld.buffer == target.buffer and not ld.indirect
            and sympy.expand((ld.index - target.index).xreplace(unit)) == 0)


def _writable(low, destination: Buffer) -> bool:
    """A destination on the kernels' device whose elements are each stored once (no size > 1
    dimension of stride 0, no two dimensions overlapping), judged at the symbols' hints."""
    type_ = destination.type
    if type_.device != low.device or type_.strides is None:
        return False
    hints = {info.symbol: info.hint for info in low.symbols.infos()}
    try:
        dims = sorted((int(sympy.sympify(st).xreplace(hints)), int(sympy.sympify(sz).xreplace(hints)))
                      for st, sz in zip(type_.strides, type_.sizes))
    except TypeError:
        return False
    span = 1
    for stride, extent in dims:
        if extent == 1:
            continue
        if stride < span:
            return False
        span = stride * extent
    return True


def writes_in_place(graph: torch.fx.Graph, mutations: dict[int, str]) -> bool:
    """Whether anything in the graph writes storage in place (an op with a mutable argument, a
    user Triton kernel, a write-back of a mutated input): the lowering tracks state only then."""
    from wrapgen.lowering.graph_lowering import _mutated_argument_indices
    from wrapgen.lowering.user_triton import is_user_triton

    if mutations:
        return True
    for node in graph.nodes:
        target = node.target
        if node.op == "call_function" and (is_user_triton(target) or isinstance(target, torch._ops.OpOverload)
                                           and _mutated_argument_indices(target)):
            return True
    return False


def is_copy(node: torch.fx.Node) -> bool:
    from wrapgen.lowering.loop_ops import op_key

    return op_key(node) == _COPY


class StateOrder:
    """Where each storage written in place is read and written, by line position; answers
    whether the scheduler may extend a group (`blocked`)."""

    def __init__(self, lines: list[WrapperLine], compute: dict[str, ComputeNode], tracker: MutationTracker,
                 pending_type: type) -> None:
        self.root = tracker.root
        self.position: dict[str, int] = {}
        self.reads: dict[str, list[int]] = {}
        self.writes: dict[str, list[int]] = {}
        self.node_reads: dict[str, set[str]] = {}
        self.node_writes: dict[str, set[str]] = {}
        mutated = tracker.mutated
        for i, line in enumerate(lines):
            if isinstance(line, pending_type):
                node = compute[line.name]
                reads = {self.root(ld.buffer) for ld in node_loads(node)} & mutated
                writes = {self.root(node.target)} if node.target else set()
                self.node_reads[node.name], self.node_writes[node.name] = reads, writes
                self.position[node.name] = i
            else:
                reads = {self.root(u) for u in line.uses()} & mutated
                writes = {self.root(w) for w in getattr(line, "writes", ())} & mutated
            for r in reads:
                self.reads.setdefault(r, []).append(i)
            for w in writes:
                self.writes.setdefault(w, []).append(i)

    def blocked(self, extended: FusionGroup, member: Member) -> bool:
        """Whether `member` (the last of `extended`, in the group's variables) joining the group
        would run a read of a storage after a write of it that the program placed later, or the
        reverse."""
        name = member.node.name
        here = self.position[name]
        others = extended.members[:-1]
        at = {self.position[m.node.name] for m in others}
        for m in others:
            p = self.position[m.node.name]
            for root in self.node_reads[m.node.name]:
                if any(p < q < here and q not in at for q in self.writes.get(root, ())):
                    return True
            for root in self.node_writes[m.node.name]:
                if any(p < q < here and q not in at for q in (*self.reads.get(root, ()), *self.writes.get(root, ()))):
                    return True
        if any(m.level != "row" and self.node_writes[m.node.name] for m in extended.members):
            return True  # inside a reduction's loop a later pass may recompute a value from it
        if extended.reduced and any(m.node.store_indirect for m in extended.members):
            return True  # scatters are stored by pointwise kernels only
        written = set().union(*(self.node_writes[m.node.name] for m in others))
        if self.node_reads[name] & written:
            return True  # a read of a storage after its write in the same kernel
        for root in self.node_writes[name]:
            if root in written:
                return True
            unit = unit_vars(extended)
            store = Load(member.node.target, member.node.store_index, member.node.dtype, member.node.store_indirect)
            for m in others:
                for ld in node_loads(m.node):
                    if self.root(ld.buffer) == root and (m.level != "row" or not _same_element(ld, store, unit)):
                        return True
        return False
