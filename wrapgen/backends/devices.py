"""Per-device pieces of emitted code, so a new device is one registration.

Emitters ask the overrides of a tensor's device type how to synchronize, guard the
device and make random example data, instead of testing device names themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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

    def kernel_languages(self) -> tuple[str, ...]:
        """Kernel languages this device can build and launch from Python."""
        return ()

    def python_kernel_loader(self, kernels: list, signatures: dict[str, str]) -> list[str]:
        """Module-level Python that builds/loads `kernels` (KernelDefinition lines) and binds
        each to a module variable of the kernel's name, once, at import."""
        raise NotImplementedError(f"no kernel launcher for device type {self.device_type!r}")

    def python_kernel_launch(self, kernel: str, args: list[tuple[str, bool]]) -> str:
        """A Python statement launching `kernel`; `args` are (expression, is_tensor) pairs."""
        raise NotImplementedError(f"no kernel launcher for device type {self.device_type!r}")


@dataclass(frozen=True)
class CpuOverrides(DeviceOverrides):
    device_type: str = "cpu"

    def python_allocate(self, sizes: str, strides: str, dtype: str, device: str) -> str:
        # torch's C++ fast path for CPU allocations: no Python argument parsing.
        return f"empty_strided_cpu({sizes}, {strides}, {dtype})"

    def kernel_languages(self) -> tuple[str, ...]:
        return ("cpp",)

    def python_kernel_loader(self, kernels: list, signatures: dict[str, str]) -> list[str]:
        # All C++ kernels of the program go into one shared library; sources are embedded with
        # repr(), which is safe for any text (quotes, backslashes, newlines).
        lines = ["from wrapgen.kernels.cpp.runtime import CppKernels", "", "_cpp_sources = ["]
        lines += [f"    {k.source!r}," for k in kernels]
        lines += ["]", "_cpp_kernels = CppKernels(_cpp_sources)"]
        lines += [f"{k.name} = _cpp_kernels.bind({k.name!r}, {signatures.get(k.name, '')!r})" for k in kernels]
        return lines

    def python_kernel_launch(self, kernel: str, args: list[tuple[str, bool]]) -> str:
        # ctypes call of the bound C function: tensors as data pointers (storage offset included).
        return f"{kernel}({', '.join(f'{a}.data_ptr()' if is_tensor else a for a, is_tensor in args)})"


@dataclass(frozen=True)
class CudaOverrides(DeviceOverrides):
    device_type: str = "cuda"

    def python_synchronize(self) -> str:
        return "torch.cuda.synchronize()"

    def python_device_guard(self, index: int | None) -> str | None:
        return f"torch.cuda.device({index or 0})"

    def synchronize(self) -> None:
        torch.cuda.synchronize()


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
