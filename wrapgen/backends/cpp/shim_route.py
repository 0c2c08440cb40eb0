"""The generated-shim route of an extern call: the per-device functions torch generates
(`aoti_torch_cpu_addmm_out`, ...) for ops with `Scalar` arguments, which the dispatcher's
StableIValue conversion cannot express. Their `Scalar` parameters are doubles; optional
scalars go by pointer (null for None)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from wrapgen.backends.cpp.call_code import (
    INTEGRAL_DTYPES,
    CallCode,
    CannotExpress,
    is_number_type,
    jit_kind,
    overload_parts,
)
from wrapgen.backends.cpp.exprs import cpp_expr, cpp_float, cpp_int, cpp_string, dtype_code, layout_code
from wrapgen.wrapper_ir.lines import ExternKernel
from wrapgen.wrapper_ir.values import TensorRef


@dataclass(frozen=True)
class ShimFunction:
    name: str
    params: tuple[tuple[str, str], ...]  # (C type, parameter name)
    min_version: str  # torch version that added it ("" when it predates version guards)


@functools.cache
def _shim_include_dir() -> Path:
    return Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor" / "aoti_torch" / "generated"


@functools.cache
def generated_shims(header: str) -> dict[str, ShimFunction]:
    """The functions a generated shim header (`c_shim_cpu.h`, ...) declares, with their version guards."""
    path = _shim_include_dir() / header
    if not path.exists():
        return {}
    out: dict[str, ShimFunction] = {}
    guard = ""
    for line in path.read_text().splitlines():
        m = re.match(r"#if TORCH_FEATURE_VERSION >= TORCH_VERSION_(\d+)_(\d+)_\d+", line)
        if m:
            guard = f"{m.group(1)}.{m.group(2)}"
            continue
        if line.startswith("#endif"):
            guard = ""
            continue
        m = re.match(r"AOTI_TORCH_EXPORT AOTITorchError (\w+)\((.*)\);", line)
        if not m:
            continue
        params = []
        for part in m.group(2).split(", ") if m.group(2) else []:
            ctype, _, name = part.rpartition(" ")
            params.append((ctype.strip(), name.strip()))
        out[m.group(1)] = ShimFunction(m.group(1), tuple(params), guard)
    return out


# C types of a generated shim's scalar result pointers (`int64_t* ret4`).
_SCALAR_RESULTS = frozenset({"int64_t", "double", "bool"})


class GeneratedShimRoute:
    """Mixin of `ExternWriter`: calls through a generated shim function, where one exists for the
    op and every argument has a C type the function takes (else `None`: try the next route)."""

    def _generated_shim(self, line: ExternKernel, schema, bound, allow_integral: bool = False) -> CallCode | None:
        _, name, overload = overload_parts(line.op)
        fn_name = f"aoti_torch_{self.device.type}_{name}" + ("" if overload == "default" else f"_{overload}")
        fn = generated_shims(f"c_shim_{self.device.type}.h").get(fn_name)
        if fn is None:
            fn_name = f"aoti_torch_aten_{name}" + ("" if overload == "default" else f"_{overload}")
            fn = generated_shims("c_shim_aten.h").get(fn_name)
        if fn is None:
            return None
        dtypes = self._tensor_dtypes(bound)
        integral = not allow_integral and any(d in INTEGRAL_DTYPES for d in dtypes)
        values = {a.name: (a, v) for a, v in bound}
        for a, v in bound:
            if is_number_type(a.real_type) and v is not None and not isinstance(v, float) and integral:
                return None  # an int Scalar would become a double: integral ops reject or change meaning
        code = CallCode(shims={fn_name})
        call_args: list[str] = []
        results: list[str | None] = []
        lengths: dict[str, str] = {}
        for ctype, pname in fn.params:
            if pname.endswith("_len_"):
                call_args.append(lengths[pname.removesuffix("_len_")])
                continue
            if re.fullmatch(r"ret\d+", pname):
                held = ctype.removesuffix("*")
                if ctype != "AtenTensorHandle*" and held not in _SCALAR_RESULTS:
                    return None
                tmp = self._temp("ret")
                code.lines.append(f"{held} {tmp} = {'nullptr' if held == 'AtenTensorHandle' else 0};")
                call_args.append(f"&{tmp}")
                results.append(tmp if held == "AtenTensorHandle" else None)
                continue
            if pname not in values:
                return None
            arg, value = values[pname]
            try:
                expr = self._shim_arg(ctype, arg, value, dtypes, code, lengths, pname)
            except CannotExpress:
                return None
            call_args.append(expr)
        code.lines.append(f"wrapgen::check({fn_name}({', '.join(call_args)}), {cpp_string(fn_name)});")
        # A scalar result (cuDNN attention's max_q / max_k) is never read by the IR, which holds
        # only tensor elements of a result: an empty item keeps the tensor elements' indices.
        owned = [None if r is None else f"wrapgen::Tensor({r})" for r in results]
        if line.name is not None:
            if len(results) == 1 and owned[0] is not None and self.result_is_tensor(line):
                code.lines.append(f"t_{line.name} = {owned[0]};")
            else:
                code.lines += [f"t_{line.name}.items.emplace_back({o or ''});" for o in owned]
        else:
            code.lines += [f"{o}.reset();" for o in owned if o is not None]
        return code

    def _shim_arg(self, ctype: str, arg, value, dtypes, code: CallCode, lengths: dict, pname: str) -> str:
        kind = jit_kind(arg.real_type)
        inner = arg.real_type.getElementType() if kind == "OptionalType" else None
        if ctype == "AtenTensorHandle":
            if isinstance(value, TensorRef):
                return f"t_{value.name}.get()"
            if value is None:
                return f"{self._undefined_tensor(code)}.get()"
            return f"{self._number_tensor(value, dtypes, code)}.get()"
        if ctype == "AtenTensorHandle*":  # Tensor?
            if value is None:
                return "nullptr"
            tmp = self._temp("h")
            source = f"t_{value.name}" if isinstance(value, TensorRef) else self._number_tensor(value, dtypes, code)
            code.lines.append(f"AtenTensorHandle {tmp} = {source}.get();")
            return f"&{tmp}"
        if ctype == "double":
            return cpp_float(float(value))
        if ctype == "double*":
            if value is None:
                return "nullptr"
            tmp = self._temp("d")
            code.lines.append(f"double {tmp} = {cpp_float(float(value))};")
            return f"&{tmp}"
        if ctype == "int64_t":
            return cpp_expr(value)
        if ctype == "int64_t*":
            if value is None:
                return "nullptr"
            tmp = self._temp("i")
            code.lines.append(f"int64_t {tmp} = {cpp_expr(value)};")
            return f"&{tmp}"
        if ctype == "int32_t" and (kind == "BoolType"):
            return "1" if value else "0"
        if ctype == "int32_t" and kind == "ScalarTypeType":
            return dtype_code(value)
        if ctype == "const int64_t*":
            items = value if isinstance(value, tuple) else (value,)
            tmp = self._temp("a")
            code.lines.append(f"const int64_t {tmp}[] = {{{', '.join(cpp_expr(v) for v in items) or '0'}}};")
            lengths[pname] = cpp_int(len(items))
            return tmp
        if ctype == "const char*" and kind == "StringType":
            return cpp_string(str(value))
        if ctype == "int32_t*" and inner is not None:
            if value is None:
                return "nullptr"
            tmp = self._temp("e")
            ikind = jit_kind(inner)
            text = (
                dtype_code(value) if ikind == "ScalarTypeType"
                else layout_code(value) if ikind == "LayoutType"
                else ("1" if value else "0") if ikind == "BoolType"
                else None
            )
            if text is None:
                raise CannotExpress(pname)
            code.lines.append(f"int32_t {tmp} = {text};")
            return f"&{tmp}"
        raise CannotExpress(f"shim parameter {ctype} {pname}")
