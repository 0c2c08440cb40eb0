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


@dataclass(frozen=True)
class CpuOverrides(DeviceOverrides):
    device_type: str = "cpu"

    def python_allocate(self, sizes: str, strides: str, dtype: str, device: str) -> str:
        # torch's C++ fast path for CPU allocations: no Python argument parsing.
        return f"empty_strided_cpu({sizes}, {strides}, {dtype})"


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
