"""In-place scatters into state (`index_put_`, `index_copy_`) as kernels that store at positions
read from an index tensor.

A KV-cache update is `cache.index_copy_(2, position, k)` or `cache[:, :, position] = k`, and
after aot_autograd and the reinplace pass (graph_passes/reinplace.py) an `index_put_` into the
cache input. As a library call it is a kernel of its own per cache per layer, reading `k` from
memory (16 launches per decode step of an 8-layer model, 2 µs each at batch 1). As a compute
node whose store index holds the position (`ComputeNode.store_indirect`), the rotary embedding
that computes `k` stores it straight into the cache, and the key and value writes of a layer
share one kernel.

An index outside the dimension (after a negative `index_put_` index is wrapped, as eager does)
stores nothing and is reported as a gather's is: C++ kernels return a status the caller raises
on, Triton kernels fail a device assert (where Triton checks them). Duplicate indices leave one
of the written values, as eager's do (which one is unspecified there too). What this module does
not take (accumulate, boolean masks, indices apart, another dtype, a destination another kernel
could not store into) stays a library call.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Apply, ComputeNode, Const, IndexValue, Indirect, Load, compute_dtype, loads, row_vars
from wrapgen.lowering.graph_lowering import Buffer
from wrapgen.lowering.loop_ops.common import SUPPORTED_DTYPES, broadcast, cast, fake, is_unbacked, op_key

_INDEX_PUT = "aten::index_put_.default"
_INDEX_COPY = "aten::index_copy_.default"


@dataclass(frozen=True)
class ScatterPlan:
    """Which dimensions of the destination are indexed (`first` .. `first + len(indices) - 1`),
    by which index nodes (broadcast together to `index_shape`), what is written (`values`,
    broadcast to the region the indices select) and whether negative indices count from the end."""

    first: int
    indices: tuple[torch.fx.Node, ...]
    index_shape: tuple
    region: tuple
    values: torch.fx.Node
    wrap_negative: bool


def is_scatter_in_place(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and op_key(node) in (_INDEX_PUT, _INDEX_COPY)


def scatter_plan(node: torch.fx.Node) -> ScatterPlan | None:
    """The plan of an in-place scatter a kernel can store, from the graph's fake tensors; None
    when it stays a library call."""
    key = op_key(node)
    destination = fake(node.args[0])
    if not isinstance(destination, torch.Tensor) or destination.dim() == 0:
        return None
    if key == _INDEX_PUT:
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        indices, values = node.args[1], node.args[2]
        if accumulate or not isinstance(indices, (list, tuple)) or len(indices) > destination.dim():
            return None
        dims = [d for d, i in enumerate(indices) if i is not None]
        if not dims or dims != list(range(dims[0], dims[-1] + 1)):
            return None  # indices apart put the indexed dims first: not handled here
        first, chosen, wrap = dims[0], tuple(indices[d] for d in dims), True
    elif key == _INDEX_COPY:
        dim, index, values = node.args[1], node.args[2], node.args[3]
        if not isinstance(dim, int) or not isinstance(fake(index), torch.Tensor) or fake(index).dim() != 1:
            return None
        first, chosen, wrap = dim % destination.dim(), (index,), False
    else:
        return None
    index_fakes = [fake(i) for i in chosen]
    source = fake(values)
    if not all(isinstance(f, torch.Tensor) and f.dtype in (torch.int64, torch.int32) for f in index_fakes):
        return None  # a boolean mask selects a data-dependent number of elements
    if any(f.device != destination.device for f in index_fakes):
        return None  # eager takes CPU indices into a CUDA tensor; a kernel cannot read them
    if not isinstance(source, torch.Tensor) or source.dtype != destination.dtype or source.device != destination.device:
        return None
    if destination.dtype not in SUPPORTED_DTYPES:
        return None
    if any(is_unbacked(s) for t in (destination, source, *index_fakes) for s in t.shape):
        return None
    try:
        index_shape = tuple(torch.broadcast_shapes(*(f.shape for f in index_fakes)))
        region = (*destination.shape[:first], *index_shape, *destination.shape[first + len(chosen):])
        if tuple(torch.broadcast_shapes(source.shape, region)) != region:
            return None
    except RuntimeError:
        return None
    if key == _INDEX_COPY and tuple(source.shape) != region:
        return None
    if any(s == 0 for s in region if isinstance(s, int)):
        return None
    return ScatterPlan(first, chosen, index_shape, region, values, wrap)


def store_scatter(low, node: torch.fx.Node) -> Buffer | None:
    """Add the compute node that stores `node`'s values into its destination at the indexed
    positions; the destination (the op's result) or None when a library call must do it."""
    from wrapgen.lowering.mutation import _writable

    plan = scatter_plan(node)
    destination = low.values.get(node.args[0])
    if plan is None or low.language is None or not isinstance(destination, Buffer) or not _writable(low, destination):
        return None
    region = low.shape(plan.region)
    xs = row_vars(len(region))
    root = low.mutations.root
    indirect = []
    positions = []
    broadcast_rank = len(plan.index_shape)
    destination_sizes = destination.type.sizes
    for number, index_node in enumerate(plan.indices):
        index = low.value(index_node)
        if any(root(ld.buffer) == destination.root for ld in loads(index.body)):
            return None  # it reads its positions from what it overwrites
        offset = plan.first + broadcast_rank - len(index.sizes)
        at = tuple(sympy.Integer(0) if sympy.sympify(s) == 1 and sympy.sympify(region[offset + e]) != 1
                   else xs[offset + e] for e, s in enumerate(index.sizes))
        picked = cast(index.at(at), torch.int64)
        size = destination_sizes[plan.first + number]
        if plan.wrap_negative:
            picked = Apply("where", (Apply("lt", (picked, Const(0, torch.int64)), torch.bool),
                                     Apply("add", (picked, IndexValue(size, torch.int64)), torch.int64), picked),
                           torch.int64)
        symbol = sympy.Symbol(f"scatter_{node.name}_{number}", integer=True)
        positions.append(symbol)
        indirect.append(Indirect(symbol, picked, size))
    values = low.value(plan.values)
    body = cast(broadcast(values, region), compute_dtype(destination.type.dtype))
    if any(root(ld.buffer) == destination.root for ld in loads(body)):
        # it writes what it reads (a shifted cache): compute the values into a buffer first
        buffer = low.realize_dense(values, "scatter_source")
        body = cast(broadcast(low.load(buffer), region), compute_dtype(destination.type.dtype))
    target = low.load(destination).body
    assert isinstance(target, Load)
    count = len(plan.indices)
    dvars = row_vars(len(destination_sizes))
    mapping = {dvars[d]: xs[d] for d in range(plan.first)}
    mapping.update({dvars[plan.first + i]: positions[i] for i in range(count)})
    mapping.update({dvars[d]: xs[d - count + broadcast_rank] for d in range(plan.first + count, len(destination_sizes))})
    store_index = sympy.expand(sympy.sympify(target.index).xreplace(mapping))
    low.mutations.mutated.add(destination.root)
    origin = op_key(node).split("::")[1].split(".")[0]
    low._add_compute(ComputeNode(low.fresh("write"), destination.type.dtype, region, body, store_index, origin=origin,
                                 target=destination.name, store_indirect=tuple(indirect)))
    return destination
