"""`CompiledFunction`: what `wrapgen.compile` returns — called like the original program."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from wrapgen.backends.emitter import CompiledArtifact
from wrapgen.errors import InputMismatchError
from wrapgen.specialize import SizeSpecializations
from wrapgen.wrapper_ir.program import Program

if TYPE_CHECKING:
    from wrapgen.size_hints import ExampleSizeProgram


class CompiledFunction:
    """Flattens the arguments the way the traced program saw them, runs `call(args)`, and
    rebuilds eager's output structure.

    A dynamic program's `specializations` serve the calls it refuses because a dynamic size
    is 0 or 1 (wrapgen/specialize.py): the first such call is refused and compiles one, later
    ones go straight to it. Under max_autotune, `at_hints` serves calls at the example's sizes.
    """

    def __init__(
        self,
        program: Program,
        artifact: CompiledArtifact,
        target: str,
        in_spec: pytree.TreeSpec | None,
        out_spec: pytree.TreeSpec | None,
        output_kind: str = "tuple",
        specializations: SizeSpecializations | None = None,
    ) -> None:
        self.program = program
        self.specializations = specializations
        # max_autotune + dynamic: the program measured at the example's sizes (size_hints.py)
        self.at_hints: ExampleSizeProgram | None = None
        self.artifact = artifact
        self.target = target
        self._call = artifact.call
        self._in_spec = in_spec
        # Fast paths for the common case: positional leaf arguments, a tuple of outputs.
        self._positional = in_spec is None or _is_flat_positional(in_spec)
        self._arity = _children(in_spec)[0].num_children if in_spec is not None and self._positional else None
        self._outputs = OutputShape(out_spec, output_kind)

    @property
    def source(self) -> str:
        """The emitted code (Python source, C++ source, or FX code)."""
        return self.artifact.source

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._positional and not kwargs and (self._arity is None or len(args) == self._arity):
            flat = list(args)
        else:
            flat = self._flatten(args, kwargs)
        if self.at_hints is not None and self.at_hints.matches(flat):
            return self.at_hints.function(*args, **kwargs)
        if self.specializations is not None:
            specialized = self.specializations.lookup(flat)
            if specialized is not None:
                return specialized(*args, **kwargs)
        try:
            if torch.is_grad_enabled():
                # compiled programs are inference programs (training: torch.compile); what
                # `no_grad` does, without its context object's cost on every call
                torch._C._set_grad_enabled(False)
                try:
                    outputs = self._call(flat)
                finally:
                    torch._C._set_grad_enabled(True)
            else:
                outputs = self._call(flat)
        except InputMismatchError as refusal:
            if self.specializations is None:
                raise
            # `call` consumed the flat list (boxed convention): flatten again for the fallback.
            specialized = self.specializations.serve(args, self._flatten(args, kwargs), refusal)
        else:
            return self._outputs.rebuild(outputs)
        return specialized(*args, **kwargs)  # outside the handler: its errors are not "during" ours

    def _flatten(self, args: tuple, kwargs: dict) -> list:
        if self._positional and not kwargs:
            flat = list(args)
            if self._arity is not None and len(flat) != self._arity:
                self._check_structure(args, kwargs)
            return flat
        if self._in_spec is None:
            raise TypeError("this compiled graph takes positional arguments only")
        return self._check_structure(args, kwargs)

    def _check_structure(self, args: tuple, kwargs: dict) -> list:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise TypeError(
                f"arguments do not have the structure the program was compiled for:\n"
                f"  expected {self._in_spec}\n  got      {spec}"
            )
        return flat

    def __repr__(self) -> str:
        return f"CompiledFunction(program={self.program.name!r}, target={self.target!r})"


def _is_flat_positional(spec: pytree.TreeSpec) -> bool:
    """`((leaf, leaf, ...), {})`: positional tensors/numbers and no keyword arguments."""
    if spec.type is not tuple or spec.num_children != 2:
        return False
    positional, keywords = _children(spec)
    return (
        positional.type is tuple
        and all(child.is_leaf() for child in _children(positional))
        and keywords.type is dict
        and keywords.num_children == 0
    )


class OutputShape:
    """How a program's flat outputs become what the caller gets: decided once, so the common
    structures (one value, a flat tuple or list) cost no pytree unflatten per call."""

    __slots__ = ("kind", "spec")

    def __init__(self, spec: pytree.TreeSpec | None, output_kind: str = "tuple") -> None:
        self.spec = spec
        if spec is None:
            self.kind = output_kind  # "single", "list" or "tuple"
        elif spec.is_leaf():
            self.kind = "single"
        elif spec.type in (tuple, list) and all(child.is_leaf() for child in _children(spec)):
            self.kind = "tuple" if spec.type is tuple else "list"
        else:
            self.kind = "tree"

    def rebuild(self, outputs: Sequence[Any]) -> Any:
        kind = self.kind
        if kind == "tuple":
            return tuple(outputs)
        if kind == "single":
            return outputs[0]
        if kind == "list":
            return list(outputs)
        return pytree.tree_unflatten(list(outputs), self.spec)


def _children(spec: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    # torch >= 2.13 spells it children(); older releases expose the children_specs field.
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)
