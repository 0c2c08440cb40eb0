"""Ahead-of-time compilation to a C++ package, and loading one back.

    path = wrapgen.aot_compile(model, example_inputs, "model.wgpkg")   # model.so + weights + metadata
    runner = wrapgen.load_package(path)                                # callable like the model
    runner.update_weights(new_state_dict)                              # double-buffered, thread-safe

The package runs without Python too: `wrapgen_runner PACKAGE INPUTS.bin` (CMakeLists.txt).
With `aot_compile(..., arrayref=True)` it also has the array-ref entry (plain descriptors, no
tensor handles per call): `load_package(path, interface="arrayref")`, docs/cpp-target.md.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from wrapgen import config
from wrapgen.backends.cpp import CppEmitter
from wrapgen.backends.cpp.loader import WG_MODEL_ABI_VERSION, _from_handles, _to_handles, raise_error
from wrapgen.backends.cpp.pymodule import runtime_module
from wrapgen.package_check import MANIFEST, METADATA, verify_package, write_manifest, write_metadata
from wrapgen.packaging import PACKAGE_FORMAT, PackageError, check_compatible, used_shims, write_tensor_file
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import contiguous_strides

__all__ = ["PackagedModel", "aot_compile", "load_package"]


def _constant_values(program: Program) -> dict[str, torch.Tensor]:
    """Each constant with exactly the layout the program was compiled for."""
    hints = {s.symbol: s.hint for s in program.symbols}
    values = program.constant_values()
    out = {}
    for c in program.constants:
        value = values.get(c.name)
        if value is None:
            raise PackageError(f"constant {c.name} has no value to package")
        strides = c.type.strides if c.type.strides is not None else contiguous_strides(c.type.sizes)
        layout = tuple(int(torch.sym_int(s) if not hasattr(s, "xreplace") else s.xreplace(hints)) for s in strides)
        copy = torch.empty_strided(tuple(value.shape), layout, dtype=value.dtype)
        out[c.name] = copy.copy_(value.detach().cpu())
    return out


def aot_compile(
    model: Callable | torch.nn.Module,
    example_inputs: Sequence[Any],
    package_path: str | Path,
    dynamic: bool = False,
    arrayref: bool = False,
) -> str:
    """Compile `model` for the C++ target into a package directory; returns its path.

    arrayref=True adds the array-ref entry `wg_run_arrayref` (cpp_runtime/include/wrapgen/arrayref.h)
    beside the handle entry: for CPU programs of static shapes, where a call should cost little more
    than its arithmetic. A program it cannot serve raises ArrayRefRefused naming the line."""
    from wrapgen.api import _capture, optimize
    from wrapgen.lowering.lower import lower_captured

    captured = _capture(model, example_inputs, dynamic)
    # the package ships its own copy of every constant (weights.bin): their layout is its to choose
    captured = dataclasses.replace(captured, owned=frozenset(captured.constants))
    program = optimize(lower_captured(captured), "cpp")
    emitter = CppEmitter()
    if arrayref:
        from wrapgen.backends.cpp.arrayref import ArrayRefEmitter

        emitter.arrayref = ArrayRefEmitter().arrayref_parts(program)  # refuses before anything is built
    source, library = emitter.build(program)
    package = Path(package_path)
    package.mkdir(parents=True, exist_ok=True)
    (package / MANIFEST).unlink(missing_ok=True)  # written last: a half-written package has none
    shutil.copyfile(library, package / "model.so")
    (package / "model.cpp").write_text(source)
    write_tensor_file(package / "weights.bin", _constant_values(program))
    metadata = emitter.metadata(program)
    metadata.update(
        format=PACKAGE_FORMAT,
        model_abi=WG_MODEL_ABI_VERSION,
        shims=used_shims(package / "model.so"),
        in_spec=pytree.treespec_dumps(captured.in_spec) if captured.in_spec is not None else None,
        out_spec=pytree.treespec_dumps(captured.out_spec) if captured.out_spec is not None else None,
        output_kind=captured.output_kind,
        memory_planning=config.memory_planning,
        arrayref=arrayref,
    )
    write_metadata(package, metadata)
    write_manifest(package, (METADATA, "model.cpp", "model.so", "weights.bin"))
    return str(package)


class PackagedModel:
    """A loaded package: called like the original model; runs concurrently from many threads."""

    def __init__(self, path: str | Path, interface: str = "handle") -> None:
        self.path = str(path)
        self.metadata = verify_package(path)  # before anything is mapped: a damaged file raises here
        check_compatible(self.metadata, self.path)
        if interface not in ("handle", "arrayref"):
            raise ValueError(f"interface must be 'handle' or 'arrayref', got {interface!r}")
        self.interface = interface
        self._arrayref = None
        if interface == "arrayref":
            if not self.metadata.get("arrayref"):
                raise PackageError(f"{path} has no array-ref entry: build it with aot_compile(..., arrayref=True)")
            from wrapgen.backends.cpp.arrayref_loader import ArrayRefModel
            from wrapgen.packaging import read_tensor_file

            weights = read_tensor_file(Path(path) / "weights.bin")
            self._arrayref = ArrayRefModel(str(Path(path) / "model.so"), [weights[c["name"]] for c in self.metadata["constants"]])
        self._model = runtime_module().Model(str(Path(path) / "model.so"), str(Path(path) / "weights.bin"))
        self._inputs = self.metadata["inputs"]
        self._in_spec = pytree.treespec_loads(self.metadata["in_spec"]) if self.metadata.get("in_spec") else None
        self._origins = {c["origin"] or c["name"]: c["name"] for c in self.metadata["constants"]}
        self._permutations = {c["name"]: tuple(c["permutation"]) for c in self.metadata["constants"] if c.get("permutation")}
        self._flat = self._in_spec is None or _flat_positional(self._in_spec)  # known once, not per call
        from wrapgen.compiled import OutputShape

        out_spec = pytree.treespec_loads(self.metadata["out_spec"]) if self.metadata.get("out_spec") else None
        self._outputs = OutputShape(out_spec, self.metadata.get("output_kind", "tuple"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._in_spec is not None and (kwargs or not self._flat):
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self._in_spec:
                raise TypeError(f"arguments do not have the structure the package was compiled for: {spec}")
        else:
            flat = list(args)
        return self._outputs.rebuild(self.run(flat))

    def run(self, flat: list) -> tuple:
        """The flat calling convention: inputs in program order, outputs as a tuple."""
        from wrapgen.errors import InputMismatchError

        if self._arrayref is not None:
            return self._arrayref(flat)
        if len(flat) != len(self._inputs):
            raise InputMismatchError(f"expected {len(self._inputs)} inputs, got {len(flat)}")
        tensors = []
        for spec, value in zip(self._inputs, flat):
            if spec["kind"] == "tensor" and not isinstance(value, torch.Tensor):
                raise InputMismatchError(f"input {spec['name']}: expected a tensor, got {type(value).__name__}")
            if spec["kind"] != "tensor" and not isinstance(value, (int, float)):
                raise InputMismatchError(f"input {spec['name']}: expected a number, got {type(value).__name__}")
            if spec["kind"] == "tensor":
                tensors.append(value)
        handles = iter(_to_handles(tensors) if tensors else [])
        values = [(0, next(handles)) if s["kind"] == "tensor" else ((2, float(v)) if s["kind"] == "float" else (1, int(v)))
                  for s, v in zip(self._inputs, flat)]
        status, message, outputs = self._model.run(values)
        if status != 0:
            raise_error(status, message)
        tensors_out = iter(_from_handles([v for k, v in outputs if k == 0]))
        return tuple(next(tensors_out) if k == 0 else (float(v) if k == 2 else bool(v) if k == 3 else None if k == 4 else int(v))
                     for k, v in outputs)

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Swap in new values for constants (by package name or by the model's parameter name);
        runs in flight finish with the old set, later runs see the new one in full."""
        names, tensors = [], []
        for key, value in weights.items():
            name = self._origins.get(key, key)
            names.append(name)
            # in the model's layout; a constant the compiler permuted (a K-major weight) takes it so
            permutation = self._permutations.get(name)
            tensors.append(value.detach().permute(permutation).contiguous() if permutation else value.detach())
        handles = _to_handles(tensors) if tensors else []
        try:
            self._model.update_constants(dict(zip(names, handles)))  # checks names and shapes
        finally:
            _from_handles(handles)
        if self._arrayref is not None:  # its own binding of the constants: swapped the same way
            self._arrayref.update_constants(dict(zip(names, tensors)))

    def live_handles(self) -> int:
        return self._model.live_handles()

    def __repr__(self) -> str:
        return f"PackagedModel({self.path!r}, program={self.metadata.get('program')!r})"


def load_package(path: str | Path, interface: str = "handle") -> PackagedModel:
    """Load a package written by `aot_compile`. Checks first that every file is intact (sizes
    and SHA-256 from its SHA256SUMS) and fits this runtime: PackageDamagedError / PackageError.
    interface="arrayref" calls the array-ref entry (packages built with arrayref=True): contiguous
    CPU tensors in, new tensors out, a fraction of the handle entry's overhead."""
    return PackagedModel(path, interface)


def _flat_positional(spec: pytree.TreeSpec) -> bool:
    from wrapgen.compiled import _is_flat_positional

    return _is_flat_positional(spec)
