"""CppEmitter: a Wrapper IR program as a C++ shared library that talks to tensors only through
torch's ABI-stable C shim, rendered through `templates/cpp_wrapper.cpp.j2`.

One method per line type (see `Emitter`); each appends C++ statements to the body of
`run_program`. Tensor names become `wrapgen::Tensor t_<name>` (RAII: `Free` resets the
handle), size symbols `int64_t` locals. The library exports the C ABI of
`cpp_runtime/include/wrapgen/abi.h`; `compile` builds it with the program's C++ kernels
(cached by content hash) and loads it in-process (`loader.CppModel`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import jinja2
import sympy
import torch

from wrapgen.backends.cpp.body_split import split_into_pieces
from wrapgen.backends.cpp.call_code import CallCode
from wrapgen.backends.cpp.collectives import CollectiveWriter
from wrapgen.backends.cpp.cuda_graphs import CppGraphRegions
from wrapgen.backends.cpp.exprs import (
    UnprintableExpr,
    cpp_double_expr,
    cpp_expr,
    cpp_float,
    cpp_int,
    cpp_int_list,
    cpp_string,
    device_index,
    device_type_code,
    dtype_code,
)
from wrapgen.backends.cpp.extern import CannotExpress, ExternWriter
from wrapgen.backends.cpp.layouts import EnsureStridesMixin
from wrapgen.backends.cpp.multi_kernel import CppMultiKernelMixin
from wrapgen.backends.devices import device_overrides, kernel_device, returns_status
from wrapgen.backends.emitter import CompiledArtifact, Emitter
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.collectives import CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
    AllocateFromPool,
    AssertFinite,
    AssertInput,
    AssertScalar,
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
from wrapgen.wrapper_ir.multi_kernel import calls_of
from wrapgen.wrapper_ir.program import Program, ScalarInput, TensorInput
from wrapgen.wrapper_ir.values import TensorRef, TensorType, dtype_name, format_shape

# Shim functions every model uses (the runtime header's Tensor, checks and error reporting).
BASE_SHIMS = frozenset(
    {
        "aoti_torch_new_tensor_handle",
        "aoti_torch_delete_tensor_object",
        "aoti_torch_get_dim",
        "aoti_torch_get_size",
        "aoti_torch_get_stride",
        "aoti_torch_get_dtype",
        "aoti_torch_get_device_type",
        "aoti_torch_get_device_index",
    }
)


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("wrapgen.backends.cpp", "templates"),
        autoescape=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("cpp_wrapper.cpp.j2")


# Library builds run here (start_build): a build mostly waits (for Triton's workers, for g++),
# so the compile that started it goes on meanwhile.
_BUILDS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="wrapgen-build")


class CppEmitter(CppGraphRegions, EnsureStridesMixin, CppMultiKernelMixin, Emitter):
    """Emits the C++ source of one program; `compile` builds and loads it."""

    name = "cpp"
    # The array-ref entry's parts (arrayref.ArrayRefEmitter.arrayref_parts), rendered beside wg_run when set.
    arrayref: dict | None = None

    # -- writing ------------------------------------------------------------------------------
    def writeline(self, text: str) -> None:
        self.body.append(text)

    def refuse(self, line: WrapperLine, why: str) -> UnsupportedLineError:
        return UnsupportedLineError(f"{type(self).__name__} cannot emit line {self.line_number} ({line.format()}): {why}")

    def expr(self, line: WrapperLine, value: object) -> str:
        try:
            return cpp_expr(value)
        except UnprintableExpr as e:
            raise self.refuse(line, str(e)) from None

    def ints(self, line: WrapperLine, values: tuple) -> str:
        try:
            return cpp_int_list(values)
        except UnprintableExpr as e:
            raise self.refuse(line, str(e)) from None

    def use_shim(self, *names: str) -> None:
        self.shims.update(names)

    # -- program ------------------------------------------------------------------------------
    def begin(self, program: Program) -> None:
        self.body: list[str] = []
        self.shims: set[str] = set(BASE_SHIMS) | (self.arrayref["shims"] if self.arrayref else set())
        self.kernels: list[KernelDefinition] = []  # C++ kernels: built into the model library
        self.gpu_kernels: list[KernelDefinition] = []  # Triton kernels: binaries embedded, launched through the driver
        self.kernel_params: dict[str, str] = {}
        self.launch_prologues: set[str] = set()
        self.pool_views: dict[tuple[str, torch.dtype], str] = {}
        self.types = program.value_types()
        self.declared: set[str] = set()
        self.scalar_inputs = {i.name for i in program.inputs if isinstance(i, ScalarInput)}
        devices = {i.type.device for i in program.inputs if isinstance(i, TensorInput)}
        self.device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")
        self.devices_used: set[str] = {self.device.type}
        self.externs = ExternWriter(self.types, self.device)
        self.collectives = CollectiveWriter(self.externs)
        self.headers: set[str] = set()  # shim headers beyond the runtime's
        for text in device_overrides(self.device).cpp_run_prologue(self.device.index):
            self.writeline(text)
        for number, spec in enumerate(program.inputs):
            if isinstance(spec, TensorInput):
                self.writeline(f"wrapgen::Tensor t_{spec.name} = std::move(tensor_inputs[{number}]);")
                self.writeline(f"if (!t_{spec.name}.defined()) {{")
                self.writeline(
                    f'  throw wrapgen::Error(WG_INPUT_MISMATCH, "input {spec.name}: expected a tensor");'
                )
                self.writeline("}")
            else:
                ctype, field = ("double", "f") if spec.kind is float else ("int64_t", "i")
                self.writeline(f"const {ctype} in_{spec.name} = inputs[{number}].{field};")
            self.declared.add(spec.name)
        for number, constant in enumerate(program.constants):
            self.writeline(f"wrapgen::Tensor t_{constant.name} = wrapgen::Tensor::borrow(constants[{number}]);")
            self.declared.add(constant.name)

    def finish(self, program: Program) -> str:
        return _template().render(
            program_name=program.name,
            emitter=type(self).__name__,
            kernels=[{"name": k.name, "params": self.kernel_params.get(k.name, ""),
                      "returns": "int64_t" if returns_status(k) else "void"} for k in self.kernels],
            gpu_kernels=[{"name": k.name, "unaligned": bool(dict(k.metadata).get("unaligned"))} for k in self.gpu_kernels],
            metadata=json.dumps(self.metadata(program), sort_keys=True),
            num_inputs=len(program.inputs),
            num_outputs=len(program.outputs),
            num_constants=len(program.constants),
            constant_names=[cpp_string(c.name) for c in program.constants],
            constant_devices=[(device_type_code(c.type.device), device_index(c.type.device)) for c in program.constants],
            body=split_into_pieces(self.body),
            headers=sorted(self.headers),
            arrayref=self.arrayref,
        )

    def metadata(self, program: Program) -> dict:
        """What a loader needs to call the library without the Program: input/output/constant specs
        and the shim functions the code calls."""

        def tensor_spec(t: TensorType) -> dict:
            return {
                "dtype": str(t.dtype).removeprefix("torch."),
                "device": str(t.device),
                "sizes": [str(s) for s in t.sizes],
                "strides": None if t.strides is None else [str(s) for s in t.strides],
            }

        inputs = []
        for spec in program.inputs:
            if isinstance(spec, TensorInput):
                inputs.append({"name": spec.name, "kind": "tensor", **tensor_spec(spec.type)})
            else:
                inputs.append({"name": spec.name, "kind": spec.kind.__name__})
        outputs = []
        for value in program.outputs:
            if isinstance(value, TensorRef):
                outputs.append({"kind": "tensor"})
            elif isinstance(value, bool):
                outputs.append({"kind": "bool"})
            elif isinstance(value, float):
                outputs.append({"kind": "float"})
            elif value is None:
                outputs.append({"kind": "none"})
            else:
                outputs.append({"kind": "int"})
        forwarded = {"wrapgen_ops": sorted(self.collectives.forwarded)} if self.collectives.forwarded else {}
        if self.arrayref:  # the array-ref entry's outputs: the caller allocates them
            forwarded["arrayref_outputs"] = [{"dtype": o["torch_dtype"], "sizes": o["sizes"]} for o in self.arrayref["outputs"]]
        return {
            **forwarded,  # ops wrapgen defines (backends/cpp/collectives.py), registered by the loader
            "program": program.name,
            "inputs": inputs,
            "outputs": outputs,
            "constants": [{"name": c.name, "origin": c.origin, **({"permutation": list(c.permutation)} if c.permutation else {}),
                           **tensor_spec(c.type)} for c in program.constants],
            "symbols": [{"name": str(s.symbol), "hint": s.hint} for s in program.symbols],
            "shims": sorted(self.shims),
            "torch_version": torch.__version__.split("+")[0],
        }

    def build(self, program: Program) -> tuple[str, str]:
        """Emit `program` and build its library (kernels included): (wrapper source, library path)."""
        return self.start_build(program)()

    def start_build(self, program: Program, lazy_unaligned: bool = False) -> Callable[[], tuple[str, str]]:
        """Emit `program` and start building its library in the background (its GPU kernels'
        table waits for Triton; g++ runs beside); the returned step waits for the build.
        `lazy_unaligned`: the GPU kernels' variants for unaligned pointers compile on first use
        (gpu_kernels.kernel_table_source), for a library loaded in this process."""
        from wrapgen.backends.cpp.build import build_model

        source = self.emit(program)
        compile_flags: list[str] = []
        link_flags: list[str] = []
        for device_type in sorted(self.devices_used):
            more_compile, more_link = device_overrides(device_type).cpp_build_flags()
            compile_flags += [f for f in more_compile if f not in compile_flags]
            link_flags += [f for f in more_link if f not in link_flags]
        if self.gpu_kernels:
            from wrapgen.backends.cpp.build import start_wrapper_compile

            start_wrapper_compile(source, tuple(compile_flags))  # g++ runs while Triton compiles the kernels
        gpu_kernels, kernel_sources = list(self.gpu_kernels), [k.source for k in self.kernels]

        def build_library() -> str:
            extra_sources = []
            if gpu_kernels:
                from wrapgen.backends.cpp.gpu_kernels import kernel_table_source

                extra_sources.append(kernel_table_source(gpu_kernels, lazy_unaligned=lazy_unaligned))
            return str(build_model(source, kernel_sources, extra_sources=extra_sources,
                                   compile_flags=tuple(compile_flags), link_flags=tuple(link_flags)))

        library = _BUILDS.submit(build_library)
        return lambda: (source, library.result())

    def start_compile(self, program: Program) -> Callable[[], CompiledArtifact]:
        """The library builds in the background; the step waits for it and loads it."""
        from wrapgen.backends.cpp.loader import CppModel

        built = self.start_build(program, lazy_unaligned=True)
        gpu_kernels = list(self.gpu_kernels)

        def load() -> CompiledArtifact:
            source, library = built()
            model = CppModel(library)
            if gpu_kernels:
                model.attach_kernel_compiler(gpu_kernels)
            model.set_constants([program.constant_values().get(c.name) for c in program.constants])
            return CompiledArtifact(model, source, library)

        return load

    # -- lines --------------------------------------------------------------------------------
    def emit_bind_symbol(self, line: BindSymbol) -> None:
        observed = {
            "value": f"in_{line.source}",
            "item": f"t_{line.source}.item_int64()",
            "offset": f"t_{line.source}.storage_offset()",
        }.get(line.kind, f"t_{line.source}.{line.kind}({line.dim})")
        sym = str(line.symbol)
        if not line.symbol.is_integer:
            if line.kind != "item" or line.expr != OBSERVED:
                raise self.refuse(line, "a float symbol is only bound from a tensor element (item)")
            self.writeline(f"const double {sym} = t_{line.source}.item_double();")
            return
        expr = sympy.sympify(line.expr)
        if expr == OBSERVED:
            value = observed
        else:
            num, den = sympy.fraction(sympy.together(expr.xreplace({OBSERVED: sympy.Symbol("wg_observed", integer=True)})))
            num_text = self.expr(line, num).replace("wg_observed", f"({observed})")
            if den == 1:
                value = num_text
            else:
                value = f"wrapgen::exact_div({num_text}, {self.expr(line, den)}, {cpp_string(sym)}, {cpp_string(line.observed_text())})"
        self.writeline(f"const int64_t {sym} = {value};")
        low, high = line.checked_bounds()
        conditions = ([f"{sym} < {cpp_int(low)}"] if low is not None else []) + ([f"{sym} > {cpp_int(high)}"] if high is not None else [])
        if conditions:
            bounds = ", ".join(
                [cpp_int(line.min or 0), cpp_int(line.max or 0), "true" if line.min is not None else "false", "true" if line.max is not None else "false"]
            )
            self.writeline(f"if ({' || '.join(conditions)}) wrapgen::symbol_out_of_range({cpp_string(sym)}, {sym}, {bounds});")

    def emit_assert_input(self, line: AssertInput) -> None:
        strides = tuple(0 if s is None else s for s in line.strides)
        checked = ", ".join("false" if s is None else "true" for s in line.strides)
        self.use_shim(dtype_code(line.dtype).removesuffix("()"))
        if line.device is None:  # -1: any device
            device_type, index = "-1", -1
        else:
            self.use_shim(device_type_code(line.device).removesuffix("()"))
            device_type, index = device_type_code(line.device), device_index(line.device)
        self.writeline(
            f"wrapgen::check_input({cpp_string(line.name)}, t_{line.name}, {dtype_code(line.dtype)}, "
            f"{device_type}, {index}, {self.ints(line, line.sizes)}, "
            f"{self.ints(line, strides)}, {{{checked}}});"
        )

    def emit_assert_scalar(self, line: AssertScalar) -> None:
        expected = line.expected
        literal = ("true" if expected else "false") if isinstance(expected, bool) else (
            cpp_float(expected) if isinstance(expected, float) else cpp_int(int(expected))
        )
        self.writeline(
            f"if (in_{line.name} != {literal}) throw wrapgen::Error(WG_INPUT_MISMATCH, "
            f"{cpp_string(f'input {line.name}: the program was compiled for the value {expected!r}, got ')} + "
            f"std::to_string(in_{line.name}));"
        )

    def _declare(self, name: str, init: str) -> None:
        if name in self.declared:
            self.writeline(f"t_{name} = {init};")
        else:
            self.declared.add(name)
            self.writeline(f"wrapgen::Tensor t_{name} = {init};")

    def emit_allocate(self, line: Allocate) -> None:
        t = line.type
        self.use_shim("aoti_torch_empty_strided", dtype_code(t.dtype).removesuffix("()"), device_type_code(t.device).removesuffix("()"))
        self._declare(
            line.name,
            f"wrapgen::empty_strided({self.ints(line, t.sizes)}, {self.ints(line, t.strides)}, {dtype_code(t.dtype)}, "
            f"{device_type_code(t.device)}, {device_index(t.device)})",
        )
        if device_overrides(t.device).advises_huge_pages(t):
            self.use_shim("aoti_torch_get_data_ptr", "aoti_torch_get_storage_size")
            self.writeline(f"wrapgen::advise_huge_pages(t_{line.name});")

    def emit_reuse_buffer(self, line: ReuseBuffer) -> None:
        t, source = line.type, self.types.get(line.source)
        if isinstance(source, TensorType) and (source.dtype, source.sizes, source.strides) == (t.dtype, t.sizes, t.strides):
            self._declare(line.name, f"t_{line.source}.share()  /* reuse */")
            return
        viewed = f"t_{line.source}.share()"
        if not (isinstance(source, TensorType) and source.dtype == t.dtype):
            self.use_shim(dtype_code(t.dtype).removesuffix("()"))
            viewed = f"wrapgen::view_dtype(t_{line.source}, {dtype_code(t.dtype)})"
        self.use_shim("aoti_torch__reinterpret_tensor", "aoti_torch_get_storage_offset")
        tmp = f"reuse_{line.name}"
        self.writeline(f"wrapgen::Tensor {tmp} = {viewed};")
        self._declare(
            line.name,
            f"wrapgen::reinterpret({tmp}, {self.ints(line, t.sizes)}, {self.ints(line, t.strides)}, "
            f"-wrapgen::storage_offset({tmp}))  /* reuse at offset 0 */",
        )
        self.writeline(f"{tmp}.reset();")

    def emit_allocate_from_pool(self, line: AllocateFromPool) -> None:
        t = line.type
        key = (line.pool, t.dtype)
        if key not in self.pool_views:
            view = f"pool_{line.pool}_{dtype_name(t.dtype)}"
            self.pool_views[key] = view
            self.use_shim(dtype_code(t.dtype).removesuffix("()"))
            self.writeline(f"wrapgen::Tensor {view} = wrapgen::view_dtype(t_{line.pool}, {dtype_code(t.dtype)});")
        offset = sympy.simplify(sympy.sympify(line.offset) / t.dtype.itemsize)
        self.use_shim("aoti_torch__reinterpret_tensor")
        self._declare(
            line.name,
            f"wrapgen::reinterpret({self.pool_views[key]}, {self.ints(line, t.sizes)}, {self.ints(line, t.strides)}, "
            f"{self.expr(line, offset)})",
        )

    def emit_free(self, line: Free) -> None:
        if line.name in self.scalar_inputs:
            self.writeline(f"// free {line.name}: a number, nothing to release")
            return
        self.writeline(f"t_{line.name}.reset();" if self._is_tensor_name(line.name) else f"t_{line.name} = wrapgen::Value();")
        for (pool, _), view in self.pool_views.items():
            if pool == line.name:
                self.writeline(f"{view}.reset();")

    def _is_tensor_name(self, name: str) -> bool:
        return name not in self.value_names

    @functools.cached_property
    def value_names(self) -> set[str]:
        """Names holding a tuple/list result (wrapgen::Value) rather than one tensor."""
        return {
            line.name
            for line in self.program.lines
            if isinstance(line, ExternKernel) and line.name is not None and not self.externs.result_is_tensor(line)
        }

    def emit_reinterpret(self, line: Reinterpret) -> None:
        self.use_shim("aoti_torch__reinterpret_tensor")
        self._declare(
            line.name,
            f"wrapgen::reinterpret(t_{line.source}, {self.ints(line, line.sizes)}, {self.ints(line, line.strides)}, "
            f"{self.expr(line, line.offset)})",
        )

    def emit_extern_kernel(self, line: ExternKernel) -> None:
        try:
            code = self.externs.write(line)
        except (CannotExpress, UnprintableExpr) as e:
            raise self.refuse(line, str(e)) from None
        self.use_shim(*code.shims)
        result = self.types.get(line.name) if line.name is not None else None
        if isinstance(result, TensorType):  # a factory op can place a result on a device no input is on
            self.devices_used.add(result.device.type)
        if line.name is not None and line.name not in self.declared:  # declared: a graph region's output
            kind = "wrapgen::Tensor" if self._is_tensor_name(line.name) else "wrapgen::Value"
            self.writeline(f"{kind} t_{line.name};")
            self.declared.add(line.name)
        self.writeline("{")
        for text in code.lines:
            self.writeline(f"  {text}")
        self.writeline("}")

    def emit_collective_start(self, line: CollectiveStart) -> None:
        try:
            code = self.collectives.start(line)
        except (CannotExpress, UnprintableExpr) as e:
            raise self.refuse(line, str(e)) from None
        self.writeline(f"wrapgen::Tensor t_{line.name};")
        self.declared.add(line.name)
        self._write_call(code)

    def emit_collective_wait(self, line: CollectiveWait) -> None:
        type_ = self.types.get(line.name)
        device = type_.device.type if isinstance(type_, TensorType) else self.device.type
        try:
            code = self.collectives.wait(line, device)
        except (CannotExpress, UnprintableExpr) as e:
            raise self.refuse(line, str(e)) from None
        self._write_call(code)

    def _write_call(self, code: CallCode) -> None:
        """A call's lines in a block of their own; shim functions from `c/shim_<device>.h` get that header."""
        self.use_shim(*code.shims)
        for shim in code.shims:
            match = re.match(r"aoti_torch_(\w+?)__c10d_functional_", shim)
            if match:
                self.headers.add(f"torch/csrc/inductor/aoti_torch/c/shim_{match.group(1)}.h")
        self.writeline("{")
        for text in code.lines:
            self.writeline(f"  {text}")
        self.writeline("}")

    def emit_multi_output(self, line: MultiOutput) -> None:
        path = ", ".join(str(i) for i in line.index)
        self._declare(line.name, f"t_{line.source}.at({{{path}}}).tensor.share()")

    def emit_kernel_definition(self, line: KernelDefinition) -> None:
        device = kernel_device(line)
        if line.language not in device_overrides(device).cpp_kernel_languages():
            raise self.refuse(line, f"no C++ launcher for {line.language} kernels on {device}")
        self.devices_used.add(torch.device(device).type)
        if line.language != "cpp":
            self.gpu_kernels.append(line)
            return
        self.kernels.append(line)
        calls = [c for c in calls_of(self.program) if c.kernel == line.name]  # MultiKernelCall candidates too
        if calls:
            self.kernel_params[line.name] = ", ".join("void*" if isinstance(a, TensorRef) else "int64_t" for a in calls[0].args)

    def emit_kernel_call(self, line: KernelCall) -> None:
        definition = next((k for k in self.kernels + self.gpu_kernels if k.name == line.kernel), None)
        if definition is None:
            raise self.refuse(line, f"kernel {line.kernel} is not defined")
        device = torch.device(kernel_device(definition))
        overrides = device_overrides(device)
        if str(device) not in self.launch_prologues:
            self.launch_prologues.add(str(device))
            for text in overrides.cpp_launch_prologue(device.index):
                self.writeline(text)
        self.use_shim("aoti_torch_get_data_ptr")
        declared = dict(definition.metadata).get("arg_types", ())
        args = []
        for i, a in enumerate(line.args):
            if isinstance(a, TensorRef):
                args.append((f"t_{a.name}.data_ptr()", "ptr"))
            elif isinstance(a, (int, sympy.Basic)) and not isinstance(a, bool):
                kind = declared[i] if i < len(declared) and declared[i] in ("int32", "int64") else "int64"
                args.append((self.expr(line, a), kind))
            else:
                raise self.refuse(line, f"kernel argument {a!r} is neither a tensor nor an integer")
        grid = [self.expr(line, g) for g in line.grid]
        for text in overrides.cpp_kernel_launch(definition, args, grid):
            self.writeline(text)

    def emit_symbolic_call_arg(self, line: SymbolicCallArg) -> None:
        self.writeline(f"const int64_t {line.symbol} = {self.expr(line, line.expr)};")

    def emit_assert_finite(self, line: AssertFinite) -> None:
        self.use_shim("aoti_torch_call_dispatcher", "aoti_torch_item_bool")
        self.writeline(f"wrapgen::assert_finite({cpp_string(line.name)}, t_{line.name});")

    def emit_comment(self, line: Comment) -> None:
        self.writeline("// " + line.text.replace("\\", "/"))  # a trailing backslash would continue the comment

    def emit_output(self, line: Output) -> None:
        for i, value in enumerate(line.values):
            if isinstance(value, TensorRef):
                self.writeline(f"tensor_outputs[{i}] = t_{value.name}.share();")
                self.writeline(f"wrapgen::set_none(outputs[{i}]); outputs[{i}].kind = WG_TENSOR;")
            elif isinstance(value, bool):
                self.writeline(f"wrapgen::set_bool(outputs[{i}], {'true' if value else 'false'});")
            elif isinstance(value, float):
                self.writeline(f"wrapgen::set_float(outputs[{i}], {cpp_float(value)});")
            elif value is None:
                self.writeline(f"wrapgen::set_none(outputs[{i}]);")
            elif isinstance(value, sympy.Basic) and not value.is_integer:
                self.writeline(f"wrapgen::set_float(outputs[{i}], {cpp_double_expr(value)});")
            elif isinstance(value, (int, sympy.Basic)):
                self.writeline(f"wrapgen::set_int(outputs[{i}], {self.expr(line, value)});")
            else:
                raise self.refuse(line, f"output {value!r} ({type(value).__name__}) has no C++ form")
        self.writeline("return;")


__all__ = ["CppEmitter", "format_shape"]
