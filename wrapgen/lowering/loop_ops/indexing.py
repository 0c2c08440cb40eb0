"""Ops that pick which element to read, as loop bodies: `cat` selects among its inputs by index
ranges, `index.Tensor` gathers at indices read from data, and `cumsum` along a short static
dimension is a masked sum. Each becomes part of a fused kernel instead of a library call
(Llama's rotate_half, ViT's class token, the attention-mask and position-id construction)."""

from __future__ import annotations

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from wrapgen.loop_ir import (
    Apply,
    Body,
    Const,
    IndexMax,
    IndexMin,
    IndexValue,
    Indirect,
    Load,
    LoopValue,
    compute_dtype,
    row_vars,
)
from wrapgen.lowering.loop_ops.common import (
    SUPPORTED_DTYPES,
    LoopContext,
    arg,
    cast,
    fake,
    is_unbacked,
    out_fake,
    register,
    zero,
)

# cumsum as a masked sum does n*n work per row of length n (the library's scan does n): cheap
# for the short rows models scan (position ids, masks), and it fuses with what feeds it.
CUMSUM_KERNEL_LIMIT = 1024


def _index(expr: sympy.Expr) -> Body:
    return IndexValue(sympy.sympify(expr), torch.int64)


# -- cat --------------------------------------------------------------------------------------


def _cat_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs that contribute elements: legacy 1-d empty tensors and empty slices are skipped."""
    rank = out_fake(node).dim()
    dim = arg(node, 1, "dim", 0) % max(rank, 1)
    kept = []
    for t in node.args[0]:
        f = fake(t)
        if f.dim() == 1 and rank != 1 and f.shape[0] == 0:
            continue
        if f.shape[dim] == 0:
            continue
        kept.append(t)
    return kept


def _cat_check(node: torch.fx.Node) -> bool:
    tensors = node.args[0]
    if not isinstance(tensors, (list, tuple)) or not tensors or not isinstance(arg(node, 1, "dim", 0), int):
        return False
    if not all(isinstance(t, torch.fx.Node) and isinstance(fake(t), torch.Tensor) for t in tensors):
        return False
    return out_fake(node).dim() > 0 and bool(_cat_inputs(node))


@register("aten::cat.default", check=_cat_check)
def _cat(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """Element x of the result is input k's element x - start_k along `dim`, for the k whose
    range holds x. Every input is read at an index clamped into its own range (the value of
    the inputs not chosen is discarded), so no load leaves its buffer."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dim = arg(node, 1, "dim", 0) % len(sizes)
    dtype = compute_dtype(out.dtype)
    xs = row_vars(len(sizes))
    pieces: list[tuple[sympy.Expr, Body]] = []
    start = sympy.Integer(0)
    inputs = _cat_inputs(node)
    for number, t in enumerate(inputs):
        value = ctx.value(t)
        length = value.sizes[dim]
        position = xs[dim] - start
        if number > 0:
            position = IndexMax(position, 0)
        if number < len(inputs) - 1:
            position = IndexMin(position, length - 1)
        index = (*xs[:dim], position, *xs[dim + 1:])
        start = start + length
        pieces.append((start, cast(value.at(index), dtype)))
    body = pieces[-1][1]
    for end, piece in reversed(pieces[:-1]):
        body = Apply("where", (Apply("lt", (_index(xs[dim]), _index(end)), torch.bool), piece, body), dtype)
    return LoopValue(sizes, body, out.dtype)


# -- cumsum -----------------------------------------------------------------------------------


def _cumsum_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    if not isinstance(source, torch.Tensor) or source.dim() == 0 or not isinstance(node.args[1], int):
        return False
    if out_fake(node).dtype not in SUPPORTED_DTYPES or out_fake(node).dtype == torch.bool:
        return False
    length = source.shape[node.args[1] % source.dim()]
    return isinstance(length, int) and length <= CUMSUM_KERNEL_LIMIT


@register("aten::cumsum.default", check=_cumsum_check)
def _cumsum(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """out[..., j, ...] = sum over r <= j of x[..., r, ...]: a sum over an extra dimension with
    the elements past j masked to zero (accumulated as sums are: float32 for half, int64 for
    integers and bool)."""
    out = out_fake(node)
    source = ctx.value(node.args[0])
    rank = len(source.sizes)
    dim = node.args[1] % rank
    xs = row_vars(rank + 1)
    dtype = compute_dtype(out.dtype)
    read = cast(source.at((*xs[:dim], xs[rank], *xs[dim + 1:rank])), dtype)
    keep = Apply("le", (_index(xs[rank]), _index(xs[dim])), torch.bool)
    body = Apply("where", (keep, read, zero(dtype)), dtype)
    sizes = (*source.sizes, source.sizes[dim])
    return ctx.reduce(LoopValue(sizes, body, out.dtype), (rank,), False, "sum", out.dtype, "cumsum")


# -- index.Tensor -----------------------------------------------------------------------------


def _indexed(node: torch.fx.Node) -> list[int]:
    return [d for d, i in enumerate(node.args[1]) if i is not None]


def _index_check(node: torch.fx.Node) -> bool:
    source = fake(node.args[0])
    indices = node.args[1]
    if not isinstance(source, torch.Tensor) or source.dim() == 0 or not isinstance(indices, (list, tuple)):
        return False
    dims = _indexed(node)
    if not dims or len(indices) > source.dim() or dims != list(range(dims[0], dims[-1] + 1)):
        return False  # indices apart (x[i, :, j]) put the gathered dims first: not handled here
    index_fakes = [fake(indices[d]) for d in dims]
    if not all(isinstance(f, torch.Tensor) and f.dtype in (torch.int64, torch.int32) for f in index_fakes):
        return False  # boolean masks select a data-dependent number of elements
    tensors = (source, out_fake(node), *index_fakes)
    return source.dtype in SUPPORTED_DTYPES and not any(is_unbacked(s) for t in tensors for s in t.shape)


@register("aten::index.Tensor", check=_index_check)
def _index_tensor(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """x[..., i0, i1, ...]: the index tensors (broadcast together to shape B) replace the
    indexed dims by B's; each element reads the source where its indices point. A negative
    index counts from the end, as in eager; one still out of range raises IndexError."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dims = _indexed(node)
    first, count = dims[0], len(dims)
    source_sizes = ctx.shape(fake(node.args[0]).shape)
    broadcast_rank = len(sizes) - (len(source_sizes) - count)
    xs = row_vars(len(sizes))
    positions, chosen = [], []
    for number, d in enumerate(dims):
        value = ctx.value(node.args[1][d])
        offset = first + broadcast_rank - len(value.sizes)
        at = tuple(
            sympy.Integer(0) if sympy.sympify(s) == 1 and sympy.sympify(sizes[offset + e]) != 1 else xs[offset + e]
            for e, s in enumerate(value.sizes)
        )
        picked = cast(value.at(at), torch.int64)
        wrapped = Apply("where", (Apply("lt", (picked, Const(0, torch.int64)), torch.bool),
                                  Apply("add", (picked, _index(source_sizes[d])), torch.int64), picked), torch.int64)
        symbol = sympy.Symbol(f"gather_{node.name}_{number}", integer=True)
        positions.append(symbol)
        chosen.append(Indirect(symbol, wrapped, source_sizes[d]))
    source = ctx.in_memory(node.args[0])
    read = source.at((*xs[:first], *positions, *xs[first + broadcast_rank:]))
    assert isinstance(read, Load) and not read.indirect, read  # in_memory gives a plain load
    return LoopValue(sizes, Load(read.buffer, read.index, read.dtype, tuple(chosen)), read.dtype)


# -- slice_scatter / select_scatter -----------------------------------------------------------


def _scatter_check(node: torch.fx.Node) -> bool:
    """A functionalized `x[.., a:b:s] = src` or `x[.., i] = src` with constant bounds and step."""
    source, src = fake(node.args[0]), fake(node.args[1])
    if not (isinstance(source, torch.Tensor) and isinstance(src, torch.Tensor) and source.dim() > 0):
        return False
    dim = arg(node, 2, "dim", 0)
    if not isinstance(dim, int):
        return False
    length = source.shape[dim % source.dim()]
    if node.target._schema.name == "aten::select_scatter":
        index = arg(node, 3, "index")
        return isinstance(index, int) and (index >= 0 or isinstance(length, int))
    start, end, step = arg(node, 3, "start", None), arg(node, 4, "end", None), arg(node, 5, "step", 1)
    if not isinstance(step, int) or step < 1 or not all(v is None or isinstance(v, int) for v in (start, end)):
        return False
    negative = any(v is not None and v < 0 for v in (start, end))
    return not negative or isinstance(length, int)


@register("aten::slice_scatter.default", "aten::select_scatter.default", check=_scatter_check)
def _scatter(ctx: LoopContext, node: torch.fx.Node) -> LoopValue:
    """self with the slice (or the selected index) along `dim` replaced by src: the elements in
    the range (every step-th from start) read src (at an index clamped into it), the others self.
    A strided slice is what the backward of GPT-J's interleaved rotary halves (`x[..., ::2]`)
    scatters into; as a library call each was a copy of zeros and a strided copy."""
    out = out_fake(node)
    sizes = ctx.shape(out.shape)
    dim = arg(node, 2, "dim", 0) % len(sizes)
    length = sizes[dim]
    dtype = compute_dtype(out.dtype)
    xs = row_vars(len(sizes))
    src = ctx.value(node.args[1])
    if node.target._schema.name == "aten::select_scatter":
        index = arg(node, 3, "index")
        index = index + length if index < 0 else index
        inside: Body = Apply("eq", (_index(xs[dim]), _index(index)), torch.bool)
        taken = src.at((*xs[:dim], *xs[dim + 1:]))
    else:
        start, step = arg(node, 3, "start", None), arg(node, 5, "step", 1)
        start = 0 if start is None else (start + length if start < 0 else start)
        width = src.sizes[dim]  # the slice's length clamped into self, as torch computed it
        inside = Apply("and", (Apply("ge", (_index(xs[dim]), _index(start)), torch.bool),
                               Apply("lt", (_index(xs[dim]), _index(start + width * step)), torch.bool)), torch.bool)
        offset = IndexMax(0, xs[dim] - start)
        if step == 1:
            position = IndexMin(offset, width - 1)
        else:
            on_step = Apply("eq", (_index(ModularIndexing(offset, 1, step)), _index(0)), torch.bool)
            inside = Apply("and", (inside, on_step), torch.bool)
            position = IndexMin(FloorDiv(offset, step), width - 1)
        taken = src.at((*xs[:dim], position, *xs[dim + 1:]))
    kept = ctx.value(node.args[0]).body
    body = Apply("where", (inside, cast(taken, dtype), cast(kept, dtype)), dtype)
    return LoopValue(sizes, body, out.dtype)
