"""`torch.ops.wrapgen.cpp_kernel`: a generated C++ kernel launch as a torch operator.

The FX target puts each C++ kernel call in its graph as this op, so an FX consumer sees an
operator with a schema — which tensors it reads, which it writes (`Tensor(a!)[]`) — rather
than an opaque Python closure, and can run, trace (fake/meta kernel) or reorder it.

    cpp_kernel(str library, str kernel, str order, Tensor[] reads, Tensor(a!)[] writes, SymInt[] ints) -> ()

`library` is the shared library holding all C++ kernels of one program (built once, by
`build.build_library`); `kernel` the C function's name; `order` has one letter per C
argument — "r" next of `reads`, "w" next of `writes` (passed as data pointers, storage
offset included), "i" next of `ints` (int64) — after an optional leading "!": the kernel
returns an int64 status, nonzero when an index it read from tensor data was out of range
(the op then raises IndexError).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence

import torch

from wrapgen.kernels.cpp.build import build_library
from wrapgen.kernels.cpp.codegen import OUT_OF_RANGE

SCHEMA = "cpp_kernel(str library, str kernel, str order, Tensor[] reads, Tensor(a!)[] writes, SymInt[] ints) -> ()"

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}


def library_for(sources: Sequence[str]) -> str:
    """Build (or find in the cache) the one library for a program's kernel sources; its path."""
    return str(build_library(list(sources)))


def _library(path: str) -> ctypes.CDLL:
    with _lock:
        if path not in _libraries:
            _libraries[path] = ctypes.CDLL(path)
        return _libraries[path]


@functools.lru_cache(maxsize=4096)
def _launcher(path: str, kernel: str, order: str) -> Callable[[list, list, list], None]:
    """The kernel's C function with its argument types fixed, and how to gather its arguments."""
    checked = order.startswith("!")
    order = order.removeprefix("!")
    if set(order) - set("rwi"):
        raise ValueError(f"wrapgen::cpp_kernel: bad argument order {order!r} (letters r, w, i after an optional !)")
    fn = getattr(_library(path), kernel)
    fn.argtypes = [ctypes.c_int64 if c == "i" else ctypes.c_void_p for c in order]
    fn.restype = ctypes.c_int64 if checked else None
    counts = (order.count("r"), order.count("w"), order.count("i"))

    def launch(reads: list, writes: list, ints: list) -> None:
        if (len(reads), len(writes), len(ints)) != counts:
            raise ValueError(
                f"wrapgen::cpp_kernel {kernel}: order {order!r} takes {counts[0]} read, {counts[1]} written "
                f"tensors and {counts[2]} ints; got {len(reads)}, {len(writes)}, {len(ints)}"
            )
        r, w, i = iter(reads), iter(writes), iter(ints)
        if fn(*[next(r).data_ptr() if c == "r" else next(w).data_ptr() if c == "w" else next(i) for c in order]) and checked:
            raise IndexError(f"{kernel}: {OUT_OF_RANGE}")

    return launch


def _cpu(library: str, kernel: str, order: str, reads: list, writes: list, ints: list) -> None:
    for t in (*reads, *writes):
        if t.device.type != "cpu":
            raise ValueError(f"wrapgen::cpp_kernel {kernel}: a tensor is on {t.device}; C++ kernels run on the CPU")
    _launcher(library, kernel, order)(reads, writes, ints)


def _fake(library: str, kernel: str, order: str, reads: list, writes: list, ints: list) -> None:
    """Shapes do not change and nothing is returned: tracing needs no work."""


def _register() -> None:
    if hasattr(torch.ops.wrapgen, "cpp_kernel"):
        return
    library = torch.library.Library("wrapgen", "FRAGMENT")
    library.define(SCHEMA)
    library.impl("cpp_kernel", _cpu, "CPU")
    torch.library.register_fake("wrapgen::cpp_kernel", _fake, lib=library)
    _registration.append(library)  # the Library object must outlive the registration


_registration: list[torch.library.Library] = []
_register()

cpp_kernel = torch.ops.wrapgen.cpp_kernel.default
