"""ArrayRefEmitter: the body of a CPU package's second entry, `wg_run_arrayref`, where inputs and
outputs are plain descriptors (`cpp_runtime/include/wrapgen/arrayref.h`).

Every tensor is a `char*`: inputs point at the caller's arrays, temporaries at fixed offsets of
one arena laid out here at compile time (the memory planner's reuse lines alias their source),
outputs at the caller's memory where a buffer is written in place, else they are copied there at
the end. Generated kernels take those pointers directly; a library call gets non-owning tensors
made just around it. What the interface cannot serve (dynamic sizes, a device other than the
CPU, scalar inputs or outputs, non-contiguous outputs) is refused naming the line.
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.backends.cpp.emitter import CppEmitter
from wrapgen.backends.cpp.exprs import UnprintableExpr, cpp_int_list, dtype_code
from wrapgen.backends.cpp.extern import CannotExpress
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.layout import EnsureStrides
from wrapgen.wrapper_ir.lines import (
    Allocate,
    AllocateFromPool,
    AssertInput,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelCall,
    KernelDefinition,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program, TensorInput
from wrapgen.wrapper_ir.values import TensorRef, TensorType, contiguous_strides

ALIGN = 64
# Arenas up to this size live on the stack of the calling thread; larger ones in a per-thread buffer.
STACK_ARENA_BYTES = 64 * 1024
_SUPPORTED = (Allocate, AllocateFromPool, AssertInput, BindSymbol, Comment, EnsureStrides, ExternKernel, Free, KernelCall,
              KernelDefinition, MultiOutput, Output, Reinterpret, ReuseBuffer, SymbolicCallArg)


class ArrayRefRefused(UnsupportedLineError):
    """The program cannot be served through the array-ref entry (the message names the line)."""


def _static(values: tuple) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in values)
    except TypeError:
        return None


def _output_roots(program: Program, output_slots: dict[str, int]) -> dict[str, tuple[int, str]]:
    """Buffers an output is a view of from their first byte (through reinterpret lines at offset 0):
    buffer -> (the output's slot, the output's name). Whether the view covers the whole buffer in
    the same contiguous layout is checked where the buffer is allocated."""
    views = {line.name: line for line in program.lines if isinstance(line, Reinterpret)}
    roots: dict[str, tuple[int, str]] = {}
    for name, slot in output_slots.items():
        current, seen = name, {name}
        while current in views and _static((views[current].offset,)) == (0,) and views[current].source not in seen:
            current = views[current].source
            seen.add(current)
        if current != name and current not in output_slots:
            roots.setdefault(current, (slot, name))
    return roots


class ArrayRefEmitter(CppEmitter):
    """Emits `run_arrayref`'s body; `arrayref_parts` returns it with the tables the entry checks against."""

    name = "cpp-arrayref"

    def refuse(self, line: WrapperLine, why: str) -> ArrayRefRefused:
        return ArrayRefRefused(f"arrayref=True cannot serve line {self.line_number} ({line.format()}): {why}")

    def dispatch(self, line: WrapperLine) -> None:
        if not isinstance(line, _SUPPORTED):
            raise self.refuse(line, f"no array-ref form for {type(line).__name__}")
        super().dispatch(line)

    def begin(self, program: Program) -> None:
        super().begin(program)
        self.body = []  # the handle prologue is not ours
        self.declared = set()
        self.line_number = 0
        for spec in program.inputs:
            if not isinstance(spec, TensorInput):
                raise ArrayRefRefused(f"arrayref=True cannot serve input {spec.name}: a {spec.kind.__name__}, not a tensor")
        for c in program.constants:
            if c.type.device.type != "cpu":
                raise ArrayRefRefused(f"arrayref=True cannot serve constant {c.name}: on {c.type.device}, not the CPU")
        self.pointers: dict[str, str] = {}  # tensor name -> C expression of its first byte
        self.tensors: set[str] = set()  # names held as wrapgen::Tensor (library results)
        # A library result's memory is its tensor's: it is released once neither it nor any view
        # of it (a pointer into it) is live. name -> the library result it points into, and
        # result -> its live names.
        self.owner: dict[str, str] = {}
        self.live: dict[str, set[str]] = {}
        self.arena = 0
        self.output_slots = {v.name: i for i, v in enumerate(program.outputs) if isinstance(v, TensorRef)}
        self.output_roots = _output_roots(program, self.output_slots)
        self.in_place_outputs: set[int] = set()
        for number, spec in enumerate(program.inputs):
            self._pointer(spec.name, f"static_cast<char*>(inputs[{number}].data)")
        self.constant_numbers = {c.name: number for number, c in enumerate(program.constants)}
        for number, c in enumerate(program.constants):
            self._pointer(c.name, f"constant_data[{number}]")  # bound once (wg_arrayref_bind) or per call

    def _pointer(self, name: str, expr: str, source: str | None = None) -> None:
        self.writeline(f"char* p_{name} = {expr};")
        self.pointers[name] = f"p_{name}"
        root = name if name in self.tensors else self.owner.get(source) if source is not None else None
        if root is not None:
            self.owner[name] = root
            self.live.setdefault(root, set()).add(name)

    def _type(self, line: WrapperLine, name: str) -> tuple[TensorType, tuple[int, ...], tuple[int, ...]]:
        t = self.types.get(name)
        if not isinstance(t, TensorType):
            raise self.refuse(line, f"{name} is not a tensor")
        if t.device.type != "cpu":
            raise self.refuse(line, f"{name} is on {t.device}, not the CPU")
        sizes = _static(t.sizes)
        strides = _static(t.strides if t.strides is not None else contiguous_strides(t.sizes))
        if sizes is None or strides is None:
            raise self.refuse(line, f"{name} has dynamic sizes {t.sizes}")
        return t, sizes, strides

    def _nbytes(self, line: WrapperLine, name: str) -> int:
        t, sizes, strides = self._type(line, name)
        if any(s == 0 for s in sizes):
            return 0
        return (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * t.dtype.itemsize

    # -- lines --------------------------------------------------------------------------------
    def emit_bind_symbol(self, line: BindSymbol) -> None:
        raise self.refuse(line, "dynamic sizes: the array-ref entry serves programs of static shapes only")

    def emit_assert_input(self, line: AssertInput) -> None:
        if line.device is not None and torch.device(line.device).type != "cpu":
            raise self.refuse(line, f"input on {line.device}: the array-ref entry is for the CPU")
        self.writeline(f"// {line.name}: checked against its descriptor by the entry")

    def emit_kernel_definition(self, line: KernelDefinition) -> None:
        if line.language != "cpp":
            raise self.refuse(line, f"a {line.language} kernel: the array-ref entry is for the CPU")
        super().emit_kernel_definition(line)

    def emit_allocate(self, line: Allocate) -> None:
        _, sizes, strides = self._type(line, line.name)
        slot = self.output_slots.get(line.name)
        if slot is None and line.name in self.output_roots:
            # the output is a view of this whole buffer, byte for byte (a [1024, 4096] product
            # viewed as the [8, 128, 4096] logits): the buffer can be the caller's memory as well
            slot, view = self.output_roots[line.name]
            if self._nbytes(line, line.name) != self._nbytes(line, view):
                slot = None
        if slot is not None and strides == tuple(contiguous_strides(sizes)) and slot not in self.in_place_outputs:
            self.in_place_outputs.add(slot)  # the kernel writes the caller's memory directly
            self._pointer(line.name, f"static_cast<char*>(outputs[{slot}].data)")
            return
        offset = self.arena
        self.arena += -(-self._nbytes(line, line.name) // ALIGN) * ALIGN
        self._pointer(line.name, f"arena + {offset}")

    def emit_reuse_buffer(self, line: ReuseBuffer) -> None:
        self._type(line, line.name)
        self._pointer(line.name, self.pointers[line.source], line.source)

    def emit_allocate_from_pool(self, line: AllocateFromPool) -> None:
        self._type(line, line.name)
        offset = _static((line.offset,))
        if offset is None:
            raise self.refuse(line, "a pool offset that is not a constant")
        self._pointer(line.name, f"{self.pointers[line.pool]} + {offset[0]}", line.pool)

    def emit_reinterpret(self, line: Reinterpret) -> None:
        t, _, _ = self._type(line, line.name)
        offset = _static((line.offset,))
        if offset is None:
            raise self.refuse(line, "a view offset that is not a constant")
        self._pointer(line.name, f"{self.pointers[line.source]} + {offset[0] * t.dtype.itemsize}", line.source)

    def emit_free(self, line: Free) -> None:
        if line.name in self.tensors and not self._is_tensor_name(line.name):
            self.writeline(f"t_{line.name} = wrapgen::Value();")  # a tuple result: its items hold their own references
            return
        root = self.owner.get(line.name)
        if root is None:
            return
        names = self.live[root]
        names.discard(line.name)
        if not names:
            self.writeline(f"t_{root}.reset();  // no view of it is left")

    def emit_kernel_call(self, line: KernelCall) -> None:
        definition = next((k for k in self.kernels if k.name == line.kernel), None)
        if definition is None:
            raise self.refuse(line, f"kernel {line.kernel} is not defined")
        args = []
        for a in line.args:
            if isinstance(a, TensorRef):
                args.append(f"static_cast<void*>({self.pointers[a.name]})")
            elif isinstance(a, (int, sympy.Basic)) and not isinstance(a, bool):
                args.append(self.expr(line, a))
            else:
                raise self.refuse(line, f"kernel argument {a!r} is neither a tensor nor an integer")
        from wrapgen.backends.devices import device_overrides

        for text in device_overrides(torch.device("cpu")).cpp_kernel_launch(definition, [(a, "") for a in args], []):
            self.writeline(text)

    def emit_extern_kernel(self, line: ExternKernel) -> None:
        try:
            code = self.externs.write(line)
        except (CannotExpress, UnprintableExpr) as e:
            raise self.refuse(line, str(e)) from None
        self.use_shim(*code.shims, "aoti_torch_create_tensor_from_blob")
        result = self.types.get(line.name) if line.name is not None else None
        if line.name is not None:
            kind = "wrapgen::Tensor" if isinstance(result, TensorType) else "wrapgen::Value"
            self.writeline(f"{kind} t_{line.name};")
            self.tensors.add(line.name)
        self.writeline("{")
        for name in dict.fromkeys((*line.uses(), *line.writes)):
            if name in self.tensors or name == line.name or name not in self.pointers:
                continue
            self.writeline(f"  wrapgen::Tensor t_{name} = {self._wrap(line, name)};")
        for text in code.lines:
            self.writeline(f"  {text}")
        self.writeline("}")
        if isinstance(result, TensorType):
            self._type(line, line.name)
            self._pointer(line.name, f"wrapgen::data_of(t_{line.name}.get())")

    def emit_ensure_strides(self, line: EnsureStrides) -> None:
        if line.name not in self.tensors:
            return  # a pointer of ours: laid out as the program says by construction
        super().emit_ensure_strides(line)  # a library's result: copied if its layout differs
        self.writeline(f"p_{line.name} = wrapgen::data_of(t_{line.name}.get());")

    def _wrap(self, line: WrapperLine, name: str) -> str:
        if name in self.constant_numbers:  # packaged in the program's layout: the caller's tensor itself
            return f"wrapgen::Tensor::borrow(constants[{self.constant_numbers[name]}])"
        t, sizes, strides = self._type(line, name)
        self.use_shim(dtype_code(t.dtype).removesuffix("()"))
        return f"wrapgen::wrap_array({self.pointers[name]}, {cpp_int_list(sizes)}, {cpp_int_list(strides)}, {dtype_code(t.dtype)})"

    def emit_multi_output(self, line: MultiOutput) -> None:
        path = ", ".join(str(i) for i in line.index)
        self.writeline(f"wrapgen::Tensor t_{line.name} = t_{line.source}.at({{{path}}}).tensor.share();")
        self.tensors.add(line.name)
        self._type(line, line.name)
        self._pointer(line.name, f"wrapgen::data_of(t_{line.name}.get())")

    def emit_output(self, line: Output) -> None:
        for i, value in enumerate(line.values):
            if not isinstance(value, TensorRef):
                raise self.refuse(line, f"output {i} is {value!r}, not a tensor")
            _, sizes, strides = self._type(line, value.name)
            if strides != tuple(contiguous_strides(sizes)) and 0 not in sizes:
                raise self.refuse(line, f"output {i} ({value.name}) is not contiguous: strides {strides}")
            if i in self.in_place_outputs and self.output_slots.get(value.name) == i:
                continue  # written in the caller's memory: the buffer itself, or a view at its start
            nbytes = self._nbytes(line, value.name)
            if nbytes:
                self.writeline(f"std::memcpy(outputs[{i}].data, {self.pointers[value.name]}, {nbytes});")
        self.writeline("return;")

    # -- the entry's tables ---------------------------------------------------------------------
    def arrayref_parts(self, program: Program) -> dict:
        """Emit `program`'s array-ref body; with the specs the entry checks descriptors against."""
        self.emit_lines(program)

        def spec(name: str, t: TensorType) -> dict:
            sizes = _static(t.sizes)
            return {"name": name, "dtype": dtype_code(t.dtype), "rank": len(t.sizes), "sizes": list(sizes or ()),
                    "torch_dtype": str(t.dtype).removeprefix("torch.")}

        def constant_spec(name: str, t: TensorType) -> dict:
            sizes = _static(t.sizes)
            strides = _static(t.strides if t.strides is not None else contiguous_strides(t.sizes))
            if sizes is None or strides is None:
                raise ArrayRefRefused(f"arrayref=True cannot serve constant {name}: dynamic sizes {t.sizes}")
            return {"name": name, "dtype": dtype_code(t.dtype), "rank": len(sizes), "sizes": list(sizes), "strides": list(strides)}

        outputs = [spec(f"{v.name}", self.types[v.name]) for v in program.outputs]
        return {
            "constants": [constant_spec(c.name, c.type) for c in program.constants],
            "body": list(self.body),
            "inputs": [spec(i.name, i.type) for i in program.inputs],
            "outputs": outputs,
            "arena_bytes": self.arena,
            "stack_arena": self.arena <= STACK_ARENA_BYTES,
            "kernels": list(self.kernels),
            "shims": set(self.shims),
        }

    def emit_lines(self, program: Program) -> None:
        self.program = program
        self._open_region = None  # CppGraphRegions' state: no graph regions here (refused)
        self.begin(program)
        for number, line in enumerate(program.lines, start=1):
            self.line_number = number
            self.dispatch(line)
