"""Host-side compile time: what capture and lowering cache or defer must not change what they make.

Capture builds torch.export's graph modules lazily (their Python code only if they run); the
lowering caches index rewriting by expression (`loop_ir._reindex`) and the Triton codegen its
index flattening (`_flatten_dims`), skipping `sympy.simplify` for plain monomials.
"""

from __future__ import annotations

import random

import sympy
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

import wrapgen
from wrapgen.kernels.triton.codegen import _flatten_dims
from wrapgen.loop_ir import Load, row_vars, substitute
from wrapgen.lowering.capture import capture, graph_module


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(self.norm(x)))[..., :16]


def stack() -> torch.nn.Module:
    return torch.nn.Sequential(*(Block() for _ in range(3))).eval()


def test_captured_graph_modules_run_like_the_model():
    model, x = stack(), torch.randn(4, 16)
    captured = capture(model, [x], False)
    gm = captured.graph_module
    params = [captured.constants[n.name][1] for n in gm.graph.nodes if n.op == "placeholder" and n.name in captured.constants]
    # the code a lazy module generates on its first call is the model's
    torch.testing.assert_close(gm(*params, x)[0], model(x))
    copy = graph_module(gm, gm.graph)
    assert isinstance(copy, _LazyGraphModule)  # no Python code yet: it is made on the first call
    torch.testing.assert_close(copy(*params, x)[0], model(x))
    assert "def forward" in copy.code


def test_lowering_the_same_model_twice_gives_the_same_program():
    model, x = stack(), torch.randn(4, 16)
    first = str(wrapgen.lower(model, [x]))
    other = str(wrapgen.lower(torch.nn.Sequential(Block()).eval(), [torch.randn(2, 16)]))  # fills the caches
    assert str(wrapgen.lower(model, [x])) == first != other
    compiled = wrapgen.compile(model, [x])
    y = torch.randn(4, 16)
    torch.testing.assert_close(compiled(y), model(y))


def test_substitute_matches_an_uncached_rewrite():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    x0, x1 = row_vars(2)
    index = sympy.Min(x0 * s0 + x1, s0 - 1) + sympy.floor(x1 / 4)
    mapping = {x0: x1 + 1, x1: 2 * x0}
    for _ in range(2):  # the second call is served from the cache
        load = substitute(Load("buf", index, torch.float32), mapping)
        assert load.index == sympy.expand(index.xreplace(mapping))


def test_monomial_coefficients_are_already_what_simplify_returns():
    """`_flatten_dims` keeps a coefficient made of numbers and symbols as it is: simplify would
    return it unchanged (checked here on random monomials)."""
    rng = random.Random(0)
    symbols = [sympy.Symbol(f"s{i}", integer=True, positive=True) for i in range(3)] + [sympy.Symbol("ks0", integer=True)]
    for _ in range(200):
        c = sympy.Rational(rng.randint(-999, 999), rng.randint(1, 9))
        for _ in range(rng.randint(0, 3)):
            c *= rng.choice(symbols)
        if all(f.is_Rational or f.is_Symbol for f in sympy.Mul.make_args(c)):
            assert sympy.srepr(sympy.simplify(c)) == sympy.srepr(c)


def test_flatten_dims_folds_a_contiguous_index():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    flat = sympy.Symbol("xindex", integer=True)
    x0, x1, x2 = row_vars(3)
    sizes = (sympy.Integer(4), s0, sympy.Integer(8))
    contiguous = 8 * s0 * x0 + 8 * x1 + x2
    assert _flatten_dims(contiguous, (x0, x1, x2), sizes, flat) == flat
    assert _flatten_dims(contiguous, (x0, x1, x2), sizes, flat) == flat  # cached
    strided = 16 * s0 * x0 + 8 * x1 + x2 + 3  # a slice of a wider buffer: only the suffix is folded
    assert _flatten_dims(strided, (x0, x1, x2), sizes, flat) == 16 * s0 * x0 + sympy.Mod(flat, 8 * s0, evaluate=False) + 3
