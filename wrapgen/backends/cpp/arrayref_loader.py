"""Call a package's array-ref entry (`wg_run_arrayref_bound`, cpp_runtime/include/wrapgen/arrayref.h)
from Python: contiguous CPU tensors in, new tensors out.

The library and its constant handles are held by `CppModel` (the handle loader); each set of
constants is bound once (`wg_arrayref_bind`: checked against the program, data pointers kept),
so a call does not ask every weight for its pointer. A call packs one buffer of descriptors (data
pointer, dtype, rank, sizes) with `struct` and passes the outputs' memory, allocated here, to be
written in place. The library checks every descriptor itself, so what this side misses still
comes back as InputMismatchError naming the argument. Packages from before binding existed are
called through `wg_run_arrayref` with the handles.
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
    """One call's C memory (descriptors, then the sizes they point at, and the message), reused:
    each call takes a free one, so threads never share one."""

    __slots__ = ("buffer", "message", "arguments", "sizes")

    def __init__(self, n: int, m: int, ranks: list[int]) -> None:
        arrays = _ARRAY.size * (n + m)
        self.buffer = ctypes.create_string_buffer(arrays + 8 * max(1, sum(ranks)))
        address = ctypes.addressof(self.buffer)
        self.sizes = []  # the address of each argument's sizes
        at = address + arrays
        for rank in ranks:
            self.sizes.append(at)
            at += 8 * rank
        self.message = ctypes.create_string_buffer(_MESSAGE_SIZE)
        self.arguments = (
            ctypes.c_void_p(address), ctypes.c_int64(n),
            ctypes.c_void_p(address + _ARRAY.size * n), ctypes.c_int64(m),
            ctypes.c_void_p(ctypes.addressof(self.message)), ctypes.c_int64(_MESSAGE_SIZE),
        )


class _Binding:
    """One constant set bound by the library (`wg_arrayref_bind`); unbound when the last call
    holding it has returned. Keeps the set, whose handles the binding points at, alive."""

    __slots__ = ("constants", "context", "_unbind")

    def __init__(self, library: ctypes.CDLL, constants) -> None:
        self.constants, self.context, self._unbind = constants, ctypes.c_void_p(), library.wg_arrayref_unbind
        bind = library.wg_arrayref_bind
        bind.restype = ctypes.c_int32
        message = ctypes.create_string_buffer(_MESSAGE_SIZE)
        status = bind(constants.array, constants.count, ctypes.byref(self.context), message, ctypes.c_int64(_MESSAGE_SIZE))
        if status != 0:
            raise_error(status, message.value.decode(errors="replace"))

    def __del__(self) -> None:
        if self.context:
            context, self.context = self.context, ctypes.c_void_p()
            self._unbind(context)


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
        self._bound_entry = getattr(self.handles.library, "wg_run_arrayref_bound", None)
        if self._bound_entry is not None:
            self._bound_entry.restype = ctypes.c_int32
            self._bound_entry.argtypes = None
        self._binding: _Binding | None = None
        self._bind()
        meta = self.handles.metadata
        if any(s["kind"] != "tensor" for s in meta["inputs"]):
            raise ModelLoadError(f"{library}: the array-ref entry takes tensors only")
        self.inputs = [(s["name"], len(s["sizes"])) for s in meta["inputs"]]
        self.outputs = [(_dtype(s["dtype"]), tuple(int(v) for v in s["sizes"])) for s in meta.get("arrayref_outputs", [])]
        self._ranks = [r for _, r in self.inputs] + [len(sizes) for _, sizes in self.outputs]
        n, m = len(self.inputs), len(self.outputs)
        # One pack per call: every descriptor, then every size (the outputs' are fixed)
        self._pack = struct.Struct("=" + "QiiQQ" * (n + m) + "q" * sum(self._ranks))
        self._output_sizes = [v for _, sizes in self.outputs for v in sizes]
        self._free: list[_Call] = []

    def update_constants(self, values: dict[str, torch.Tensor]) -> None:
        """New values for some constants, copied into the layout the program was compiled for (the
        entry reads their memory directly); calls in flight finish with the old set."""
        current = self.handles._constants.values
        new = []
        for spec, old in zip(self.handles.metadata["constants"], current):
            value = values.get(spec["name"])
            if value is None:
                new.append(old)
                continue
            if tuple(value.shape) != tuple(old.shape):
                raise ValueError(f"constant {spec['name']}: expected shape {tuple(old.shape)}, got {tuple(value.shape)}")
            new.append(torch.empty_strided(old.shape, old.stride(), dtype=old.dtype).copy_(value))
        self.handles.set_constants(new)
        self._bind()

    def _bind(self) -> None:
        """Bind the handle loader's current constants (calls in flight keep the previous binding)."""
        if self._bound_entry is not None:
            self._binding = _Binding(self.handles.library, self.handles._constants)

    def __call__(self, args: list) -> tuple:
        n = len(self.inputs)
        if len(args) != n:
            raise InputMismatchError(f"expected {n} inputs, got {len(args)}")
        call = self._free.pop() if self._free else _Call(n, len(self.outputs), self._ranks)
        try:
            fields: list = []
            sizes: list = []
            for i, value in enumerate(args):
                name, rank = self.inputs[i]
                if not isinstance(value, torch.Tensor) or not value.is_cpu:
                    raise InputMismatchError(f"input {i} ({name}): expected a CPU tensor")
                shape = value.shape
                if len(shape) != rank:
                    raise InputMismatchError(f"input {i} ({name}): expected rank {rank}, got {len(shape)}")
                if not value.is_contiguous():
                    raise InputMismatchError(f"input {i} ({name}): not contiguous")
                fields += (value.data_ptr(), DTYPE_CODES.get(value.dtype, -1), rank, call.sizes[i], 0)
                sizes += shape
            results = [torch.empty(shape, dtype=dtype) for dtype, shape in self.outputs]
            for j, out in enumerate(results):
                fields += (out.data_ptr(), DTYPE_CODES[out.dtype], len(self.outputs[j][1]), call.sizes[n + j], 0)
            self._pack.pack_into(call.buffer, 0, *fields, *sizes, *self._output_sizes)
            binding = self._binding  # one consistent set for this call, alive until it returns
            if binding is not None:
                status = self._bound_entry(binding.context, *call.arguments)
            else:
                constants = self.handles._constants
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
