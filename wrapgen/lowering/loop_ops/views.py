"""Views as index remapping: permute, transpose, expand, reshape, slice, select read their
source at a remapped index instead of copying it."""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from wrapgen.loop_ir import LoopValue, loads, row_vars
from wrapgen.lowering.loop_ops.common import LoopContext, arg, broadcast, fake, out_fake, register


def _remap(ctx: LoopContext, node: torch.fx.Node, index_of: Callable[[tuple], tuple]) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    source = ctx.value(node.args[0])
    index = index_of(row_vars(len(sizes)))
    if ctx.language == "triton" and _gathers_across_rows(source, index, sizes):
        source = ctx.in_memory(node.args[0])
    return LoopValue(sizes, source.at(index), source.dtype)


def _gathers_across_rows(source: LoopValue, index: tuple, sizes: tuple) -> bool:
    """Whether a view (a permute, a transpose, a select of the last dimension) makes the output's
    innermost index walk another dimension of a gathered value than its innermost one. Read
    through the view, neighbouring lanes of a CUDA kernel would gather from different rows of the
    source at positions Triton cannot prove contiguous: a transaction per element (DeBERTa-v2's
    transposed position-to-content gather, fused into the softmax, read 16x the bytes it used).
    Such a value is computed into its own buffer first, its gathers coalesced along its rows,
    and read transposed from there at strides the kernel knows."""
    if not sizes or not index or sympy.sympify(sizes[-1]) == 1:
        return False
    if row_vars(len(sizes))[-1] in sympy.sympify(index[-1]).free_symbols:
        return False  # a reshape or a slice: the innermost position still moves with it
    return any(load.indirect for load in loads(source.body))


@register("aten::permute.default", view=True)
def _permute(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    dims = [d % max(len(node.args[1]), 1) for d in node.args[1]]

    def index_of(out: tuple) -> tuple:
        index = [sympy.Integer(0)] * len(dims)
        for i, d in enumerate(dims):
            index[d] = out[i]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::transpose.int", view=True)
def _transpose(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    rank = fake(node.args[0]).dim()
    a, b = node.args[1] % max(rank, 1), node.args[2] % max(rank, 1)

    def index_of(out: tuple) -> tuple:
        index = list(out)
        if rank:
            index[a], index[b] = out[b], out[a]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::t.default", view=True)
def _t(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    return _remap(ctx, node, lambda out: tuple(reversed(out)))


@register("aten::expand.default", "aten::alias.default", view=True)
def _expand(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    source = ctx.value(node.args[0])
    return LoopValue(sizes, broadcast(source, sizes), source.dtype)


@register("aten::unsqueeze.default", view=True)
def _unsqueeze(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    rank = out_fake(node).dim()
    dim = node.args[1] % rank
    return _remap(ctx, node, lambda out: tuple(v for d, v in enumerate(out) if d != dim))


@register("aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze.default",
          "aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default", view=True,
          check=lambda n: isinstance(fake(n.args[0]), torch.Tensor))
def _reshape(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """A reshape as index arithmetic; dims of size 1 added or removed map without division."""
    in_sizes = ctx.shape(fake(node.args[0]).shape)
    out_sizes = ctx.shape(out_fake(node).shape)

    groups = _reshape_groups(in_sizes, out_sizes)

    def index_of(out: tuple) -> tuple:
        if groups is None:
            return _linearized(in_sizes, out_sizes, out)
        index = [sympy.Integer(0)] * len(in_sizes)
        for in_dims, out_dims in groups:
            linear = sympy.Integer(0)
            for d in out_dims:
                linear = linear * out_sizes[d] + out[d]
            linear = sympy.expand(linear)
            for k, d in enumerate(in_dims):
                inner = sympy.Mul(*(in_sizes[e] for e in in_dims[k + 1:]))
                if k == 0:
                    index[d] = FloorDiv(linear, inner) if inner != 1 else linear
                else:
                    index[d] = ModularIndexing(linear, inner, in_sizes[d])
        return tuple(index)

    return _remap(ctx, node, index_of)


def _same(a: object, b: object) -> bool:
    return sympy.expand(sympy.sympify(a) - b) == 0


def _reshape_groups(in_sizes: list, out_sizes: list) -> list[tuple[list[int], list[int]]] | None:
    """The reshape as groups of dims (size-1 dims left out) whose sizes multiply to the same
    number on both sides, fewest dims per group: [8, 128, 256] -> [8, 128, 8, 32] is
    {0}->{0}, {1}->{1}, {2}->{2, 3}, so its index is 32*x2 + x3 with no division or modulo
    (which keep a loop from vectorizing). None when the sizes do not pair up that way
    (symbolic sizes whose products cannot be compared)."""
    ins = [d for d, s in enumerate(in_sizes) if s != 1]
    outs = [d for d, s in enumerate(out_sizes) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ins) and j < len(outs):
        in_dims, out_dims = [ins[i]], [outs[j]]
        in_size, out_size = sympy.sympify(in_sizes[ins[i]]), sympy.sympify(out_sizes[outs[j]])
        i, j = i + 1, j + 1
        while not _same(in_size, out_size):
            if not (in_size.is_Integer and out_size.is_Integer):
                return None
            if in_size < out_size and i < len(ins):
                in_dims.append(ins[i])
                in_size *= in_sizes[ins[i]]
                i += 1
            elif out_size < in_size and j < len(outs):
                out_dims.append(outs[j])
                out_size *= out_sizes[outs[j]]
                j += 1
            else:
                return None
        groups.append((in_dims, out_dims))
    return groups if i == len(ins) and j == len(outs) else None


def _linearized(in_sizes: list, out_sizes: list, out: tuple) -> tuple:
    """The reshape's index through the flat position, for sizes `_reshape_groups` cannot pair.
    Trailing dims of equal size map one to one; only the leading ones are linearized, so
    [16, 128, 3072] -> [2048, 3072] reads x2, not 256*(x2//3072) + ModularIndexing(x2, 1, 3072)
    (the same index as the store: the kernel may then compute in place)."""
    common = 0
    while common < min(len(in_sizes), len(out_sizes)) - 1 and _same(in_sizes[-1 - common], out_sizes[-1 - common]):
        common += 1
    lead_in, lead_out = len(in_sizes) - common, len(out_sizes) - common
    linear = sympy.Integer(0)
    for d in range(lead_out):
        linear = linear * out_sizes[d] + out[d]
    linear = sympy.expand(linear)
    index = []
    for d in range(lead_in):
        inner = sympy.Mul(*in_sizes[d + 1 : lead_in]) if d + 1 < lead_in else sympy.Integer(1)
        if d == 0:
            index.append(FloorDiv(linear, inner) if inner != 1 else linear)
        else:
            index.append(ModularIndexing(linear, inner, in_sizes[d]))
    return (*index, *out[lead_out:])


def _slice_check(node: torch.fx.Node) -> bool:
    start = arg(node, 2, "start", None)
    step = arg(node, 4, "step", 1)
    size = fake(node.args[0]).shape[arg(node, 1, "dim", 0)]
    if start is None or start == 0:
        return isinstance(step, int)
    if not isinstance(start, int) or not isinstance(step, int):
        return False
    return start > 0 or isinstance(size, int)


@register("aten::slice.Tensor", view=True, check=_slice_check)
def _slice(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = arg(node, 1, "dim", 0) % source.dim()
    start = arg(node, 2, "start", None) or 0
    step = arg(node, 4, "step", 1)
    if start < 0:
        start = max(start + int(source.shape[dim]), 0)

    def index_of(out: tuple) -> tuple:
        index = list(out)
        index[dim] = start + step * out[dim]
        return tuple(index)

    return _remap(ctx, node, index_of)


@register("aten::select.int", view=True, check=lambda n: isinstance(n.args[2], int) and (n.args[2] >= 0 or isinstance(fake(n.args[0]).shape[n.args[1]], int)))
def _select(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = node.args[1] % source.dim()
    index_value = node.args[2] if node.args[2] >= 0 else node.args[2] + int(source.shape[dim])

    def index_of(out: tuple) -> tuple:
        index = list(out)
        index.insert(dim, sympy.Integer(index_value))
        return tuple(index)

    return _remap(ctx, node, index_of)
