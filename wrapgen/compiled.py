"""`CompiledFunction`: what `wrapgen.compile` returns — called like the original program."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from wrapgen.backends.emitter import CompiledArtifact
from wrapgen.wrapper_ir.program import Program


class CompiledFunction:
    """Flattens the arguments the way the traced program saw them, runs `call(args)`, and
    rebuilds eager's output structure."""

    def __init__(
        self,
        program: Program,
        artifact: CompiledArtifact,
        target: str,
        in_spec: pytree.TreeSpec | None,
        out_spec: pytree.TreeSpec | None,
        output_kind: str = "tuple",
    ) -> None:
        self.program = program
        self.artifact = artifact
        self.target = target
        self._call = artifact.call
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._output_kind = output_kind

    @property
    def source(self) -> str:
        """The emitted code (Python source, C++ source, or FX code)."""
        return self.artifact.source

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._in_spec is None:
            if kwargs:
                raise TypeError("this compiled graph takes positional arguments only")
            flat = list(args)
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self._in_spec:
                raise TypeError(
                    f"arguments do not have the structure the program was compiled for:\n"
                    f"  expected {self._in_spec}\n  got      {spec}"
                )
        with torch.no_grad():  # compiled programs are inference programs (training: torch.compile)
            outputs = self._call(flat)
        if self._out_spec is not None:
            return pytree.tree_unflatten(list(outputs), self._out_spec)
        if self._output_kind == "single":
            return outputs[0]
        return list(outputs) if self._output_kind == "list" else tuple(outputs)

    def __repr__(self) -> str:
        return f"CompiledFunction(program={self.program.name!r}, target={self.target!r})"
