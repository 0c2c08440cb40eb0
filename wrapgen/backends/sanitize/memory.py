"""Byte-level views of tensor storage for the sanitizer: which bytes of a storage a tensor's
elements occupy, poisoning, and before/after snapshots.

Poison is every bit set (0xFF bytes): a NaN in every float format (f16, bf16, f32, f64) read at
any element boundary, -1 in signed integers, 255 in u8, so a stale read shows in the results
even where the sanitizer's own stale-read check does not see it (inside a kernel).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

POISON = 0xFF

StorageKey = tuple[str, int]  # (device, address of the storage's first byte)


def tensors_in(value: object) -> Iterator[torch.Tensor]:
    """The tensors a value holds: itself, or those in a (nested) tuple or list of results."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)


def storage_key(t: torch.Tensor) -> StorageKey:
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D u8 tensor over all of `t`'s storage."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes of storage `t`'s elements occupy (an empty span for no elements)."""
    k = t.element_size()
    start = t.storage_offset() * k
    if t.numel() == 0:
        return start, start
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    return start + low * k, start + (high + 1) * k


def element_mask(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A bool tensor over `nbytes` bytes of storage, True at every byte of `t`'s elements."""
    mask = torch.zeros(nbytes, dtype=torch.bool, device=t.device)
    if t.numel() == 0:
        return mask
    k = t.element_size()
    strides = [s * k for s in t.stride()]
    for byte in range(k):
        torch.as_strided(mask, t.shape, strides, t.storage_offset() * k + byte).fill_(True)
    return mask


class Snapshot:
    """The bytes of some storages before a line runs, to find what it changed."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.before: dict[StorageKey, tuple[torch.Tensor, torch.Tensor]] = {}
        for t in tensors:
            key = storage_key(t)
            if key not in self.before and t.untyped_storage().nbytes() > 0:
                data = storage_bytes(t)
                self.before[key] = (data, data.clone())

    def changed(self) -> Iterator[tuple[StorageKey, torch.Tensor]]:
        """(storage, bool mask of the bytes that differ now) for every storage that changed."""
        for key, (data, before) in self.before.items():
            if data.untyped_storage().nbytes() != before.numel():
                continue  # resized by the line (an out= argument of the wrong size): not ours to judge
            diff = data != before
            if bool(diff.any()):
                yield key, diff
