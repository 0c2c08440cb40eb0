"""PythonEmitter: a Wrapper IR program as a Python module defining `call(args)`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter

from wrapgen import config
from wrapgen.backends.devices import DeviceOverrides, device_overrides, kernel_device
from wrapgen.backends.emitter import CompiledArtifact, Emitter
from wrapgen.backends.python.cuda_graphs import PythonGraphRegions
from wrapgen.backends.python.multi_kernel import PythonMultiKernelMixin
from wrapgen.backends.python.runtime import BATCHED_INPUT_CHECKS
from wrapgen.backends.python.static_views import PythonStaticViews
from wrapgen.backends.sanitize import ProgramSanitizer
from wrapgen.cache import load_python_module, write_cached
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.collectives import WAIT_OP, CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.layout import EnsureStrides
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
from wrapgen.wrapper_ir.program import Program, TensorInput
from wrapgen.wrapper_ir.values import Arg, TensorRef, TensorType, dtype_name

_PRINTER = PythonPrinter()


def py_expr(expr: object) -> str:
    """Python source for an integer expression over local size-symbol variables."""
    if isinstance(expr, sympy.Basic):
        if isinstance(expr, sympy.Integer):
            return str(int(expr))
        return _PRINTER.doprint(expr)
    return repr(expr)


def py_tuple(items: tuple) -> str:
    inner = ", ".join(py_value(i) for i in items)
    return f"({inner},)" if len(items) == 1 else f"({inner})"


def py_value(value: Arg) -> str:
    """Python source for a call argument."""
    if isinstance(value, TensorRef):
        return value.name
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, sympy.Basic):
        return py_expr(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "INF" if value > 0 else "-INF"
        return "NAN" if math.isnan(value) else repr(value)
    if isinstance(value, (int, str, complex)):
        return repr(value)
    if isinstance(value, tuple):
        return py_tuple(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.layout, torch.memory_format)):
        return str(value)
    raise TypeError(f"cannot express argument {value!r} of type {type(value).__name__} in Python")


def _evaluate_at_hints(shape: tuple, hints: dict) -> tuple[int, ...]:
    return tuple(int(sympy.sympify(e).xreplace(hints)) for e in shape)


class PythonEmitter(PythonGraphRegions, PythonMultiKernelMixin, PythonStaticViews, Emitter):
    """Emits a module with `call(args)` and `benchmark_compiled_module()`."""

    name = "python"
    indent_unit = "    "
    # for the MultiKernelCall mixin (python/multi_kernel.py), which cannot import this module
    py_value = staticmethod(py_value)
    py_expr = staticmethod(py_expr)
    py_tuple = staticmethod(py_tuple)

    # -- writing ----------------------------------------------------------------------------
    def writeline(self, text: str) -> None:
        self.body.append(f"{self.indent_unit * self.depth}{text}" if text else "")

    @contextlib.contextmanager
    def indent(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def op_handle(self, qualified: str) -> str:
        """A module-level variable bound once to the operator, so calls skip the lookup."""
        if qualified not in self.ops:
            base = qualified.replace("::", "_").replace(".", "_")
            self.ops[qualified] = base if base not in self.ops.values() else f"{base}_{len(self.ops)}"
        return self.ops[qualified]

    def device_handle(self, device: torch.device) -> str:
        key = str(device)
        if key not in self.devices:
            self.devices[key] = f"_device{len(self.devices)}"
        return self.devices[key]

    # -- program ----------------------------------------------------------------------------
    def begin(self, program: Program) -> None:
        self.body: list[str] = []
        self.depth = 1
        self.ops: dict[str, str] = {}
        self.devices: dict[str, str] = {}
        self.kernels: list[KernelDefinition] = []
        self.kernel_signatures: dict[str, str] = {}
        self.call_prologues: set[str] = set()
        self.header_lines: list[str] = []  # module-level state the body's lines need
        self.pool_views: dict[tuple[str, torch.dtype], str] = {}
        self.bound_constants = set(program.constant_values())
        self.constant_views: dict[str, str] = {}  # name -> the view expression, made at load
        self.starts_storage: set[str] = set()  # buffers at storage offset 0 (Allocate, and reuses of them)
        self.types = program.value_types()
        self.begin_static_views(program)
        names = ", ".join(program.input_names())
        # A device type the program uses one device of gets its fast paths (its device made
        # current on entry, then allocations on the current device); several devices of one
        # type allocate naming the device.
        by_type: dict[str, set[torch.device]] = {}
        for t in self.types.values():
            if isinstance(t, TensorType):
                by_type.setdefault(t.device.type, set()).add(t.device)
        self.single_device_types = {kind for kind, found in by_type.items() if len(found) == 1}
        for kind in sorted(self.single_device_types):
            (device,) = by_type[kind]
            for text in device_overrides(device).python_call_entry(device.index):
                self.writeline(text)
        self.writeline(f"if len(args) != {len(program.inputs)}:")
        with self.indent():
            self.writeline(f"check_arg_count(args, {len(program.inputs)})")
        if program.inputs:
            self.writeline(f"{names}, = args")
            self.writeline("args.clear()  # boxed calling convention: inputs can be freed early")
        # config.sanitize at compile time: the sanitizer checks the lines that need it, before and
        # after each (backends/sanitize); without it the module has no trace of it.
        self.sanitizer = ProgramSanitizer(program) if config.sanitize else None
        if self.sanitizer is not None:
            self.writeline("_san = _sanitizer.start(locals())")
        self.batched_checks = self._batched_checks(program)
        self.batched_ids = {id(line) for line in self.batched_checks}

    def _batched_checks(self, program: Program) -> list[AssertInput]:
        """The input checks made in one C++ call (`runtime.input_guard`): all of them, when there
        are many, every size and stride is a number, and no sanitizer watches each line."""
        checks = [line for line in program.lines if isinstance(line, AssertInput)]
        static = all(v is None or isinstance(v, (int, sympy.Integer)) for c in checks for v in (*c.sizes, *c.strides))
        if len(checks) < BATCHED_INPUT_CHECKS or not static or self.sanitizer is not None:
            return []
        return checks

    def dispatch(self, line: WrapperLine) -> None:
        before, after = self.sanitizer.hooks(self.line_number) if self.sanitizer is not None else (False, False)
        if before:
            self.writeline(f"_san.before({self.line_number}, locals())")
        super().dispatch(line)
        if after:
            self.writeline(f"_san.after({self.line_number}, locals())")

    def finish(self, program: Program) -> str:
        header = [
            f"# wrapgen: program {program.name!r}, emitted by {type(self).__name__}",
            "import math  # size expressions can print as math.floor / math.ceil (PythonPrinter)",
            "import torch",
            "from wrapgen.backends.python.runtime import (",
            "    INF, NAN, advise_huge_pages, assert_finite, benchmark, check_arg_count, current_cuda_device,",
            "    empty_strided_cpu, empty_strided_cuda, example_tensor,",
            "    input_guard, input_mismatch, op_callable, reinterpret_tensor, scalar_mismatch, symbol_out_of_range,",
            ")",
            "",
            "from wrapgen.backends.runtime import with_strides as _with_strides",
            "_Tensor = torch.Tensor",
            "_as_strided = torch.as_strided  # absolute storage offset: a reused buffer starts at its storage's start",
            "_reinterpret = reinterpret_tensor  # offset relative to the source's: a view",
            "_empty_strided = torch.empty_strided",
        ]
        header += [f"{var} = torch.device({dev!r})" for dev, var in self.devices.items()]
        header += [f"{var} = op_callable({op!r})" for op, var in self.ops.items()]
        header += self.kernel_header()
        header += self.choice_header()
        header += self.header_lines
        header.append("")
        if self.sanitizer is not None:
            header.append("_sanitizer = None  # the program's ProgramSanitizer (config.sanitize), bound by the loader")
        header.append("# Constants (parameters and buffers), bound by the loader before the first call.")
        header += [f"{c.name} = None" for c in program.constants]
        lines = header + ["", "", *self.constant_views_source(), *self.static_views_source(), "def call(args):"]
        lines += self.body + ["", ""]
        lines += self.graph_source() + self.benchmark_source(program)
        return "\n".join(lines) + "\n"

    def constant_views_source(self) -> list[str]:
        """`_bind_constant_views()`: the loader calls it once the constants are bound. A view
        shares its constant's storage, so it sees the constant's in-place updates."""
        names = list(self.constant_views)
        body = [f"    {name} = {view}" for name, view in self.constant_views.items()]
        return [
            *([*(f"{name} = None" for name in names), "", ""] if names else []),
            "def _bind_constant_views():",
            *([f"    global {', '.join(names)}", *body] if names else ["    pass"]),
            "", "",
        ]

    def benchmark_source(self, program: Program) -> list[str]:
        """`benchmark_compiled_module()`: random inputs and constants at the symbols' hints."""
        hints = {s.symbol: s.hint for s in program.symbols}
        examples = []
        for spec in program.inputs:
            if isinstance(spec, TensorInput):
                t = spec.type
                sizes = _evaluate_at_hints(t.sizes, hints)
                strides = _evaluate_at_hints(t.strides or (), hints)
                examples.append(f"example_tensor({sizes!r}, {strides!r}, {t.dtype}, {str(t.device)!r})")
            else:
                examples.append(repr(spec.kind(2)))
        constants = []
        for c in program.constants:
            t = c.type
            sizes, strides = _evaluate_at_hints(t.sizes, hints), _evaluate_at_hints(t.strides or (), hints)
            constants.append(f"        {c.name!r}: example_tensor({sizes!r}, {strides!r}, {t.dtype}, {str(t.device)!r}),")
        devices = {str(t.type.device) for t in program.inputs if isinstance(t, TensorInput)}
        syncs = [device_overrides(d).python_synchronize() for d in sorted(devices)]
        sync_body = "; ".join(s for s in syncs if s) or "pass"
        return [
            "def _synchronize():",
            f"    {sync_body}",
            "",
            "",
            "def benchmark_compiled_module(times=20, repeat=5):",
            '    """Run `call` on random inputs of the compiled shapes; print and return seconds per call."""',
            "    missing = {",
            *constants,
            "    }",
            "    for name, value in missing.items():",
            "        if globals()[name] is None:",
            "            globals()[name] = value",
            "    _bind_constant_views()",
            f"    args = [{', '.join(examples)}]",
            "    seconds = benchmark(call, args, _synchronize, times, repeat)",
            '    print(f"{seconds * 1e6:.1f} us per call")',
            "    return seconds",
            "",
            "",
            'if __name__ == "__main__":',
            "    benchmark_compiled_module()",
        ]

    def start_compile(self, program: Program) -> Callable[[], CompiledArtifact]:
        """The module is written now and imported (its Triton kernels waited for) in the step."""
        source = self.emit(program)
        path = write_cached("python", source, ".py")
        return lambda: self._load(program, source, path)

    def _load(self, program: Program, source: str, path: str) -> CompiledArtifact:
        module = load_python_module(path)
        for name, value in program.constant_values().items():
            setattr(module, name, value)
        module._bind_constant_views()
        if self.sanitizer is not None:
            module._sanitizer = self.sanitizer
        return CompiledArtifact(module.call, source, path)

    # -- lines ------------------------------------------------------------------------------
    def emit_bind_symbol(self, line: BindSymbol) -> None:
        observed = line.observed_text()
        value = observed if line.expr == OBSERVED else py_expr(line.expr.xreplace({OBSERVED: sympy.Symbol(f"({observed})")}))
        self.writeline(f"{line.symbol} = {value}")
        low, high = line.checked_bounds()
        conditions = ([f"{line.symbol} < {low}"] if low is not None else []) + ([f"{line.symbol} > {high}"] if high is not None else [])
        if conditions:
            self.writeline(f"if {' or '.join(conditions)}:")
            with self.indent():
                self.writeline(f"symbol_out_of_range({str(line.symbol)!r}, {line.symbol}, {line.min}, {line.max})")

    def emit_assert_input(self, line: AssertInput) -> None:
        if id(line) in self.batched_ids:
            if line is self.batched_checks[0]:
                self._emit_batched_checks(self.batched_checks)
            return
        self._emit_input_check(line)

    def _emit_batched_checks(self, checks: list[AssertInput]) -> None:
        names = ", ".join(c.name for c in checks)
        self.header_lines.append("_input_guard = [None]  # runtime.input_guard, made at the first call")
        self.writeline(f"if _input_guard[0] is None or not _input_guard[0].check({names}):")
        with self.indent():
            for check in checks:
                self._emit_input_check(check)
            sizes = "(" + "".join(f"{py_tuple(tuple(c.sizes))}, " for c in checks) + ")"
            strides = "(" + "".join(f"{py_tuple(tuple(c.strides))}, " for c in checks) + ")"
            self.writeline(f"_input_guard[0] = input_guard(({names},), {sizes}, {strides})")

    def _emit_input_check(self, line: AssertInput) -> None:
        name = line.name
        device = "None" if line.device is None else self.device_handle(line.device)
        sizes = py_tuple(line.sizes)
        checks = [f"not isinstance({name}, _Tensor)", f"{name}.shape != {sizes}"]
        if all(s is not None for s in line.strides):
            checks.append(f"{name}.stride() != {py_tuple(line.strides)}")
        else:
            checks += [f"{name}.stride({d}) != {py_expr(s)}" for d, s in enumerate(line.strides) if s is not None]
        checks.append(f"{name}.dtype != {line.dtype}")
        if line.device is not None:
            checks.append(f"{name}.device != {device}")
        strides = py_tuple(tuple(line.strides))
        self.writeline(f"if {' or '.join(checks)}:")
        with self.indent():
            self.writeline(f"input_mismatch({name!r}, {name}, {sizes}, {strides}, {line.dtype}, {device})")

    def emit_assert_scalar(self, line: AssertScalar) -> None:
        self.writeline(f"if {line.name} != {py_value(line.expected)}:")
        with self.indent():
            self.writeline(f"scalar_mismatch({line.name!r}, {line.name}, {py_value(line.expected)})")

    def emit_allocate(self, line: Allocate) -> None:
        t = line.type
        overrides = device_overrides(t.device)
        allocate = type(overrides).python_allocate if t.device.type in self.single_device_types else DeviceOverrides.python_allocate
        allocation = allocate(overrides, py_tuple(t.sizes), py_tuple(t.strides or ()), str(t.dtype), self.device_handle(t.device))
        self.writeline(f"{line.name} = {allocation}")
        self.starts_storage.add(line.name)
        if overrides.advises_huge_pages(t):
            self.writeline(f"advise_huge_pages({line.name})")

    def emit_reuse_buffer(self, line: ReuseBuffer) -> None:
        t, source = line.type, self.types.get(line.source)
        if isinstance(source, TensorType) and (source.dtype, source.sizes, source.strides) == (t.dtype, t.sizes, t.strides):
            self.writeline(f"{line.name} = {line.source}  # reuse")
            if line.source in self.starts_storage:
                self.starts_storage.add(line.name)
            return
        viewed = line.source if isinstance(source, TensorType) and source.dtype == t.dtype else f"{line.source}.view({t.dtype})"
        # A buffer known to start its storage is re-viewed by the C fast path (an offset relative
        # to the source's is then the absolute 0); any other source by as_strided.
        view = "_reinterpret" if line.source in self.starts_storage else "_as_strided"
        if view == "_reinterpret":
            self.starts_storage.add(line.name)
        self.writeline(f"{line.name} = {view}({viewed}, {py_tuple(t.sizes)}, {py_tuple(t.strides or ())}, 0)  # reuse")

    def emit_allocate_from_pool(self, line: AllocateFromPool) -> None:
        t = line.type
        key = (line.pool, t.dtype)
        if key not in self.pool_views:
            self.pool_views[key] = f"{line.pool}_{dtype_name(t.dtype)}"
            self.writeline(f"{self.pool_views[key]} = {line.pool}.view({t.dtype})")
        offset = sympy.simplify(sympy.sympify(line.offset) / t.dtype.itemsize)
        # An offset the division leaves with a fraction (`Max(...)/2`) would print as a float:
        # divide the byte offset in Python instead, as an int.
        fractional = any(not r.is_Integer for r in offset.atoms(sympy.Rational))
        text = f"({py_expr(line.offset)}) // {t.dtype.itemsize}" if fractional else py_expr(offset)
        self.writeline(
            f"{line.name} = _reinterpret({self.pool_views[key]}, {py_tuple(t.sizes)}, {py_tuple(t.strides or ())}, {text})"
        )

    def emit_free(self, line: Free) -> None:
        if line.name in self.constant_views:
            return  # a module-level view of a constant: it lives as long as the module
        views = [view for (pool, _), view in self.pool_views.items() if pool == line.name]
        self.writeline(f"del {', '.join([line.name, *views])}")

    def emit_reinterpret(self, line: Reinterpret) -> None:
        def view(source: str) -> str:
            return f"_reinterpret({source}, {py_tuple(line.sizes)}, {py_tuple(line.strides)}, {py_expr(line.offset)})"

        if self._is_constant_view(line):
            self.constant_views[line.name] = view(line.source)
            return
        if not self.kept_view(line, view):
            self.writeline(f"{line.name} = {view(line.source)}")

    def _is_constant_view(self, line: Reinterpret) -> bool:
        """A static view of a constant (a weight's transpose for a matmul) is made once, when the
        constants are bound, instead of on every call."""
        bound = line.source in self.bound_constants or line.source in self.constant_views
        return bound and self.sanitizer is None and not line.symbols_used()

    def emit_extern_kernel(self, line: ExternKernel) -> None:
        parts = [py_value(a) for a in line.args] + [f"{k}={py_value(v)}" for k, v in line.kwargs]
        call = f"{self.op_handle(line.op)}({', '.join(parts)})"
        self.writeline(f"{line.name} = {call}" if line.name is not None else call)

    def emit_collective_start(self, line: CollectiveStart) -> None:
        # the functional collective launches it and returns at once; its group is looked up by name
        args = ", ".join(py_value(a) for a in line.op_args())
        self.writeline(f"{line.name} = {self.op_handle(line.op)}({args})")

    def emit_collective_wait(self, line: CollectiveWait) -> None:
        self.writeline(f"{self.op_handle(WAIT_OP)}({line.name})")

    def emit_multi_output(self, line: MultiOutput) -> None:
        self.writeline(f"{line.name} = {line.source}{''.join(f'[{i}]' for i in line.index)}")

    def kernel_header(self) -> list[str]:
        """Module-level code that builds and binds the program's kernels, once per device."""
        by_device: dict[str, list[KernelDefinition]] = {}
        for kernel in self.kernels:
            by_device.setdefault(kernel_device(kernel), []).append(kernel)
        lines: list[str] = []
        for device, kernels in by_device.items():
            lines += device_overrides(device).python_kernel_loader(kernels, self.kernel_signatures)
        return lines

    def emit_kernel_definition(self, line: KernelDefinition) -> None:
        device = kernel_device(line)
        if line.language not in device_overrides(device).kernel_languages():
            raise UnsupportedLineError(
                f"{type(self).__name__} cannot emit line {self.line_number} ({line.format()}): "
                f"no launcher for {line.language} kernels on {device}"
            )
        self.kernels.append(line)
        calls = [c for c in calls_of(self.program) if c.kernel == line.name]  # MultiKernelCall candidates too
        self.kernel_signatures[line.name] = "".join("p" if isinstance(a, TensorRef) else "i" for a in calls[0].args) if calls else ""

    def emit_kernel_call(self, line: KernelCall) -> None:
        definition = next(k for k in self.kernels if k.name == line.kernel)
        device = torch.device(kernel_device(definition))
        overrides = device_overrides(device)
        if str(device) not in self.call_prologues:
            self.call_prologues.add(str(device))
            for text in overrides.python_call_prologue(device.index):
                self.writeline(text)
        args = [(py_value(a), isinstance(a, TensorRef)) for a in line.args]
        self.writeline(overrides.python_kernel_launch(definition, args, [py_expr(g) for g in line.grid]))

    def emit_symbolic_call_arg(self, line: SymbolicCallArg) -> None:
        self.writeline(f"{line.symbol} = {py_expr(line.expr)}")

    def emit_assert_finite(self, line: AssertFinite) -> None:
        self.writeline(f"assert_finite({line.name!r}, {line.name})")

    def emit_ensure_strides(self, line: EnsureStrides) -> None:
        self.writeline(f"{line.name} = _with_strides({line.name}, {py_tuple(line.sizes)}, {py_tuple(line.strides)})")

    def emit_comment(self, line: Comment) -> None:
        self.writeline(f"# {line.text}")

    def emit_output(self, line: Output) -> None:
        self.writeline(f"return {py_tuple(line.values) if line.values else '()'}")

