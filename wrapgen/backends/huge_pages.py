"""Transparent huge pages for large CPU buffers.

A fresh CPU buffer of many MiB comes straight from `mmap`, and its first write faults in one
4 KiB page at a time: for a 32 MiB output that is 8192 page faults, which on the machines we
measured cost 2-3x the kernel that writes it. Advising the kernel (`madvise(MADV_HUGEPAGE)`)
right after allocating, before anything touches the buffer, makes each fault map 2 MiB
instead. Under Linux's default THP mode ("madvise") nothing else gets huge pages, so the
advice is what turns them on; where THP is "always" it is redundant and where it is "never"
(or not built in) it does nothing. The advice changes no ownership: torch's allocator frees
the buffer as usual.

Emitters ask `gets_advice(type)` whether an allocation gets the advice and then call
`advise_huge_pages(buffer)` (Python and fx targets) or `wrapgen::advise_huge_pages(t)` (C++
target, cpp_runtime/include/wrapgen/runtime.h). Both read the size from the buffer's storage
at run time, so a dynamic size that turns out small (or zero) is never advised.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

from wrapgen import config
from wrapgen.wrapper_ir.values import TensorType, storage_bytes

# x86-64's and aarch64's (4 KiB base pages) transparent huge page size.
HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)  # Linux's value where Python does not name it


def gets_advice(t: TensorType) -> bool:
    """Whether a fresh buffer of type `t` is advised after allocation: on the CPU, on Linux,
    with `config.cpu_huge_pages` on, and not known at compile time to be under one huge page."""
    if t.device.type != "cpu" or not config.cpu_huge_pages or not sys.platform.startswith("linux"):
        return False
    nbytes = storage_bytes(t)
    return not (nbytes.is_Integer and int(nbytes) < HUGE_PAGE_BYTES)


def _load_madvise():
    """libc's madvise, or None where there is none to call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()


def whole_huge_pages(start: int, nbytes: int) -> tuple[int, int] | None:
    """[first, end) of the 2 MiB-aligned pages lying wholly inside [start, start + nbytes),
    or None when there is none: advice never reaches memory beyond the buffer."""
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (start + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    return (first, end) if end > first else None


def advise_huge_pages(buffer: torch.Tensor) -> None:
    """Advise huge pages for the whole huge pages inside a fresh buffer's storage. Advice
    only: a kernel that refuses it (EINVAL without THP) leaves the buffer as it was."""
    if _madvise is None:
        return
    storage = buffer.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes < HUGE_PAGE_BYTES:
        return
    pages = whole_huge_pages(storage.data_ptr(), nbytes)
    if pages is not None:
        _madvise(pages[0], pages[1] - pages[0], _MADV_HUGEPAGE)
