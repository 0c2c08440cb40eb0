"""Weights of small CPU matrix products laid out K-major: a constant the program owns, read only
transposed by `mm`/`addmm` of a few rows, becomes a new constant holding that transpose.

A linear layer computes `x @ w.T` with `w` stored [N, K]. At batch 1 the C++ kernel then sums
each output's K products along a weight row (lane_tiles.py) and folds the partial sums; with the
weight as a contiguous [K, N] matrix the same product is a column sum
(kernels/cpp/column_reduction.py): each input element is broadcast against a contiguous slice of
outputs, eight vector accumulators wide, with no fold at all. On the 2-core Zen 3 VM the demo
model's three products at batch 1 took 3.9 us row-major and 2.2 us K-major (each kernel timed
alone from C++).

Only constants the program has its own copy of are re-laid out (`CapturedGraph.owned`: an AOT
package's weights; `frozen`: tensors lifted from Python data): a parameter held by reference can
change between calls, and a copy made at compile time would not see it. The new constant keeps
the parameter's origin and records its permutation (`CapturedGraph.permuted`, then
`Constant.permutation`, printed in the program's text), so a package's `update_weights` lays a
new value out the same way. The original is dropped when nothing else reads it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, graph_fake_mode, with_graph
from wrapgen.lowering.kernel_lowering import kernel_language

aten = torch.ops.aten

MAX_ROWS = 4  # rows of the activation: beyond that a product reuses each weight row enough
MAX_ELEMENTS = 1 << 20  # weight elements: larger weights go to library products anyway
TRANSPOSE = (1, 0)
_DTYPES = (torch.float32,)


def _value(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _small_product(view: torch.fx.Node, user: torch.fx.Node) -> bool:
    """Whether `user` is an `mm`/`addmm` taking `view` as its right operand only, against an
    activation of at most MAX_ROWS static rows."""
    if user.op != "call_function" or user.kwargs:
        return False
    if user.target == aten.mm.default and len(user.args) == 2:
        left, right = user.args
    elif user.target == aten.addmm.default and len(user.args) == 3:
        _, left, right = user.args
    else:
        return False
    activation = _value(left)
    return (right is view and left is not view and activation is not None and activation.dim() == 2
            and isinstance(activation.shape[0], int) and activation.shape[0] <= MAX_ROWS)


def _transposes(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (
        (node.target == aten.permute.default and tuple(node.args[1]) == TRANSPOSE) or node.target == aten.t.default)


def _relaid(captured: CapturedGraph, node: torch.fx.Node) -> bool:
    """Whether constant placeholder `node` is an owned 2-d float CPU weight read only transposed,
    by small products."""
    if node.name not in captured.constants or node.name in captured.permuted:
        return False
    if node.name not in captured.owned and node.name not in captured.frozen:
        return False
    tensor = captured.constants[node.name][1]
    fake = _value(node)
    if fake is None or tensor.dim() != 2 or tensor.dtype not in _DTYPES or tensor.device.type != "cpu":
        return False
    if tensor.numel() > MAX_ELEMENTS or tuple(fake.shape) != tuple(tensor.shape) or not node.users:
        return False
    return all(_transposes(view) and view.users and all(_small_product(view, u) for u in view.users)
               for view in node.users)


def kmajor_product_weights(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each such weight replaced by its K-major copy (a new graph), or
    `captured` itself when there is none or its products do not run as C++ kernels."""
    graph = captured.graph_module.graph
    weights = [n for n in graph.find_nodes(op="placeholder") if _relaid(captured, n)]
    if not weights or any(kernel_language(captured.constants[w.name][1].device) != "cpp" for w in weights):
        return captured
    fake_mode = graph_fake_mode(graph)
    if fake_mode is None:
        return captured
    new = torch.fx.Graph()
    new._codegen = graph._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    chosen = {w.name for w in weights}
    added: dict[str, tuple[str, torch.Tensor]] = {}
    kmajor: dict[str, torch.fx.Node] = {}
    first_call: torch.fx.Node | None = None
    for node in graph.nodes:
        if node.op != "placeholder" and first_call is None:
            first_call = node
            for name in sorted(chosen, key=[w.name for w in weights].index):
                origin, tensor = captured.constants[name]
                value = tensor.permute(TRANSPOSE).contiguous()
                placeholder = new.placeholder(f"{name}_kmajor")
                with fake_mode:
                    placeholder.meta["val"] = torch.empty(tuple(value.shape), dtype=value.dtype, device=value.device)
                added[placeholder.name] = (origin, value)
                kmajor[name] = placeholder
        if _transposes(node) and isinstance(node.args[0], torch.fx.Node) and node.args[0].name in chosen:
            env[node] = kmajor[node.args[0].name]
            continue
        env[node] = new.node_copy(node, lambda n: env[n])
    new.lint()
    rewritten = with_graph(captured, new)
    placeholders = {n.name: n for n in rewritten.graph_module.graph.find_nodes(op="placeholder")}
    for name in chosen:  # read by nothing now: the program no longer holds it
        rewritten.graph_module.graph.erase_node(placeholders[name])
    constants = {k: v for k, v in rewritten.constants.items() if k not in chosen}
    return dataclasses.replace(
        rewritten,
        constants={**constants, **added},
        owned=(rewritten.owned - chosen) | (frozenset(added) if captured.owned else frozenset()),
        frozen=(rewritten.frozen - chosen) | frozenset(n for n, w in zip(added, weights) if w.name in captured.frozen),
        permuted={**rewritten.permuted, **{n: TRANSPOSE for n in added}},
    )
