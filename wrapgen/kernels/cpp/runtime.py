"""What generated Python modules call to get at their C++ kernels: load the library once,
bind each kernel's C function pointer once (ctypes, argument types fixed up front)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from wrapgen.kernels.cpp.build import load_library

_ARGTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64}


class CppKernels:
    """The kernels of one program, in one shared library."""

    def __init__(self, sources: list[str]) -> None:
        self.library = load_library(sources)

    def bind(self, name: str, signature: str, returns_status: bool = False) -> Callable[..., int | None]:
        """`signature`: one letter per argument, "p" for a data pointer, "i" for an int64.
        A kernel that `returns_status` returns an int64 (nonzero: an index was out of range)."""
        fn = getattr(self.library, name)
        fn.argtypes = [_ARGTYPES[c] for c in signature]
        fn.restype = ctypes.c_int64 if returns_status else None
        return fn
