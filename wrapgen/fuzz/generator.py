"""Random PyTorch programs for the fuzzer, deterministic per (seed, index).

A program is data: inputs whose dims are named sizes (or 1, to broadcast), statements over
numbered values, and the values it returns. It renders to the source of a plain function, which
is what runs (eagerly, and through wrapgen) and what a reproducer holds. Each statement is kept
only if eager runs the program so far at both sets of sizes, so every program is valid for both:
the second set is what a dynamic program is called with after it was compiled for the first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch

from wrapgen.fuzz.ops import FAMILIES, Family

DIM_NAMES = ("a", "b", "c")
DTYPES = (("float32", 0.75), ("bfloat16", 0.1), ("float16", 0.05), ("float64", 0.05), ("int64", 0.05))
LIMIT = 1e3  # values above this are refused: they stress tolerances, not wrapgen


@dataclass(frozen=True)
class InputSpec:
    """An argument: dims are size names or 1; `layout` is how its data lies in its storage:
    "contiguous", "transposed" (its last two dims swapped), "strided" (every other element of
    a larger last dim) or "offset" (not at the start of its storage)."""

    name: str
    dims: tuple[str | int, ...]
    dtype: str
    layout: str = "contiguous"


@dataclass(frozen=True)
class Statement:
    """`result = template(operands)`, or, with no result, an in-place update of operands[0]."""

    result: str | None
    template: str
    operands: tuple[str, ...]

    def render(self) -> str:
        text = self.template.format(*self.operands)
        return text if self.result is None else f"{self.result} = {text}"


@dataclass(frozen=True)
class FuzzProgram:
    seed: int
    index: int
    sizes: tuple[tuple[tuple[str, int], ...], ...]  # two sets of (dim name, size)
    inputs: tuple[InputSpec, ...]
    statements: tuple[Statement, ...] = ()
    outputs: tuple[str, ...] = ()
    dynamic: bool = False

    @property
    def name(self) -> str:
        return f"seed{self.seed}_program{self.index}"

    def source(self) -> str:
        """The program as a Python function `program(...)`."""
        body = [s.render() for s in self.statements] + [f"return ({', '.join(self.outputs)},)"]
        head = f"def program({', '.join(i.name for i in self.inputs)}):"
        return "\n".join([head] + [f"    {line}" for line in body]) + "\n"

    def function(self):
        namespace = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source(), f"<fuzz {self.name}>", "exec"), namespace)
        return namespace["program"]

    def inputs_at(self, which: int, data_seed: int) -> list[torch.Tensor]:
        return make_inputs(self.inputs, dict(self.sizes[which]), data_seed)

    def precision(self) -> str:
        """The least precise float type the program computes in (what tolerances follow)."""
        text = self.source() + " ".join(i.dtype for i in self.inputs)
        for dtype in ("bfloat16", "float16"):
            if dtype in text:
                return dtype
        return "float32"


def make_inputs(specs: tuple[InputSpec, ...], sizes: dict[str, int], data_seed: int) -> list[torch.Tensor]:
    """Random inputs: normal floats, small integers. (Reproducers carry a copy of this function.)"""
    g = torch.Generator().manual_seed(data_seed)
    out = []
    for spec in specs:
        shape = [sizes[d] if isinstance(d, str) else d for d in spec.dims]
        full = list(shape)
        if spec.layout == "transposed":
            full[-2:] = full[-2:][::-1]
        elif spec.layout == "strided":
            full[-1] *= 2
        elif spec.layout == "offset":
            full[0] += 1
        if spec.dtype == "int64":
            t = torch.randint(-4, 5, full, generator=g)
        else:
            t = torch.randn(full, generator=g).to(getattr(torch, spec.dtype))
        if spec.layout == "transposed":
            t = t.mT
        elif spec.layout == "strided":
            t = t[..., ::2]
        elif spec.layout == "offset":
            t = t[1:]
        out.append(t)
    return out


def run_eagerly(program: FuzzProgram, which: int, data_seed: int = 0) -> dict[str, object]:
    """The program's values after running its statements (raises where eager refuses it)."""
    namespace: dict[str, object] = {"torch": torch, "F": torch.nn.functional}
    namespace.update(zip((i.name for i in program.inputs), program.inputs_at(which, data_seed)))
    with torch.no_grad():
        for statement in program.statements:
            exec(statement.render(), namespace)
    return namespace


def acceptable(value: object) -> bool:
    """A result the fuzzer keeps: a non-empty tensor of finite, moderate values."""
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.is_complex():
        return False
    if value.dtype.is_floating_point:
        return bool(torch.isfinite(value).all()) and float(value.abs().max()) <= LIMIT
    return True


@dataclass
class _Builder:
    rng: random.Random
    program: FuzzProgram
    values: list[str] = field(default_factory=list)

    def try_add(self, family: Family) -> bool:
        pool = self.values[-6:] + [i.name for i in self.program.inputs]
        if len(pool) >= family.arity and self.rng.random() < 0.8:
            names = self.rng.sample(pool, family.arity)
        else:
            names = [self.rng.choice(pool) for _ in range(family.arity)]
        if self.values and self.rng.random() < 0.6 and self.values[-1] not in names[1:]:
            names[0] = self.values[-1]  # mostly chains: each statement works on the one before
        try:
            example = run_eagerly(self.program, 0)
            template = family.make(self.rng, [(n, example[n]) for n in names])  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - an invalid prefix is simply not extended
            return False
        if template is None:
            return False
        if "argmax" in template and self.program.precision() != "float32":
            # Eager rounds every half-precision intermediate, a fused kernel once (README): the
            # ties that rounding makes, or not, decide an argmax. A documented difference.
            return False
        result = None if family.mutates else f"v{len(self.values)}"
        candidate = replace(self.program, statements=self.program.statements + (Statement(result, template, tuple(names)),))
        try:
            runs = [run_eagerly(candidate, which) for which in (0, 1)]
        except Exception:  # noqa: BLE001 - eager refuses it: try something else
            return False
        checked = names[0] if result is None else result
        if not all(acceptable(ns[checked]) for ns in runs):
            return False
        self.program = candidate
        if result is not None:
            self.values.append(result)
        return True


def generate(seed: int, index: int) -> FuzzProgram:
    """Program `index` of the stream for `seed`: the same program on every run and machine."""
    rng = random.Random(f"wrapgen-fuzz:{seed}:{index}")
    dims = DIM_NAMES[: rng.randint(1, 3)]
    # Distinct sizes within a set (torch.export would tie equal sizes together); every size of the
    # second set differs from the first's, so a dynamic program is called at new sizes.
    first = rng.sample(range(2, 9), len(dims))
    second = first
    while any(a == b for a, b in zip(first, second)):
        second = rng.sample(range(2, 9), len(dims))
    sets = (tuple(zip(dims, first)), tuple(zip(dims, second)))
    inputs = []
    for i in range(rng.randint(1, 3)):
        rank = rng.choices((0, 1, 2, 3), (0.05, 0.3, 0.35, 0.3))[0]
        shape = tuple(1 if rng.random() < 0.15 else rng.choice(dims) for _ in range(rank))
        dtype = rng.choices([d for d, _ in DTYPES], [w for _, w in DTYPES])[0]
        layouts = ["contiguous"] + (["strided", "offset"] if rank else []) + (["transposed"] if rank >= 2 else [])
        layout = layouts[0] if rng.random() < 0.7 else rng.choice(layouts)
        inputs.append(InputSpec(f"x{i}", shape, dtype, layout))
    builder = _Builder(rng, FuzzProgram(seed, index, sets, tuple(inputs), dynamic=rng.random() < 0.5))
    wanted = rng.randint(2, 14)
    for _ in range(wanted * 8):
        if len(builder.program.statements) >= wanted:
            break
        family = rng.choices(FAMILIES, [f.weight for f in FAMILIES])[0]
        builder.try_add(family)
    values = builder.values or [inputs[0].name]
    # Return the values nothing else reads (so little is dead code), at most four, the last always.
    read = {o for s in builder.program.statements for o in s.operands}
    leaves = [v for v in values[:-1] if v not in read]
    outputs = {values[-1], *rng.sample(leaves, min(len(leaves), 3))}
    if rng.random() < 0.1:
        outputs.add(rng.choice(values))  # sometimes also a value other statements read
    return replace(builder.program, outputs=tuple(sorted(outputs, key=lambda v: (len(v), v))))
