"""The Python target's MultiKernelCall: a module-level `KernelChoice` per choice name; in
`call`, each distinct grid computed once, the cached choice looked up by key, the candidates
timed on a new key, and the chosen candidate launched through an if-chain (no closure built
on the fast path)."""

from __future__ import annotations

import torch

from wrapgen.backends.devices import device_overrides, kernel_device
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall
from wrapgen.wrapper_ir.values import TensorRef


class PythonMultiKernelMixin:
    """Mixed into PythonEmitter (uses its writeline/indent/kernels and the formatting
    functions it binds as static methods: py_value, py_expr, py_tuple)."""

    def choice_header(self) -> list[str]:
        names = getattr(self, "choice_names", [])
        if not names:
            return []
        lines = ["from wrapgen.kernels.choice import KernelChoice, bucket as _bucket"]
        return lines + [f"_choice_{name} = KernelChoice({name!r})" for name in names]

    def _launch_text(self, call: KernelCall, grid_var: str) -> str:
        definition: KernelDefinition = next(k for k in self.kernels if k.name == call.kernel)  # type: ignore[attr-defined]
        device = torch.device(kernel_device(definition))
        overrides = device_overrides(device)
        if str(device) not in self.call_prologues:  # type: ignore[attr-defined]
            self.call_prologues.add(str(device))  # type: ignore[attr-defined]
            for text in overrides.python_call_prologue(device.index):
                self.writeline(text)  # type: ignore[attr-defined]
        args = [(self.py_value(a), isinstance(a, TensorRef)) for a in call.args]
        return overrides.python_kernel_launch(definition, args, [f"{grid_var}[{i}]" for i in range(len(call.grid))])

    def emit_multi_kernel_call(self, line: MultiKernelCall) -> None:
        if not hasattr(self, "choice_names"):
            self.choice_names: list[str] = []
        if line.choice not in self.choice_names:
            self.choice_names.append(line.choice)
        number = self.line_number  # type: ignore[attr-defined]
        grids = line.grids()
        grid_vars = {}
        for index, grid in enumerate(grids):
            grid_vars[grid] = f"_grid{number}_{index}"
            self.writeline(f"{grid_vars[grid]} = {self.py_tuple(grid)}")  # type: ignore[attr-defined]
        launches = [self._launch_text(c, grid_vars[tuple(c.grid)]) for c in line.candidates]
        if any(text.startswith(("if ", "for ", "with ")) or "\n" in text for text in launches):
            raise UnsupportedLineError(
                f"{type(self).__name__} cannot emit line {number} ({line.format()}): a candidate's launch is not one call"
            )
        choice, key = f"_choice_{line.choice}", self.py_tuple(line.key)  # type: ignore[attr-defined]
        if line.bucketed:
            key = f"({', '.join(f'_bucket({self.py_value(k)})' for k in line.key)},)"  # type: ignore[attr-defined]
        writes = self.py_tuple(tuple(TensorRef(w) for w in line.writes))
        self.writeline(f"_key = {key}")  # type: ignore[attr-defined]
        key = "_key"
        self.writeline(f"_chosen = {choice}.chosen.get(_key)")  # type: ignore[attr-defined]
        self.writeline("if _chosen is None:")  # type: ignore[attr-defined]
        with self.indent():  # type: ignore[attr-defined]
            lambdas = ", ".join(f"lambda: {text}" for text in launches)
            serves = f", {tuple(line.serves)!r}" if line.serves else ""
            self.writeline(f"_chosen = {choice}.choose({key}, ({lambdas},), {writes}{serves})")  # type: ignore[attr-defined]
        for index, text in enumerate(launches):
            keyword = "if" if index == 0 else "elif" if index < len(launches) - 1 else "else"
            self.writeline(f"{keyword} _chosen == {index}:" if keyword != "else" else "else:")  # type: ignore[attr-defined]
            with self.indent():  # type: ignore[attr-defined]
                self.writeline(text)  # type: ignore[attr-defined]
