"""Call a package's array-ref entry (`wg_run_arrayref`, cpp_runtime/include/wrapgen/arrayref.h)
from Python: contiguous CPU tensors in, new tensors out.

The library and its constants are bound by `CppModel` (the handle loader); a call packs one
buffer of descriptors (data pointer, dtype, rank, sizes) with `struct` and passes the outputs'
memory, allocated here, to be written in place. The library checks every descriptor itself,
so what this side misses still comes back as InputMismatchError naming the argument.
"""

from __future__ import annotations

import ctypes
import struct

import torch

from wrapgen.backends.cpp.loader import CppModel, ModelLoadError, raise_error
from wrapgen.errors import InputMismatchError

# torch's ScalarType numbers (WgDtype in arrayref.h; what aoti_torch_dtype_*() return)
DTYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
}
_ARRAY = struct.Struct("=QiiQQ")  # WgArray: data, dtype, rank, sizes, strides
_MESSAGE_SIZE = 1024


class _Call:
    """One call's C memory (descriptors, sizes, message), reused: each call takes a free one."""

    __slots__ = ("buffer", "address", "message", "arguments")

    def __init__(self, n: int, m: int, max_rank: int) -> None:
        arrays = _ARRAY.size * (n + m)
        self.buffer = ctypes.create_string_buffer(arrays + 8 * max_rank * (n + m))
        self.address = ctypes.addressof(self.buffer)
        self.message = ctypes.create_string_buffer(_MESSAGE_SIZE)
        self.arguments = (
            ctypes.c_void_p(self.address), ctypes.c_int64(n),
            ctypes.c_void_p(self.address + _ARRAY.size * n), ctypes.c_int64(m),
            ctypes.c_void_p(ctypes.addressof(self.message)), ctypes.c_int64(_MESSAGE_SIZE),
        )

    def sizes_address(self, slot: int, n: int, m: int, max_rank: int) -> int:
        return self.address + _ARRAY.size * (n + m) + 8 * max_rank * slot


class ArrayRefModel:
    """`model(tensors)` runs the array-ref entry on contiguous CPU tensors; returns a tuple of new tensors."""

    def __init__(self, library: str, constants: list[torch.Tensor]) -> None:
        self.handles = CppModel(library)
        self.handles.set_constants(constants)
        try:
            self._entry = self.handles.library.wg_run_arrayref
        except AttributeError:
            raise ModelLoadError(f"{library} has no array-ref entry: build it with aot_compile(..., arrayref=True)") from None
        self._entry.restype = ctypes.c_int32
        self._entry.argtypes = None
        meta = self.handles.metadata
        self.inputs = [(s["name"], [int(v) for v in s["sizes"]]) for s in meta["inputs"]]
        if any(s["kind"] != "tensor" for s in meta["inputs"]):
            raise ModelLoadError(f"{library}: the array-ref entry takes tensors only")
        self.outputs = [(_dtype(s["dtype"]), tuple(int(v) for v in s["sizes"])) for s in meta.get("arrayref_outputs", [])]
        self._max_rank = max([8] + [len(s) for _, s in self.inputs] + [len(s) for _, s in self.outputs])
        self._free: list[_Call] = []

    def _new_call(self) -> _Call:
        n, m = len(self.inputs), len(self.outputs)
        call = _Call(n, m, self._max_rank)
        for j, (_, sizes) in enumerate(self.outputs):  # output shapes are fixed: packed once
            at = call.sizes_address(n + j, n, m, self._max_rank)
            struct.pack_into(f"={len(sizes)}q", call.buffer, at - call.address, *sizes)
        return call

    def __call__(self, args: list) -> tuple:
        n, m = len(self.inputs), len(self.outputs)
        if len(args) != n:
            raise InputMismatchError(f"expected {n} inputs, got {len(args)}")
        call = self._free.pop() if self._free else self._new_call()
        try:
            buffer, rank_cap = call.buffer, self._max_rank
            for i, value in enumerate(args):
                if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
                    raise InputMismatchError(f"input {i} ({self.inputs[i][0]}): expected a CPU tensor")
                if not value.is_contiguous():
                    raise InputMismatchError(f"input {i} ({self.inputs[i][0]}): not contiguous")
                shape = value.shape
                if len(shape) > rank_cap:
                    raise InputMismatchError(f"input {i} ({self.inputs[i][0]}): rank {len(shape)}, expected {len(self.inputs[i][1])}")
                sizes = call.sizes_address(i, n, m, rank_cap)
                struct.pack_into(f"={len(shape)}q", buffer, sizes - call.address, *shape)
                _ARRAY.pack_into(buffer, _ARRAY.size * i, value.data_ptr(), DTYPE_CODES.get(value.dtype, -1), len(shape), sizes, 0)
            results = [torch.empty(sizes, dtype=dtype) for dtype, sizes in self.outputs]
            for j, out in enumerate(results):
                _ARRAY.pack_into(buffer, _ARRAY.size * (n + j), out.data_ptr(), DTYPE_CODES[out.dtype], out.dim(),
                                 call.sizes_address(n + j, n, m, rank_cap), 0)
            constants = self.handles._constants  # one consistent set for this call
            status = self._entry(constants.array, constants.count, *call.arguments)
            if status != 0:
                raise_error(status, call.message.value.decode(errors="replace"))
            return tuple(results)
        finally:
            self._free.append(call)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ModelLoadError(f"unknown dtype {name!r} in the package's metadata")
    return dtype
