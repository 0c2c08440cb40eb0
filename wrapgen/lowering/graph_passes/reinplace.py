"""Scatters into a graph input that the graph then copies back into that input, done in place.

A KV-cache update traced through aot_autograd is functional: `new = index_copy(cache, 2, pos, k)`,
attention reads `new`, and an epilogue `copy_(cache, new)` writes it back (torch.export instead
returns `new` as a buffer-mutation output, which the lowering stores into the buffer). As written that is two
full copies of the cache per layer per token (the functional op's result, then the write-back),
where eager's `index_copy_` writes one token's rows. When nothing reads the input's old value
after the scatter, the scatter is the in-place op itself (`index_copy_`, `index_put_`,
`scatter_`): it writes only the elements it replaces, its result is the input, and the
write-back copies the input onto itself (which the lowering drops).
"""

from __future__ import annotations

import torch
import torch.fx

from wrapgen.lowering.capture import CapturedGraph, with_graph

aten = torch.ops.aten

# functional scatter -> its in-place form (same arguments)
_IN_PLACE = {
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_put.default: aten.index_put_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
}


def scatter_in_place(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with each scatter into an input that is written back in place (on a copy of
    the graph), or `captured` itself when there is none."""
    found = _candidates(captured.graph_module.graph, captured.mutations)
    if not found:
        return captured
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(captured.graph_module.graph, mapping))
    for node in found:
        mapping[node].target = _IN_PLACE[node.target]
    graph.lint()
    return with_graph(captured, graph)


def _candidates(graph: torch.fx.Graph, mutations: dict[int, str]) -> list[torch.fx.Node]:
    order = {n: i for i, n in enumerate(graph.nodes)}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    stored_as_output = [(results[i], name) for i, name in mutations.items() if i < len(results)]
    out = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _IN_PLACE:
            continue
        base = node.args[0]
        if not isinstance(base, torch.fx.Node) or base.op != "placeholder":
            continue
        written_back = [u for u in node.users if u.target is aten.copy_.default and u.args[0] is base and u.args[1] is node]
        stored = [name for value, name in stored_as_output if value is node]
        if stored == [base.name] and not written_back:
            written_back = [output]  # torch.export's buffer (or input) mutation output
        elif stored or len(written_back) != 1:
            continue
        base_fake, fake = base.meta.get("val"), node.meta.get("val")
        if not (isinstance(base_fake, torch.Tensor) and isinstance(fake, torch.Tensor)) or base_fake.dtype != fake.dtype:
            continue
        # the old value is read only before the scatter; the only later use is the write-back
        if any(order[u] > order[node] and u is not written_back[0] for u in base.users if u is not node):
            continue
        if any(a is base for a in node.all_input_nodes[1:]):
            continue  # it reads the input as an index or source too
        out.append(node)
    return out
