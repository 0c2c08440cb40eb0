"""Gathers as loop bodies: embedding, index_select and gather read their source at an index
loaded from data (an index out of range raises IndexError on every target)."""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch
import torch.fx

from wrapgen.loop_ir import Body, Indirect, Load, LoopValue, row_vars
from wrapgen.lowering.loop_ops.common import SUPPORTED_DTYPES, LoopContext, arg, fake, is_unbacked, out_fake, register
from wrapgen.lowering.loop_ops.computed_gathers import gather_computed


def _gather_check(source: object, index: object, out: object) -> bool:
    tensors = (source, index, out)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or index.dtype not in (torch.int64, torch.int32):
        return False
    if source.dtype not in SUPPORTED_DTYPES or source.dim() == 0:
        return False
    return not any(is_unbacked(s) for t in tensors for s in t.shape)


def _gather_along(ctx: LoopContext, node: torch.fx.Node, source_node: torch.fx.Node, dim: int,
                  index_at: Callable[[tuple], Body], index_rank: int) -> LoopValue:
    """out[..., i_0..i_{k-1}, ...] = source[..., index[i_0..i_{k-1}], ...]: the `index_rank`
    output dimensions at `dim` walk the index tensor, whose value picks the source position."""
    xs = row_vars(out_fake(node).dim())
    return _read_at(ctx, node, source_node, dim, lambda p: (*xs[:dim], p, *xs[dim + index_rank:]),
                    index_at(xs[dim:dim + index_rank]))


def _read_at(ctx: LoopContext, node: torch.fx.Node, source_node: torch.fx.Node, dim: int,
             where: Callable[[sympy.Symbol], tuple], position_value: Body) -> LoopValue:
    """The output element reads the source at `where(p)`, p being `position_value` (an index
    read from data) along the source's dimension `dim`."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    position = sympy.Symbol(f"gather_{node.name}", integer=True)
    computed = ctx.value(source_node)
    chosen = Indirect(position, position_value, computed.sizes[dim])
    inlined = gather_computed(computed, where(position), chosen)
    if inlined is not None:
        return LoopValue(sizes, inlined, computed.dtype)
    source = ctx.in_memory(source_node)
    read = source.at(where(position))
    assert isinstance(read, Load) and not read.indirect, read  # in_memory gives a plain load
    return LoopValue(sizes, Load(read.buffer, read.index, read.dtype, (chosen,)), read.dtype)


@register("aten::embedding.default",
          check=lambda n: fake(n.args[0]).dim() == 2 and _gather_check(fake(n.args[0]), fake(n.args[1]), out_fake(n)))
def _embedding(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """Rows of the weight picked by the indices (padding_idx and the rest only matter for the
    backward)."""
    indices = ctx.value(node.args[1])
    return _gather_along(ctx, node, node.args[0], 0, indices.at, len(indices.sizes))


@register("aten::index_select.default",
          check=lambda n: fake(n.args[2]).dim() <= 1 and _gather_check(fake(n.args[0]), fake(n.args[2]), out_fake(n)))
def _index_select(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    source = fake(node.args[0])
    dim = node.args[1] % source.dim()
    index = ctx.value(node.args[2])
    if not index.sizes:  # a 0-dim index selects one position; the output keeps the dimension
        return _gather_along(ctx, node, node.args[0], dim, lambda _: index.body, 1)
    return _gather_along(ctx, node, node.args[0], dim, index.at, 1)


@register("aten::gather.default",
          check=lambda n: not arg(n, 3, "sparse_grad", False) and fake(n.args[0]).dim() == fake(n.args[2]).dim()
          and _gather_check(fake(n.args[0]), fake(n.args[2]), out_fake(n)))
def _gather(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[i..] = self[i.. with dimension `dim` replaced by index[i..]] (the output has the
    index's shape, which may be smaller than self's in the other dimensions)."""
    dim = node.args[1] % fake(node.args[0]).dim()
    index = ctx.value(node.args[2])
    xs = row_vars(len(index.sizes))
    return _read_at(ctx, node, node.args[0], dim, lambda p: (*xs[:dim], p, *xs[dim + 1:]), index.at(xs))
