"""Common subexpressions of the ATen graph computed once.

aot_autograd removes them from the graphs it partitions for training, not from inference
graphs. A decoder's graph repeats per layer what depends only on the step: the CPU attention
decomposition turns the one boolean causal mask into an additive float mask once per layer
(`where(mask, 0, -inf)` with its two `scalar_tensor`s), and each layer's KV cache computes
the same write positions. Each repeat is a kernel launch and a buffer.

Two calls merge where they call the same pure ATen op (or `getitem`, or a size operation) on
the same values: random ops, `empty` and its kin (uninitialized memory), calls whose result
shares storage with a graph output (two returned tensors stay two), calls that make unbacked
sizes, and calls with a mutation between them (they read different versions) are left
alone. This is the rule of aot_autograd's `fx_graph_cse`, which wrapgen used before; that one
imports Inductor's pattern matcher, and with it Inductor's lowering, 1.6 s of every process's
first compile. A graph with collectives is left as it is: two identical collectives are two
communications every rank makes, which merging would change.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef

from wrapgen.lowering.capture import CapturedGraph, with_graph

_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "c10d_functional", "_dtensor")
# Ops whose result is not a function of their arguments.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
_RANDOM = frozenset({"dropout", "native_dropout", "bernoulli", "multinomial", "normal", "poisson", "binomial", "rrelu",
                     "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
                     "_standard_gamma", "_fused_dropout", "uniform", "exponential", "geometric", "log_normal",
                     "cauchy", "random"})
# Python functions in ATen graphs that compute sizes: pure.
_PURE_MODULES = (operator.__name__, math.__name__, "_operator")


def eliminate_common_subexpressions(captured: CapturedGraph) -> CapturedGraph:
    """`captured` with repeated pure calls merged (on a copy of the graph), or `captured` itself
    when nothing repeats."""
    graph = captured.graph_module.graph
    if any(_is_collective(node) for node in graph.nodes):
        return captured
    merged = merge_repeated_calls(graph)
    if len(merged.nodes) == len(graph.nodes):
        return captured
    merged.lint()
    return with_graph(captured, merged)


def merge_repeated_calls(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` in which each mergeable call equal to an earlier one in the same
    mutation region is that earlier call."""
    merged = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    first: dict[tuple, torch.fx.Node] = {}
    returned = _returned_storages(graph)
    region = 0
    for node in graph.nodes:
        if _mutates(node):
            region += 1
        key = _key(node, env, region) if _mergeable(node, returned) else None
        if key is not None and key in first:
            env[node] = first[key]
            continue
        env[node] = merged.node_copy(node, lambda n: env[n])
        if key is not None:
            first[key] = env[node]
    return merged


def _is_collective(node: torch.fx.Node) -> bool:
    target = node.target
    namespace = getattr(target, "namespace", None) or getattr(getattr(target, "_schema", None), "name", "").partition("::")[0]
    return node.op == "call_function" and namespace in _COLLECTIVE_NAMESPACES


def _is_pure_python(target: Any) -> bool:
    return getattr(target, "__module__", None) in _PURE_MODULES or target in (torch.sym_max, torch.sym_min,
                                                                              torch.sym_not, torch.sym_float)


def _mutates(node: torch.fx.Node) -> bool:
    """Whether `node` may write memory that a later call reads: a mutable schema, and, to be
    safe, any call that is neither an ATen op nor pure Python (higher-order ops, methods)."""
    if node.op in ("placeholder", "output", "get_attr"):
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    return not (node.op == "call_function" and _is_pure_python(node.target))


def _mergeable(node: torch.fx.Node, returned: set) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__.rstrip("_")
        if (target._schema.is_mutable or name in _UNINITIALIZED or name in _RANDOM
                or torch.Tag.nondeterministic_seeded in target.tags):
            return False
    elif not _is_pure_python(target):
        return False
    value = node.meta.get("val")
    if free_unbacked_symbols(value):
        return False
    return _storage(value) not in returned


def _storage(value: object) -> object:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (NotImplementedError, RuntimeError):
        return None


def _returned_storages(graph: torch.fx.Graph) -> set:
    output = graph.find_nodes(op="output")
    if not output:
        return set()
    storages = {_storage(n.meta.get("val")) for n in output[0].all_input_nodes}
    storages.discard(None)
    return storages


def _key(node: torch.fx.Node, env: dict[torch.fx.Node, torch.fx.Node], region: int) -> tuple | None:
    """What makes two calls the same (None: an argument that cannot be compared)."""
    try:
        key = (node.target, _frozen(node.args, env), _frozen(node.kwargs, env), region)
        hash(key)
    except (TypeError, KeyError):
        return None
    return key


def _frozen(value: object, env: dict[torch.fx.Node, torch.fx.Node]) -> object:
    """`value` as a hashable tree, each node replaced by its copy and each leaf tagged with its
    type (so 1 and 1.0 and True differ)."""
    if isinstance(value, torch.fx.Node):
        return ("node", env[value])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v, env) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v, env)) for k, v in value.items()))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", id(value.node))  # alive while the graph holds it
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))  # a tensor's == is elementwise: compared by identity
    if isinstance(value, slice):
        return ("slice", _frozen((value.start, value.stop, value.step), env))
    if isinstance(value, float):  # nan equals nothing, and 0.0 == -0.0 though x * -0.0 is -0.0
        return ("nan",) if math.isnan(value) else (float, value, math.copysign(1.0, value))
    return (type(value), value)
