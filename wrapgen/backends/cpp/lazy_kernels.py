"""Compile a C++ model's GPU kernel variants on first use, for a library loaded in this process.

A model built by `wrapgen.compile(..., target="cpp")` embeds each Triton kernel's variant for
16-byte-aligned pointers; the variant for unaligned ones (an input that is a view at an odd
offset) is declared without a binary (`gpu_kernels.kernel_table_source(lazy_unaligned=True)`).
The library's C++ side asks the resolver attached here for it on its first launch, as the Python
target compiles it on first use. Binaries and resolvers stay alive for the process: a library is
never unloaded, and its kernels keep pointers into the binaries they were handed.
"""

from __future__ import annotations

import ctypes
import threading

from wrapgen.wrapper_ir.lines import KernelDefinition

UNALIGNED_SUFFIX = "_unaligned"


class KernelImage(ctypes.Structure):
    """wrapgen::cuda::KernelImage (cpp_runtime/include/wrapgen/cuda_kernels.h)."""

    _fields_ = [
        ("image", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("function_name", ctypes.c_void_p),
        ("shared_bytes", ctypes.c_uint32),
        ("num_warps", ctypes.c_uint32),
        ("scratch_params", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


RESOLVER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(KernelImage), ctypes.c_void_p, ctypes.c_int64)

# library path -> (its kernels by table name, its resolver); images by (library, kernel name)
_attached: dict[str, tuple[dict[str, KernelDefinition], object]] = {}
_images: dict[tuple[str, str], tuple[ctypes.Array, ctypes.Array, tuple[int, int, int]]] = {}
_lock = threading.Lock()


def attach(library: ctypes.CDLL, path: str, kernels: list[KernelDefinition]) -> None:
    """Give `library` (loaded from `path`) a resolver for `kernels`' lazy variants; no-op for a
    library built with every variant embedded."""
    setter = getattr(library, "wg_set_kernel_resolver", None)
    if setter is None:
        return
    wanted = {k.name + UNALIGNED_SUFFIX: k for k in kernels if dict(k.metadata).get("unaligned")}
    with _lock:
        if path in _attached:
            _attached[path][0].update(wanted)  # the same library loaded again: one resolver
            return
        table = dict(wanted)
        resolver = RESOLVER(lambda name, out, message, size: _resolve(path, table, name, out, message, size))
        _attached[path] = (table, resolver)
    setter.restype = None
    setter.argtypes = [RESOLVER]
    setter(resolver)


def _resolve(path: str, table: dict[str, KernelDefinition], name: bytes, out, message: int, size: int) -> int:
    """The C callback: compile the kernel named `name` and describe its binary in `out`."""
    try:
        key = (path, name.decode())
        with _lock:
            held = _images.get(key)
        if held is None:
            kernel = table.get(key[1])
            if kernel is None:
                raise KeyError(f"{path} asked for kernel {key[1]}, which it was not built with")
            from wrapgen.kernels.triton.runtime import unaligned_binary

            binary = unaligned_binary(kernel.name, kernel.source, kernel.metadata)
            made = (ctypes.create_string_buffer(binary.image, len(binary.image)),
                    ctypes.create_string_buffer(binary.function_name.encode()),
                    (binary.shared_bytes, binary.num_warps, binary.scratch_params))
            with _lock:
                held = _images.setdefault(key, made)
        image, function_name, facts = held
        out.contents.image = ctypes.addressof(image)
        out.contents.size = len(image)
        out.contents.function_name = ctypes.addressof(function_name)
        out.contents.shared_bytes, out.contents.num_warps, out.contents.scratch_params = facts
        return 0
    except BaseException as error:  # noqa: BLE001 - reported to C++, which raises it as the call's error
        text = f"{type(error).__name__}: {error}".encode(errors="replace")[: max(0, size - 1)]
        ctypes.memmove(message, text + b"\0", len(text) + 1)
        return 1
