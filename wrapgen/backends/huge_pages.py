"""Transparent huge pages for large CPU buffers.

A fresh CPU buffer of many MiB comes straight from `mmap`, and its first write faults in one
4 KiB page at a time: for a 32 MiB output that is 8192 page faults, which on the machines we
measured cost 2-3x the kernel that writes it. Advising the kernel (`madvise(MADV_HUGEPAGE)`)
right after allocating, before anything touches the buffer, makes each fault map 2 MiB
instead. Under Linux's default THP mode ("madvise") nothing else gets huge pages, so the
advice is what turns them on; where THP is "always" it is redundant and where it is "never"
(or not built in) it does nothing. The advice changes no ownership: torch's allocator frees
the buffer as usual.

Emitters ask `advised_bytes(type)` whether an allocation gets the advice and call
`advise_huge_pages` (Python and fx targets) or `wrapgen::advise_huge_pages` (C++ target,
cpp_runtime/include/wrapgen/runtime.h) with the buffer's byte size.
"""

from __future__ import annotations

import ctypes
import sys

import sympy
import torch

from wrapgen import config
from wrapgen.wrapper_ir.values import TensorType

# x86-64's and aarch64's (4 KiB base pages) transparent huge page size.
HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14


def advised_bytes(t: TensorType) -> sympy.Expr | None:
    """The byte size (an expression of the size symbols) to advise after allocating `t`, or None
    when `t` gets no advice: not on the CPU, not Linux, `config.cpu_huge_pages` off, or a
    size known to be under one huge page."""
    if t.device.type != "cpu" or not config.cpu_huge_pages or not sys.platform.startswith("linux"):
        return None
    nbytes = _storage_bytes(t)
    if nbytes.is_Integer and int(nbytes) < HUGE_PAGE_BYTES:
        return None
    return nbytes


def _storage_bytes(t: TensorType) -> sympy.Expr:
    """Bytes from the first to one past the last element (non-positive when a size is 0)."""
    sizes = [sympy.sympify(s) for s in t.sizes]
    if t.strides is None:
        return sympy.Mul(*sizes) * t.dtype.itemsize
    extent = 1 + sum(((s - 1) * sympy.sympify(st) for s, st in zip(sizes, t.strides)), sympy.Integer(0))
    return sympy.expand(extent * t.dtype.itemsize)


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


def advise_huge_pages(buffer: torch.Tensor, nbytes: int) -> None:
    """Advise huge pages for the whole huge pages inside a fresh buffer's `nbytes`. Advice
    only: a kernel that refuses it (EINVAL without THP) leaves the buffer as it was."""
    if nbytes < HUGE_PAGE_BYTES or _madvise is None:
        return
    pages = whole_huge_pages(buffer.data_ptr(), nbytes)
    if pages is not None:
        _madvise(pages[0], pages[1] - pages[0], _MADV_HUGEPAGE)
