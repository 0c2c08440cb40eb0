"""Load a C++ model library in-process and call it from Python (ctypes, the C ABI of
`cpp_runtime/include/wrapgen/abi.h`).

Tensors cross as `AtenTensorHandle`s made by torch's own helpers
(`torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors` / `alloc_tensors_by_stealing_from_void_ptrs`),
so no C++ extension has to be built against libtorch_python. Wrong inputs raise
`InputMismatchError` (from the library's own checks, or here for non-tensors), NaN/Inf under
check_finite raise FloatingPointError; the process never crashes on bad input.
"""

from __future__ import annotations

import array
import ctypes
import json
import struct
from collections.abc import Sequence

import torch

from wrapgen.errors import InputMismatchError
from wrapgen.kernels.streams import on_workspaces_cleared

WG_MODEL_ABI_VERSION = 1
_MESSAGE_SIZE = 4096
_KINDS = {"tensor": 0, "int": 1, "float": 2, "bool": 3, "none": 4}


class WgValue(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("i", ctypes.c_int64),
        ("f", ctypes.c_double),
        ("t", ctypes.c_void_p),
    ]


# WgValue as `struct` packs it: a whole call's inputs are written, and its outputs read, in one
# step each instead of one ctypes attribute access per field.
_VALUE_FORMAT = "iiqdQ"  # kind, reserved, i, f, t
_FIELDS = len(_VALUE_FORMAT)
assert struct.calcsize("=" + _VALUE_FORMAT) == ctypes.sizeof(WgValue)
_VALUE_SIZE = ctypes.sizeof(WgValue)
_HANDLE_OFFSET = struct.calcsize("=" + _VALUE_FORMAT[:-1])  # the tensor handle, the last field
_TENSOR_KIND, _INT_KIND, _FLOAT_KIND, _BOOL_KIND = _KINDS["tensor"], _KINDS["int"], _KINDS["float"], _KINDS["bool"]


class _CallBuffers:
    """The C memory one call passes to `wg_run` (inputs, outputs, error message), kept for the
    next call: a model's calls take a free set each (a list's pop/append is atomic), so
    threads, and a call nested in another, never share one."""

    __slots__ = ("fields", "inputs", "outputs", "message", "arguments", "tensor_kinds_packed")

    def __init__(self, n: int, m: int) -> None:
        self.fields = [0] * (_FIELDS * n)  # the input array's fields, refilled by each call
        self.inputs = (WgValue * max(1, n))()
        self.outputs = (WgValue * max(1, m))()
        self.message = ctypes.create_string_buffer(_MESSAGE_SIZE)
        self.tensor_kinds_packed = False  # every input's kind is packed as a tensor: a call writes handles only
        # wg_run's arguments after the constants, as ready C values (no conversion per call)
        self.arguments = (
            ctypes.c_void_p(ctypes.addressof(self.inputs)), ctypes.c_int64(n),
            ctypes.c_void_p(ctypes.addressof(self.outputs)), ctypes.c_int64(m),
            ctypes.c_void_p(ctypes.addressof(self.message)), ctypes.c_int64(_MESSAGE_SIZE),
        )


class _ConstantSet:
    """One binding of a model's constants: the handles `wg_run` borrows, in a C array. A call
    holds the set it started with, so a set swapped out meanwhile releases its references
    only after the last call that reads it has returned."""

    __slots__ = ("values", "handles", "array", "count")

    def __init__(self, values: list[torch.Tensor], handles: list[int]) -> None:
        self.values, self.handles = values, handles
        self.array = (ctypes.c_void_p * max(1, len(handles)))(*handles)
        self.count = ctypes.c_int64(len(handles))

    def __del__(self) -> None:
        if self.handles:
            handles, self.handles = self.handles, []
            _from_handles(handles)


class ModelLoadError(RuntimeError):
    """The library is not a wrapgen model this runtime can call."""


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _to_handles(tensors: list[torch.Tensor]) -> list[int]:
    """New `AtenTensorHandle`s (owning references) for tensors, as integers."""
    capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(tensors)
    reader = _capsule_reader() if len(capsules) >= _BATCH_MIN else None
    if reader is None:
        return [_capsule_pointer(c, None) for c in capsules]
    pointers = array.array("Q", bytes(8 * len(capsules)))
    reader(id(capsules), len(capsules), pointers.buffer_info()[0], 8)
    return pointers.tolist()


# Unwrapping a capsule through ctypes costs about half a microsecond: a decode step that passes
# its 103 weights and caches spent 50-150 µs of host time on it, a compiled optimizer step over
# 740 tensors 400 µs or more. One C loop reads every capsule's pointer field straight from the
# list instead, at the offsets CPython lays them at (a list's item array after its header, a
# capsule's pointer after the object header), checked once against PyCapsule_GetPointer.
_BATCH_MIN = 16
_LIST_ITEMS_OFFSET = 24  # PyListObject: ob_refcnt, ob_type, ob_size, then ob_item
_CAPSULE_POINTER_OFFSET = 16  # PyCapsule: ob_refcnt, ob_type, then pointer
_READER_SOURCE = f"""#include <cstdint>
#include <cstring>
// out + i * stride = the pointer field of item i of the list at `list` (each written as 8 bytes)
extern "C" void wg_read_capsule_pointers(const char* list, int64_t n, char* out, int64_t stride) {{
  const char* const* items = nullptr;
  std::memcpy(&items, list + {_LIST_ITEMS_OFFSET}, 8);
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * stride, items[i] + {_CAPSULE_POINTER_OFFSET}, 8);
}}
"""
_reader: list = []  # [the C loop, or None where it cannot be built or the layout differs]


def _capsule_reader():
    if _reader:
        return _reader[0]
    reader = None
    try:
        from wrapgen.kernels.cpp.build import load_library

        reader = load_library([_READER_SOURCE]).wg_read_capsule_pointers
        reader.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        reader.restype = None
        sample = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors([torch.empty(0), torch.empty(1)])
        expected = [_capsule_pointer(c, None) for c in sample]
        out = array.array("Q", [0, 0])
        reader(id(sample), 2, out.buffer_info()[0], 8)
        _from_handles(expected)
        if out.tolist() != expected:
            reader = None
    except Exception:  # no compiler here (a deployment host), or another layout: one capsule at a time
        reader = None
    _reader.append(reader)
    return reader


def _from_handles(handles: list[int]) -> list[torch.Tensor]:
    """Tensors for owning handles; the handles are consumed."""
    return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_capsule_new(h, None, None) for h in handles])


def raise_error(kind: int, message: str) -> None:
    if kind == 1:
        raise InputMismatchError(message)
    if kind == 2:
        raise FloatingPointError(message)
    if kind == 4:
        raise IndexError(message)
    raise RuntimeError(f"C++ model failed: {message}")


class CppModel:
    """A loaded model library: `model(args)` runs it on a list of inputs (the boxed convention)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.library = ctypes.CDLL(path)
        except OSError as e:
            raise ModelLoadError(f"cannot load the C++ model {path}: {e}") from None
        version = self.library.wg_abi_version
        version.restype = ctypes.c_uint32
        if version() != WG_MODEL_ABI_VERSION:
            raise ModelLoadError(f"{path} uses model ABI {version()}, this wrapgen expects {WG_MODEL_ABI_VERSION}")
        meta = self.library.wg_metadata
        meta.restype = ctypes.c_char_p
        self.metadata = json.loads(meta().decode())
        if self.metadata.get("wrapgen_ops"):
            from wrapgen.backends.cpp.collectives import register_forwarding_ops

            register_forwarding_ops()  # the ops the library calls through the dispatcher
        self._run = self.library.wg_run
        self._run.restype = ctypes.c_int32
        # (constants, num_constants, inputs, num_inputs, outputs, num_outputs, message, size):
        # every call passes ready ctypes values (`_CallBuffers.arguments`), so no argtypes
        self._run.argtypes = None
        # Models with CUDA graphs: their recorded matmuls use a cuBLAS workspace PyTorch owns
        # and may free (cuda_graphs.h, workspace_epoch); told of each clear, they record again.
        cleared = getattr(self.library, "wg_workspaces_cleared", None)
        if cleared is not None and torch.cuda.is_available():
            cleared.restype = None
            cleared.argtypes = []
            on_workspaces_cleared(path, cleared)
        self._live = self.library.wg_live_handles
        self._live.restype = ctypes.c_int64
        self.inputs = self.metadata["inputs"]
        self.output_kinds = [o["kind"] for o in self.metadata["outputs"]]
        self._tensor_positions = [i for i, s in enumerate(self.inputs) if s["kind"] == "tensor"]
        self._all_tensors = bool(self.inputs) and len(self._tensor_positions) == len(self.inputs)
        self._tensor_kinds = [_TENSOR_KIND] * len(self.inputs)
        # (position, kind, name) of each input, and the packers of the input and output arrays
        self._input_plan = tuple((i, _KINDS.get(s["kind"], _INT_KIND), s["name"]) for i, s in enumerate(self.inputs))
        self._pack_inputs = struct.Struct("=" + _VALUE_FORMAT * len(self.inputs))
        self._unpack_outputs = struct.Struct("=" + _VALUE_FORMAT * max(1, len(self.output_kinds)))
        self._free_buffers: list[_CallBuffers] = []
        self._constants = _ConstantSet([], [])

    def attach_kernel_compiler(self, kernels: list) -> None:
        """Let the library compile the GPU kernel variants it was built without (`kernels`: its
        Triton KernelDefinitions) on their first launch (lazy_kernels)."""
        from wrapgen.backends.cpp.lazy_kernels import attach

        attach(self.library, self.path, kernels)

    def live_handles(self) -> int:
        """Tensor handles the library's code holds now (0 between calls: the leak check)."""
        return int(self._live())

    def set_constants(self, values: Sequence[torch.Tensor | None]) -> None:
        """Bind the program's constants (in metadata order); the model keeps references to them."""
        specs = self.metadata["constants"]
        if len(values) != len(specs):
            raise ValueError(f"the model has {len(specs)} constants, got {len(values)}")
        missing = [s["name"] for s, v in zip(specs, values) if not isinstance(v, torch.Tensor)]
        if missing:
            raise ValueError(f"constants without a value: {', '.join(missing)}")
        constants = _ConstantSet(list(values), _to_handles(list(values)) if values else [])
        self._constants = constants  # the previous set goes once no call holds it

    def __call__(self, args: list) -> tuple:
        n = len(self._input_plan)
        if len(args) != n:
            raise InputMismatchError(f"expected {n} inputs, got {len(args)}")
        free = self._free_buffers
        buffers = free.pop() if free else _CallBuffers(n, len(self.output_kinds))
        try:
            return self._run_with(buffers, args)
        finally:
            free.append(buffers)

    def _run_with(self, buffers: _CallBuffers, args: list) -> tuple:
        fields = buffers.fields
        if self._all_tensors and buffers.tensor_kinds_packed and len(args) >= _BATCH_MIN:
            # every input a tensor (a compiled optimizer step passes 740, a decode step 103), and
            # the input array already says so: the handles go straight into it
            reader = _capsule_reader()
            try:
                capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(args) if reader is not None else None
            except TypeError:  # an input is not a tensor: the checks below name it
                capsules = None
            if capsules is not None:
                args.clear()
                reader(id(capsules), len(capsules), ctypes.addressof(buffers.inputs) + _HANDLE_OFFSET, _VALUE_SIZE)
                return self._call_library(buffers, packed=True)
        if self._all_tensors and all(isinstance(value, torch.Tensor) for value in args):
            handles = _to_handles(args)
            args.clear()
            fields[0::_FIELDS] = self._tensor_kinds
            fields[4::_FIELDS] = handles  # taken over by wg_run
            buffers.tensor_kinds_packed = True  # packed below: later calls write the handles alone
            return self._call_library(buffers)
        buffers.tensor_kinds_packed = False
        tensors = []
        for position, kind, name in self._input_plan:
            value = args[position]
            at = _FIELDS * position
            if kind == _TENSOR_KIND:
                if not isinstance(value, torch.Tensor):
                    raise InputMismatchError(f"input {name}: expected a tensor, got {type(value).__name__}")
                tensors.append(value)
            elif kind == _FLOAT_KIND:
                if not isinstance(value, (int, float)):
                    raise InputMismatchError(f"input {name}: expected a number, got {type(value).__name__}")
                fields[at], fields[at + 2], fields[at + 3], fields[at + 4] = _FLOAT_KIND, 0, float(value), 0
            else:
                if not isinstance(value, int):
                    raise InputMismatchError(f"input {name}: expected an int, got {type(value).__name__}")
                fields[at], fields[at + 2], fields[at + 3], fields[at + 4] = _INT_KIND, int(value), 0.0, 0
        args.clear()  # boxed convention: the caller's list no longer keeps inputs alive
        handles = _to_handles(tensors) if tensors else []
        # ... nor does this frame: wg_run frees each input at its last use (a backward graph's
        # saved activations), which it cannot while a Python reference here still holds it
        tensors.clear()
        value = None
        for position, handle in zip(self._tensor_positions, handles):
            at = _FIELDS * position
            fields[at], fields[at + 2], fields[at + 3], fields[at + 4] = _TENSOR_KIND, 0, 0.0, handle  # taken over by wg_run
        return self._call_library(buffers)

    def _call_library(self, buffers: _CallBuffers, packed: bool = False) -> tuple:
        fields = buffers.fields
        if fields and not packed:
            self._pack_inputs.pack_into(buffers.inputs, 0, *fields)
        m = len(self.output_kinds)
        constants = self._constants  # one consistent set for this call, alive until it returns
        status = self._run(constants.array, constants.count, *buffers.arguments)
        if status != 0:
            raise_error(status, buffers.message.value.decode(errors="replace"))
        return self._outputs(self._unpack_outputs.unpack_from(buffers.outputs), m)

    @staticmethod
    def _outputs(fields: tuple, m: int) -> tuple:
        """The outputs from the output array's fields (`_VALUE_FORMAT` per value)."""
        handles = [fields[_FIELDS * i + 4] for i in range(m) if fields[_FIELDS * i] == _TENSOR_KIND]
        tensors = iter(_from_handles(handles)) if handles else iter(())
        result = []
        for i in range(m):
            kind = fields[_FIELDS * i]
            if kind == _TENSOR_KIND:
                result.append(next(tensors))
            elif kind == _INT_KIND:
                result.append(fields[_FIELDS * i + 2])
            elif kind == _FLOAT_KIND:
                result.append(fields[_FIELDS * i + 3])
            elif kind == _BOOL_KIND:
                result.append(bool(fields[_FIELDS * i + 2]))
            else:
                result.append(None)
        return tuple(result)
