"""Per-device pieces of emitted code, so a new device is one registration.

Emitters ask the overrides of a tensor's device type how to synchronize, guard the
device and make random example data, instead of testing device names themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wrapgen.backends import huge_pages
from wrapgen.kernels.cpp.codegen import OUT_OF_RANGE, STATUS_KEY


@dataclass(frozen=True)
class DeviceOverrides:
    """How host code talks to one device type. Subclass and register for a new device."""

    device_type: str

    def python_synchronize(self) -> str:
        """A Python statement that waits for queued work (empty when work is synchronous)."""
        return ""

    def python_device_guard(self, index: int | None) -> str | None:
        """A context-manager expression that makes `index` the current device, if needed."""
        return None

    def synchronize(self) -> None:
        """Wait for the device from Python (benchmarks)."""

    def python_allocate(self, sizes: str, strides: str, dtype: str, device: str) -> str:
        """A Python expression that allocates an uninitialized strided tensor."""
        return f"_empty_strided({sizes}, {strides}, dtype={dtype}, device={device})"

    def advises_huge_pages(self, t) -> bool:
        """Whether a fresh buffer of TensorType `t` is advised onto huge pages right after it
        is allocated (backends/huge_pages.py)."""
        return False

    def python_call_entry(self, index: int | None) -> list[str]:
        """Statements at the very start of `call` (before its arguments are unpacked) for a
        program whose tensors live on device `index` of this type."""
        return []

    def kernel_languages(self) -> tuple[str, ...]:
        """Kernel languages this device can build and launch from Python."""
        return ()

    def python_kernel_loader(self, kernels: list, signatures: dict[str, str]) -> list[str]:
        """Module-level Python that builds/loads `kernels` (KernelDefinition lines) and binds
        each to a module variable of the kernel's name, once, at import."""
        lines: list[str] = []
        triton = [k for k in kernels if k.language == "triton"]
        if triton:
            lines += triton_kernel_loader(triton)
        if len(triton) != len(kernels):
            raise NotImplementedError(f"no loader for {kernels[0].language} kernels on device type {self.device_type!r}")
        return lines

    def python_call_prologue(self, index: int | None) -> list[str]:
        """Statements at the start of `call` before kernels of this device launch (get a stream)."""
        return []

    def python_kernel_launch(self, kernel, args: list[tuple[str, bool]], grid: list[str]) -> str:
        """A Python statement launching `kernel` (its KernelDefinition); `args` are (expression,
        is_tensor) pairs and `grid` the launch grid's expressions."""
        if kernel.language == "triton":
            g = (grid + ["1", "1", "1"])[:3]
            return f"{kernel.name}({', '.join(g)}, {self.python_stream()}, {', '.join(a for a, _ in args)})"
        raise NotImplementedError(f"no kernel launcher for device type {self.device_type!r}")

    def python_stream(self) -> str:
        """The expression for the stream a launch goes on."""
        return "None"

    # -- C++ wrappers (the cpp target) --------------------------------------------------------
    def cpp_kernel_languages(self) -> tuple[str, ...]:
        """Kernel languages a C++ wrapper can launch on this device."""
        return ()

    def cpp_build_flags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(compile flags, link flags) a C++ model that uses this device needs."""
        return (), ()

    def cpp_run_prologue(self, index: int | None) -> list[str]:
        """Statements at the start of a C++ run of a program whose tensors live on this device."""
        return []

    def cpp_launch_prologue(self, index: int | None) -> list[str]:
        """Statements before the first kernel launch of a run on this device (get a stream)."""
        return []

    def cpp_kernel_launch(self, kernel, args: list[tuple[str, str]], grid: list[str]) -> list[str]:
        """C++ statements launching `kernel` (its KernelDefinition); `args` are (expression, type)
        pairs, type "ptr" (a `void*`), "int32" or "int64"."""
        raise NotImplementedError(f"no C++ kernel launcher for device type {self.device_type!r}")


def returns_status(kernel) -> bool:
    """Whether a C++ kernel (its KernelDefinition) returns a status to check: nonzero when an
    index it read from tensor data was out of range (see kernels/cpp/codegen.py)."""
    return bool(dict(kernel.metadata).get(STATUS_KEY, False))


def out_of_range_message(kernel) -> str:
    """What a caller raises when `kernel` (one that `returns_status`) reports a bad index."""
    return f"{kernel.name}: {OUT_OF_RANGE}"


def triton_kernel_loader(kernels: list) -> list[str]:
    """Compile the program's Triton kernels at import and bind one launcher per kernel. Sources
    and metadata are embedded with repr(), which is safe for any text."""
    lines = ["from wrapgen.kernels.triton.runtime import TritonKernels", "", "_triton_kernels = TritonKernels(["]
    lines += [f"    ({k.name!r}, {k.source!r}, {k.metadata!r})," for k in kernels]
    lines += ["])"]
    lines += [f"{k.name} = _triton_kernels.launcher({k.name!r})" for k in kernels]
    return lines


@dataclass(frozen=True)
class CpuOverrides(DeviceOverrides):
    device_type: str = "cpu"

    def python_allocate(self, sizes: str, strides: str, dtype: str, device: str) -> str:
        # torch's C++ fast path for CPU allocations: no Python argument parsing.
        return f"empty_strided_cpu({sizes}, {strides}, {dtype})"

    def advises_huge_pages(self, t) -> bool:
        # Large fresh buffers fault in 2 MiB at a time instead of 4 KiB (huge_pages.py).
        return huge_pages.gets_advice(t)

    def kernel_languages(self) -> tuple[str, ...]:
        from wrapgen.kernels.triton import compat

        # Triton kernels run on the CPU only in Triton's interpreter (TRITON_INTERPRET=1).
        return ("cpp", "triton") if compat.available() and compat.interpreting() else ("cpp",)

    def python_kernel_loader(self, kernels: list, signatures: dict[str, str]) -> list[str]:
        # All C++ kernels of the program go into one shared library; sources are embedded with
        # repr(), which is safe for any text (quotes, backslashes, newlines).
        cpp = [k for k in kernels if k.language == "cpp"]
        lines = super().python_kernel_loader([k for k in kernels if k.language != "cpp"], signatures) if len(cpp) != len(kernels) else []
        if cpp:
            lines += ["from wrapgen.kernels.cpp.runtime import CppKernels", "", "_cpp_sources = ["]
            lines += [f"    {k.source!r}," for k in cpp]
            lines += ["]", "_cpp_kernels = CppKernels(_cpp_sources)"]
            lines += [f"{k.name} = _cpp_kernels.bind({k.name!r}, {signatures.get(k.name, '')!r}"
                      f"{', returns_status=True' if returns_status(k) else ''})" for k in cpp]
        return lines

    def cpp_kernel_languages(self) -> tuple[str, ...]:
        return ("cpp",)

    def cpp_kernel_launch(self, kernel, args: list[tuple[str, str]], grid: list[str]) -> list[str]:
        # The kernel is a C function in the same library: a plain call.
        call = f"{kernel.name}({', '.join(a for a, _ in args)})"
        if returns_status(kernel):
            return [f'if ({call} != 0) throw wrapgen::Error(WG_INDEX_OUT_OF_RANGE, "{out_of_range_message(kernel)}");']
        return [f"{call};"]

    def python_kernel_launch(self, kernel, args: list[tuple[str, bool]], grid: list[str]) -> str:
        if kernel.language != "cpp":
            return super().python_kernel_launch(kernel, args, grid)
        # ctypes call of the bound C function: tensors as data pointers (storage offset included).
        call = f"{kernel.name}({', '.join(f'{a}.data_ptr()' if is_tensor else a for a, is_tensor in args)})"
        if returns_status(kernel):
            return f"if {call}: raise IndexError({out_of_range_message(kernel)!r})"
        return call


@dataclass(frozen=True)
class CudaOverrides(DeviceOverrides):
    device_type: str = "cuda"

    def python_synchronize(self) -> str:
        return "torch.cuda.synchronize()"

    def python_device_guard(self, index: int | None) -> str | None:
        return f"torch.cuda.device({index or 0})"

    def python_call_entry(self, index: int | None) -> list[str]:
        # Allocations go to the current device: make the program's device current, checked
        # with one cheap call, switching (and restoring on the way out) only when it is not.
        return [
            f"if current_cuda_device() != {index or 0}:",
            f"    with torch.cuda.device({index or 0}):",
            "        return call(args)",
        ]

    def python_allocate(self, sizes: str, strides: str, dtype: str, device: str) -> str:
        # torch's C++ fast path (current device), as torch.compile's wrappers use.
        return f"empty_strided_cuda({sizes}, {strides}, {dtype})"

    def kernel_languages(self) -> tuple[str, ...]:
        from wrapgen.kernels.triton import compat

        return ("triton",) if compat.available() else ()

    def python_call_prologue(self, index: int | None) -> list[str]:
        # The raw handle of the current stream, read once per call (not once per launch).
        return [f"_stream = _get_raw_stream({index or 0})"]

    def python_kernel_loader(self, kernels: list, signatures: dict[str, str]) -> list[str]:
        return ["from torch._C import _cuda_getCurrentRawStream as _get_raw_stream"] + super().python_kernel_loader(kernels, signatures)

    def python_stream(self) -> str:
        return "_stream"

    def cpp_kernel_languages(self) -> tuple[str, ...]:
        return ("triton",)

    def cpp_build_flags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # USE_CUDA declares the CUDA guard/stream shims; they live in libtorch_cuda.
        return ("-DUSE_CUDA",), ("-ltorch_cuda", "-ldl")

    def cpp_run_prologue(self, index: int | None) -> list[str]:
        return [f"wrapgen::CudaDeviceGuard cuda_guard({index or 0});"]

    def cpp_launch_prologue(self, index: int | None) -> list[str]:
        return [f"void* cuda_stream_{index or 0} = wrapgen::current_cuda_stream({index or 0});"]

    def cpp_kernel_launch(self, kernel, args: list[tuple[str, str]], grid: list[str]) -> list[str]:
        # Triton's cubin through the driver API (wrapgen/cuda_kernels.h), on PyTorch's current
        # stream read once per run. Maybe-unaligned pointers pick the variant built without
        # the 16-byte alignment assumption when they are not aligned.
        index = torch.device(kernel_device(kernel)).index or 0
        unaligned = set(dict(kernel.metadata).get("unaligned", ()))
        names = dict(kernel.metadata)["arg_names"]
        lines = ["{"]
        ctypes = {"ptr": "void*", "int32": "int32_t", "int64": "int64_t"}
        for i, (expr, kind) in enumerate(args):
            lines.append(f"  {ctypes[kind]} a{i} = static_cast<{ctypes[kind]}>({expr});")
        g = (grid + ["1", "1", "1"])[:3]
        params = ", ".join(f"&a{i}" for i in range(len(args)))
        checks = [f"wrapgen::cuda::aligned16(a{i})" for i, n in enumerate(names) if n in unaligned]
        chosen = f"wg_cuda_{kernel.name}"
        if checks:
            chosen = f"({' && '.join(checks)} ? wg_cuda_{kernel.name} : wg_cuda_{kernel.name}_unaligned)"
        lines.append(f"  {chosen}.launch({index}, {g[0]}, {g[1]}, {g[2]}, cuda_stream_{index}, {{{params}}});")
        lines.append("}")
        return lines

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def kernel_device(kernel) -> str:
    """The device a kernel (a KernelDefinition) runs on: its metadata's "device", else the
    usual one for its language."""
    for key, value in kernel.metadata:
        if key == "device":
            return str(value)
    return "cuda" if kernel.language == "triton" else "cpu"


_OVERRIDES: dict[str, DeviceOverrides] = {}


def register_device_overrides(overrides: DeviceOverrides) -> None:
    _OVERRIDES[overrides.device_type] = overrides


def device_overrides(device: torch.device | str) -> DeviceOverrides:
    device_type = torch.device(device).type
    try:
        return _OVERRIDES[device_type]
    except KeyError:
        raise ValueError(f"no DeviceOverrides registered for device type {device_type!r}") from None


register_device_overrides(CpuOverrides())
register_device_overrides(CudaOverrides())
