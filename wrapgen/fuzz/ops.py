"""The fuzzer's op catalog: each family turns randomly chosen operands into one Python statement.

Comparisons that pick between different values compare against an odd threshold, not 0 or
another value: a value that is exactly 0 in eager (log_softmax over one element, relu) can be
an ulp off in a kernel that computes it another way (a vectorized cos), and the comparison would
turn that ulp into a different choice.

A family gets the random source and the candidate operands (name, example tensor) and returns a
template over `{0}`, `{1}`, ... (the operands it picked) or None when it does not apply. Whether
the statement is valid is not decided here: the generator runs it eagerly at two sets of sizes
and keeps it only where eager accepts it at both.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

Operand = tuple[str, torch.Tensor]

UNARY = (
    "torch.sin({0})", "torch.cos({0})", "torch.tanh({0})", "torch.sigmoid({0})", "torch.relu({0})", "{0}.abs()",
    "-{0}", "torch.exp(-{0}.abs())", "torch.sqrt({0}.abs() + 1)", "torch.log1p({0}.abs())", "F.gelu({0})",
    "F.silu({0})", "{0}.clamp(-0.5, 0.5)", "torch.where({0} > 0, {0}, {0} * 0.1)", "{0} * 0.75 + 0.25",
    "{0} * {0}", "1 / (1 + {0}.abs())", "torch.erf({0})", "{0}.float()", "{0}.to(torch.bfloat16)",
    "{0}.to(torch.float16)", "{0}.double()", "({0} > 0.2)", "({0} > 0.1).to(torch.int32)",
)
BINARY = (
    "{0} + {1}", "{0} - {1}", "{0} * {1}", "torch.maximum({0}, {1})", "torch.minimum({0}, {1})",
    "{0} / (1 + {1}.abs())", "torch.where({0} > {1}, {0}, {1})", "({0} < {1} - 0.1)", "{0} * 0.5 - {1} * 2",
)
IN_PLACE = ("{0}.add_({1})", "{0}.mul_({1})", "{0}.copy_({1})", "{0}.sub_(torch.sin({1}))")
# scatters into operand 0 (a KV-cache write when it is an input): a negative index, values that
# broadcast, values read from other elements of the destination itself
SCATTER = ("{0}[torch.tensor([0, -1])] = torch.sin({1}).sum() * 0.5",
           "{0}.index_copy_({d}, torch.tensor([0]), {0}.narrow({d}, 1, 1) * 2)",
           "{0}[..., torch.tensor([1])] = torch.cos({1}[..., :1])")
IN_PLACE_UNARY = ("{0}.mul_(0.5)", "{0}.relu_()", "{0}.clamp_(-1, 1)", "{0}.select({d}, 0).fill_(0.5)",
                  "{0}.neg_()", "{0}[..., 1:] += 1")


def _dim(rng: random.Random, t: torch.Tensor) -> int:
    return rng.randrange(-t.dim(), t.dim())


def unary(rng: random.Random, ops: list[Operand]) -> str:
    return rng.choice(UNARY)


def binary(rng: random.Random, ops: list[Operand]) -> str:
    return rng.choice(BINARY)


def ternary(rng: random.Random, ops: list[Operand]) -> str:
    return "torch.where({0} > 0.1, {1}, {2})"


def reduction(rng: random.Random, ops: list[Operand]) -> str | None:
    t = ops[0][1]
    if t.dim() == 0:
        return rng.choice(("{0} * 2", "{0}.sum()"))
    d, keep = _dim(rng, t), rng.choice((True, False))
    if t.dtype == torch.bool:
        return rng.choice((f"{{0}}.any({d})", f"{{0}}.all({d})", f"{{0}}.sum({d})"))
    return rng.choice((
        f"{{0}}.sum({d}, keepdim={keep})", f"{{0}}.mean({d}, keepdim={keep})", f"{{0}}.amax({d}, keepdim={keep})",
        f"{{0}}.amin({d}, keepdim={keep})", f"{{0}}.var({d}, keepdim={keep})", f"torch.softmax({{0}}, {d})",
        f"torch.log_softmax({{0}}, {d})", f"{{0}}.argmax({d})", f"torch.logsumexp({{0}}, {d})", "{0}.sum()",
        f"{{0}}.max({d}).values", f"torch.cumsum({{0}}, {d})", "F.layer_norm({0}, {0}.shape[-1:])",
    ))


def view(rng: random.Random, ops: list[Operand]) -> str | None:
    t = ops[0][1]
    if t.dim() == 0:
        return "{0}.reshape(1)"
    d = _dim(rng, t)
    choices = [f"{{0}}.unsqueeze({rng.randrange(-t.dim() - 1, t.dim() + 1)})", "{0}.reshape(-1)", "{0}.flatten()",
               f"{{0}}.narrow({d}, 1, 1)", f"{{0}}.select({d}, 0)", "{0}.contiguous()", "{0}.clone()",
               "{0}[1:]", "{0}[::2]", "{0}[..., :-1]", f"torch.flip({{0}}, ({d},))"]
    if t.dim() >= 2:
        perm = list(range(t.dim()))
        rng.shuffle(perm)
        choices += [f"{{0}}.transpose({d}, {_dim(rng, t)})", f"{{0}}.permute({tuple(perm)})", "{0}.flatten(0, 1)",
                    "{0}.reshape({0}.shape[0], -1)", "{0}[:, ::2]", "{0}.diagonal()", "{0}.mT"]
    if 1 in t.shape:
        choices.append(f"{{0}}.squeeze({t.shape.index(1)})")
    return rng.choice(choices)


def expand(rng: random.Random, ops: list[Operand]) -> str:
    return rng.choice(("{0}.expand_as({1})", "{0}.expand({1}.shape) + 0"))


def matmul(rng: random.Random, ops: list[Operand]) -> str:
    return rng.choice(("{0} @ {1}", "torch.matmul({0}, {1})", "{0} @ {1}.mT", "F.linear({0}, {1})"))


def concat(rng: random.Random, ops: list[Operand]) -> str:
    d = _dim(rng, ops[0][1]) if ops[0][1].dim() else 0
    return rng.choice((f"torch.cat([{{0}}, {{1}}], {d})", "torch.stack([{0}, {1}])"))


def in_place(rng: random.Random, ops: list[Operand]) -> str:
    return rng.choice(IN_PLACE)


def in_place_unary(rng: random.Random, ops: list[Operand]) -> str:
    t = ops[0][1]
    return rng.choice(IN_PLACE_UNARY).replace("{d}", str(_dim(rng, t) if t.dim() else 0))


def scatter(rng: random.Random, ops: list[Operand]) -> str | None:
    t = ops[0][1]
    if t.dim() == 0:
        return None
    return rng.choice(SCATTER).replace("{d}", str(_dim(rng, t)))


@dataclass(frozen=True)
class Family:
    """`arity` operands; `mutates`: the statement updates operand 0 in place instead of defining a value."""

    name: str
    arity: int
    weight: float
    make: Callable[[random.Random, list[Operand]], str | None]
    mutates: bool = False


FAMILIES = (
    Family("unary", 1, 6, unary),
    Family("binary", 2, 5, binary),
    Family("where", 3, 0.5, ternary),
    Family("reduction", 1, 3, reduction),
    Family("view", 1, 3, view),
    Family("expand", 2, 0.5, expand),
    Family("matmul", 2, 2, matmul),
    Family("concat", 2, 1, concat),
    Family("in_place", 2, 1, in_place, mutates=True),
    Family("in_place_unary", 1, 1, in_place_unary, mutates=True),
    Family("scatter", 2, 0.5, scatter, mutates=True),
)
