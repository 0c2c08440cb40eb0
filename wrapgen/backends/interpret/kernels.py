"""The generated kernels of one program, built once and launched by name: the same launchers
the python target's modules use (kernels/cpp/runtime.py, kernels/triton/runtime.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from wrapgen.backends.devices import device_overrides, kernel_device, out_of_range_message, returns_status
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.lines import KernelDefinition
from wrapgen.wrapper_ir.program import Program


class ProgramKernels:
    """Builds every KernelDefinition of a program (or refuses it, naming the line) and launches them."""

    def __init__(self, program: Program, emitter: str = "InterpretEmitter") -> None:
        self.definitions: dict[str, KernelDefinition] = {}
        for number, line in enumerate(program.lines, start=1):
            if not isinstance(line, KernelDefinition):
                continue
            device = kernel_device(line)
            if line.language not in device_overrides(device).kernel_languages():
                raise UnsupportedLineError(
                    f"{emitter} cannot run line {number} ({line.format()}): no launcher for {line.language} kernels on {device}"
                )
            self.definitions[line.name] = line
        cpp = [k for k in self.definitions.values() if k.language == "cpp"]
        triton = [k for k in self.definitions.values() if k.language == "triton"]
        self.cpp = None
        if cpp:
            from wrapgen.kernels.cpp.runtime import CppKernels

            self.cpp = CppKernels([k.source for k in cpp])
        self.triton = None
        if triton:
            from wrapgen.kernels.triton.runtime import TritonKernels

            self.triton = TritonKernels([(k.name, k.source, k.metadata) for k in triton])
        self.bound: dict[tuple[str, str], Callable[..., int | None]] = {}

    def launch(self, name: str, args: list[object], grid: list[int]) -> None:
        """Run kernel `name` on `args` (tensors and ints) over `grid`."""
        definition = self.definitions[name]
        if definition.language == "cpp":
            assert self.cpp is not None
            signature = "".join("p" if isinstance(a, torch.Tensor) else "i" for a in args)
            fn = self.bound.get((name, signature))
            if fn is None:
                fn = self.bound[(name, signature)] = self.cpp.bind(name, signature, returns_status(definition))
            status = fn(*(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))
            if status:
                raise IndexError(out_of_range_message(definition))
            return
        assert self.triton is not None
        device = torch.device(kernel_device(definition))
        gx, gy, gz = (list(grid) + [1, 1, 1])[:3]
        if device.type != "cuda":
            self.triton.launcher(name)(gx, gy, gz, None, *args)
            return
        with torch.cuda.device(device.index or 0):  # launch on the kernel's device, on its current stream
            self.triton.launcher(name)(gx, gy, gz, torch._C._cuda_getCurrentRawStream(device.index or 0), *args)
