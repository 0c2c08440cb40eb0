"""C++ for an `ExternKernel` line: a call of an ATen operator through torch's stable C shim.

Two routes, picked per line from the operator's schema:

* `aoti_torch_call_dispatcher` (any op): arguments become StableIValues. Tensors are passed as
  new references the call takes over, `T?` values as heap pointers the callee frees, `None`
  as a null value, lists as StableList handles (`wrapgen::Stack` in the runtime header owns
  all of them until the call, so nothing leaks if building the stack fails).
* The generated per-device shims (`aoti_torch_cpu_addmm_out`, ...) for ops with `Scalar`
  arguments, which the dispatcher's StableIValue conversion cannot express; their `Scalar`
  parameters are doubles, optional scalars go by pointer (null for None).

A `Scalar` argument of an op that has a `.Tensor` twin (`remainder.Scalar`, `gt.Scalar_out`)
is passed to the twin as a 0-dim tensor. A `Scalar` that neither route can express refuses
the line, naming it.
"""

from __future__ import annotations

import sympy
import torch

from wrapgen.backends.cpp.call_code import (
    CallCode,
    CannotExpress,
    is_number_type,
    jit_kind,
    overload_parts,
)
from wrapgen.backends.cpp.exprs import (
    cpp_double_expr,
    cpp_expr,
    cpp_float,
    cpp_int_list,
    cpp_string,
    device_index,
    device_type_code,
    dtype_code,
    layout_code,
    memory_format_code,
)
from wrapgen.backends.cpp.shim_route import GeneratedShimRoute, generated_shims
from wrapgen.backends.runtime import resolve_op
from wrapgen.wrapper_ir.lines import ExternKernel
from wrapgen.wrapper_ir.values import TensorRef, TensorType, contiguous_strides

# Scalar results of a multi-result op: the IR reads only tensor elements of a result
# (graph_lowering refuses a getitem of anything else), so these slots are left empty.
_UNHELD_SCALARS = frozenset({"IntType", "SymIntType", "FloatType", "BoolType", "NoneType"})


class ExternWriter(GeneratedShimRoute):
    """Writes the C++ for ExternKernel lines of one program."""

    def __init__(self, types: dict[str, object], device: torch.device) -> None:
        self.types = types
        self.device = device
        self.counter = 0

    # -- entry -----------------------------------------------------------------------------
    def write(self, line: ExternKernel) -> CallCode:
        schema = resolve_op(line.op)._schema
        bound = self._bind(line, schema)
        special = self._rewrite(line, bound)
        if special is not None:
            return special
        numbers = [a.name for a, v in bound if is_number_type(a.real_type) and v is not None]
        if not numbers:
            # A generated shim calls the op's kernel unboxed; the dispatcher's boxed call with its
            # per-call schema lookup costs several microseconds more (felt by small matrix products).
            return self._generated_shim(line, schema, bound) or self._dispatcher(line, line.op, schema, bound)
        twin = self._tensor_twin(line.op, schema, set(numbers))
        if twin is not None:
            twin_op, twin_schema = twin
            rebound = [(t, v) for t, (_, v) in zip(twin_schema.arguments, bound)]
            return self._dispatcher(line, twin_op, twin_schema, rebound)
        code = self._generated_shim(line, schema, bound)
        if code is None:
            code = self._out_via_functional(line, schema, bound)
        if code is None:
            code = self._integral_add(line, schema, bound)
        if code is None:
            code = self._host_arange(line, bound)
        if code is not None:
            return code
        raise CannotExpress(
            f"the Scalar argument(s) {', '.join(numbers)} of {line.op} cannot cross the stable C shim: the "
            "dispatcher's StableIValues have no Scalar, the op has no .Tensor overload, and no generated "
            "shim function takes it"
        )

    # -- ops whose Scalar arguments have an exact Scalar-free spelling -------------------------
    def _rewrite(self, line: ExternKernel, bound) -> CallCode | None:
        _, name, overload = overload_parts(line.op)
        values = {a.name: v for a, v in bound}
        if name == "_assert_scalar":
            # a host-side check of a size condition (torch.export's runtime assertions)
            condition, message = values["self"], str(values["assert_msg"])
            if condition is True or condition == sympy.true:
                return CallCode(lines=[f"// {line.op}: {message.splitlines()[0][:80].replace(chr(92), '/')} (always true)"])
            return CallCode(lines=[f"if (!({cpp_expr(condition)})) throw wrapgen::Error(WG_RUNTIME_ERROR, {cpp_string(message)});"])
        if name in ("var", "std", "var_mean", "std_mean") and overload in ("correction", "correction_out"):
            correction = values.get("correction")
            if correction in (0, 1) and not isinstance(correction, bool) and overload == "correction":
                # unbiased=True is correction 1, False is correction 0
                fake = ExternKernel(
                    line.name, f"aten::{name}.dim", (values["self"], values.get("dim"), correction == 1, values.get("keepdim", False)),
                    result=line.result,
                )
                schema = resolve_op(fake.op)._schema
                return self._dispatcher(fake, fake.op, schema, self._bind(fake, schema))
        if name in ("full", "full_like") and overload == "default":
            like = self.types.get(values["self"].name) if name == "full_like" and isinstance(values.get("self"), TensorRef) else None
            return self._full_by_fill(line, values.get("fill_value"), like)
        if name == "segment_reduce" and overload == "default" and values.get("initial") is not None:
            return self._segment_reduce_initial(line, values)
        if name == "constant_pad_nd" and overload == "default":
            # aten::pad(mode="constant") through the generated shim: the fill value is a double* there
            value = values.get("value", 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and abs(value) > 2**53):
                return None
            fake = ExternKernel(line.name, "aten::pad.default", (values["self"], values["pad"], "constant", float(value)), result=line.result)
            schema = resolve_op(fake.op)._schema
            bound = self._bind(fake, schema)
            saved = self.types
            try:
                return self._generated_shim(fake, schema, bound, allow_integral=True)
            finally:
                self.types = saved
        return None

    # -- binding ----------------------------------------------------------------------------
    def _bind(self, line: ExternKernel, schema: torch._C.FunctionSchema) -> list[tuple[torch._C.Argument, object]]:
        """Each schema argument with its value (given positionally, by keyword, or its default)."""
        kwargs = dict(line.kwargs)
        positional = list(line.args)
        out = []
        for arg in schema.arguments:
            if positional and not arg.kwarg_only:
                out.append((arg, positional.pop(0)))
            elif arg.name in kwargs:
                out.append((arg, kwargs.pop(arg.name)))
            elif arg.has_default_value():
                out.append((arg, _default(arg)))
            else:
                raise CannotExpress(f"{line.op}: no value for argument {arg.name!r}")
        if positional or kwargs:
            raise CannotExpress(f"{line.op}: arguments the schema does not take: {positional or list(kwargs)}")
        return out

    def _tensor_twin(self, op: str, schema: torch._C.FunctionSchema, numbers: set[str]):
        """An overload of the same op where the given Scalar arguments are Tensors and all else is equal."""
        namespace, name, _ = overload_parts(op)
        packet = getattr(getattr(torch.ops, namespace), name)
        for overload in packet.overloads():
            other = getattr(packet, overload)._schema
            if other is schema or len(other.arguments) != len(schema.arguments) or len(other.returns) != len(schema.returns):
                continue
            ok = True
            for a, b in zip(schema.arguments, other.arguments):
                if a.name != b.name or a.kwarg_only != b.kwarg_only:
                    ok = False
                elif a.name in numbers:
                    ok = jit_kind(a.real_type) == "NumberType" and jit_kind(b.real_type) == "TensorType"
                else:
                    ok = str(a.real_type) == str(b.real_type)
                if not ok:
                    break
            if ok:
                return f"{namespace}::{name}.{overload}", other
        return None

    # -- helpers ----------------------------------------------------------------------------
    def _temp(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _tensor_dtypes(self, bound) -> list[torch.dtype]:
        out = []
        for _, v in bound:
            for ref in _refs(v):
                t = self.types.get(ref)
                if isinstance(t, TensorType):
                    out.append(t.dtype)
        return out

    def _undefined_tensor(self, code: CallCode) -> str:
        """An undefined tensor for None passed where the schema says a plain `Tensor` (eager's
        argument parser accepts that: cuDNN attention's backward takes attn_bias so)."""
        name = self._temp("undef")
        code.lines.append(f"AtenTensorHandle {name}_raw = nullptr;")
        code.lines.append(f"wrapgen::check(aoti_torch_new_uninitialized_tensor(&{name}_raw), \"aoti_torch_new_uninitialized_tensor\");")
        code.lines.append(f"wrapgen::Tensor {name}({name}_raw);")
        code.shims.add("aoti_torch_new_uninitialized_tensor")
        return name

    def _number_tensor(self, value: object, dtypes: list[torch.dtype], code: CallCode) -> str:
        """A 0-dim tensor for a Python number passed where a Tensor goes (wrapped-number promotion:
        a float is float32 unless the op works in double)."""
        name = self._temp("num")
        if isinstance(value, bool):
            code.lines.append(f"wrapgen::Tensor {name} = wrapgen::scalar_tensor_bool({'true' if value else 'false'});")
            code.shims.add("aoti_torch_scalar_to_tensor_bool")
        elif isinstance(value, int) or (isinstance(value, sympy.Basic) and value.is_integer):
            code.lines.append(f"wrapgen::Tensor {name} = wrapgen::scalar_tensor_int64({cpp_expr(value)});")
            code.shims.add("aoti_torch_scalar_to_tensor_int64")
        elif isinstance(value, float):
            wide = any(d in (torch.float64, torch.complex128) for d in dtypes)
            fn = "float64" if wide else "float32"
            code.lines.append(f"wrapgen::Tensor {name} = wrapgen::scalar_tensor_{fn}({cpp_float(value)});")
            code.shims.add(f"aoti_torch_scalar_to_tensor_{fn}")
        elif isinstance(value, sympy.Basic) and value.is_real is not False:
            # a float-valued size expression (a dynamic interpolate's scale): float32 like a Python float
            wide = any(d in (torch.float64, torch.complex128) for d in dtypes)
            fn = "float64" if wide else "float32"
            code.lines.append(f"wrapgen::Tensor {name} = wrapgen::scalar_tensor_{fn}({cpp_double_expr(value)});")
            code.shims.add(f"aoti_torch_scalar_to_tensor_{fn}")
        else:
            raise CannotExpress(f"cannot pass {value!r} where a Tensor goes")
        return name

    # -- the dispatcher route ---------------------------------------------------------------
    def _dispatcher(self, line: ExternKernel, op: str, schema, bound) -> CallCode:
        code = CallCode(shims={"aoti_torch_call_dispatcher", "aoti_torch_new_tensor_handle"})
        dtypes = self._tensor_dtypes(bound)
        pushes = [f"st.push({self._encode(a.real_type, v, dtypes, code)});" for a, v in bound]
        _, name, overload = overload_parts(op)
        namespace = op.split("::", 1)[0]
        returns = [r.real_type for r in schema.returns]
        kinds = [jit_kind(r) for r in returns]
        if kinds != kinds[::-1]:
            # aoti_torch_call_dispatcher converts result i with the type of result n-1-i (it pops
            # the IValue stack from the end but reads the schema from the front), which is only
            # right when the result types read the same both ways.
            raise CannotExpress(f"{op} returns {', '.join(str(r) for r in returns)}: torch's dispatcher shim mistypes mixed results")
        flags = ", ".join("1" if jit_kind(r) == "TensorType" else "0" for r in returns) or "0"
        body = [f"wrapgen::Stack st({max(len(bound), len(returns), 1)});", *pushes]
        body.append(f"static const uint8_t tensor_returns[] = {{{flags}}};")
        overload_name = "" if overload == "default" else overload
        body.append(f"st.call({cpp_string(f'{namespace}::{name}')}, {cpp_string(overload_name)}, {len(returns)}, tensor_returns);")
        body += self._bind_results(line, returns)
        code.lines = [*code.lines, *body]
        return code

    def _encode(self, t, value, dtypes, code: CallCode) -> str:
        kind = jit_kind(t)
        if kind == "OptionalType":
            if value is None:
                return "wrapgen::Stack::none()"
            return f"st.some({self._encode(t.getElementType(), value, dtypes, code)})"
        if value is None and kind == "TensorType":
            return f"st.tensor({self._undefined_tensor(code)})"
        if value is None:
            raise CannotExpress(f"None given for a non-optional {t}")
        if kind == "TensorType":
            if isinstance(value, TensorRef):
                return f"st.tensor(t_{value.name})"
            return f"st.tensor({self._number_tensor(value, dtypes, code)})"
        if kind in ("IntType", "SymIntType"):
            return f"wrapgen::Stack::int64({cpp_expr(value)})"
        if kind == "FloatType":
            return f"wrapgen::Stack::f64({cpp_float(float(value))})"
        if kind == "BoolType":
            return f"wrapgen::Stack::boolean({'true' if value else 'false'})"
        if kind in ("ScalarTypeType", "LayoutType", "MemoryFormatType") and isinstance(value, int):
            return f"wrapgen::Stack::enum32({value})"  # a schema default: already the c10 (= shim) code
        if kind == "ScalarTypeType":
            code.shims.add(dtype_code(value).removesuffix("()"))
            return f"wrapgen::Stack::enum32({dtype_code(value)})"
        if kind == "LayoutType":
            code.shims.add(layout_code(value).removesuffix("()"))
            return f"wrapgen::Stack::enum32({layout_code(value)})"
        if kind == "MemoryFormatType":
            code.shims.add(memory_format_code(value).removesuffix("()"))
            return f"wrapgen::Stack::enum32({memory_format_code(value)})"
        if kind == "DeviceObjType":
            device = torch.device(value)
            code.shims.add(device_type_code(device).removesuffix("()"))
            index = device.index if device.index is not None else -1
            return f"wrapgen::Stack::device({device_type_code(device)}, {index})"
        if kind == "StringType":
            code.shims.update({"torch_new_string_handle", "torch_delete_string"})
            return f"st.str({cpp_string(str(value))})"
        if kind == "ListType":
            items = value if isinstance(value, tuple) else (value,)
            code.shims.update({"torch_new_list_reserve_size", "torch_list_push_back", "torch_delete_list"})
            inner = ", ".join(self._encode(t.getElementType(), v, dtypes, code) for v in items)
            return f"st.list({{{inner}}})"
        raise CannotExpress(f"arguments of type {t} cannot cross the dispatcher's StableIValues")

    def _bind_results(self, line: ExternKernel, returns) -> list[str]:
        if line.name is None:
            return []
        target = f"t_{line.name}"
        if len(returns) == 1 and jit_kind(returns[0]) == "TensorType":
            return [f"{target} = st.take_tensor(0);"]
        if len(returns) == 1 and jit_kind(returns[0]) == "ListType" and jit_kind(returns[0].getElementType()) == "TensorType":
            return [f"{target} = st.take_tensor_list(0);"]  # the IR indexes a lone list return directly
        out = []
        for i, r in enumerate(returns):
            kind = jit_kind(r)
            if kind == "TensorType":
                out.append(f"{target}.items.emplace_back(st.take_tensor({i}));")
            elif kind == "ListType" and jit_kind(r.getElementType()) == "TensorType":
                out.append(f"{target}.items.push_back(st.take_tensor_list({i}));")
            elif kind in _UNHELD_SCALARS:
                # e.g. cuDNN attention's max_q / max_k: the IR holds only tensor elements of a
                # result, so this slot is never read; an empty item keeps the indices aligned.
                out.append(f"{target}.items.emplace_back();  // {r}: not held")
            else:
                raise CannotExpress(f"{line.op} returns a {r}, which the C++ target cannot hold")
        return out

    def result_is_tensor(self, line: ExternKernel) -> bool:
        """Whether the line's result is one tensor (else a wrapgen::Value tree)."""
        schema = resolve_op(line.op)._schema
        return len(schema.returns) == 1 and jit_kind(schema.returns[0].real_type) == "TensorType"

    # -- out= ops through their functional form ---------------------------------------------
    def _out_args(self, schema) -> list[str]:
        return [a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]

    def _out_via_functional(self, line: ExternKernel, schema, bound) -> CallCode | None:
        """`op.out(..., out=o)` as the generated shim of its functional overload, then a copy into `o`."""
        outs = self._out_args(schema)
        if len(outs) != 1:
            return None
        namespace, name, _ = overload_parts(line.op)
        packet = getattr(getattr(torch.ops, namespace), name)
        inputs = [(a, v) for a, v in bound if a.name not in outs]
        out_value = dict((a.name, v) for a, v in bound)[outs[0]]
        for overload in packet.overloads():
            other = getattr(packet, overload)._schema
            if len(other.arguments) != len(inputs) or len(other.returns) != 1:
                continue
            if any(a.name != b.name or str(a.real_type) != str(b.real_type) for (a, _), b in zip(inputs, other.arguments)):
                continue
            temp = self._temp("functional")
            fake = ExternKernel(temp, f"{namespace}::{name}.{overload}", tuple(v for _, v in inputs))
            code = self._generated_shim(fake, other, [(b, v) for (_, v), b in zip(inputs, other.arguments)])
            if code is None:
                return None
            code.lines.insert(0, f"wrapgen::Tensor t_{temp};")
            code.lines.append(f"wrapgen::check(aoti_torch_copy_(t_{out_value.name}.get(), t_{temp}.get(), 0), \"aoti_torch_copy_\");")
            code.shims.add("aoti_torch_copy_")
            return code
        return None

    def _integral_add(self, line: ExternKernel, schema, bound) -> CallCode | None:
        """add/sub of integer tensors with an `alpha` (a Scalar no shim route takes for integers):
        self + alpha*other == sum(stack(broadcast(self, alpha*other)), 0), exact for integers."""
        _, name, overload = overload_parts(line.op)
        values = {a.name: v for a, v in bound}
        if name not in ("add", "sub") or overload not in ("Tensor", "out") or set(values) - {"self", "other", "alpha", "out"}:
            return None
        alpha = values.get("alpha", 1)
        if not isinstance(alpha, int) or isinstance(alpha, bool):
            return None
        code = CallCode(shims={"aoti_torch_call_dispatcher", "aoti_torch_new_tensor_handle"})
        steps: list[tuple[str, str, tuple, tuple]] = []
        other = values["other"]
        if alpha != 1:
            steps.append(("scaled", "aten::mul.Tensor", (other, alpha), ()))
            other = TensorRef("__scaled")
        if name == "sub":
            steps.append(("negated", "aten::neg.default", (other,), ()))
            other = TensorRef("__negated")
        steps.append(("parts", "aten::broadcast_tensors.default", ((values["self"], other),), ()))
        steps.append(("stacked", "aten::stack.default", ((TensorRef("__p0"), TensorRef("__p1")),), ()))
        if overload == "out":
            steps.append(("", "aten::sum.IntList_out", (TensorRef("__stacked"), (0,), False), (("out", values["out"]),)))
        else:
            result = self.types.get(line.name) if line.name else None
            dtype = result.dtype if isinstance(result, TensorType) else None
            steps.append(("result", "aten::sum.dim_IntList", (TensorRef("__stacked"), (0,), False), (("dtype", dtype),)))
        for label, op, args, kwargs in steps:
            target = line.name if label == "result" else (f"__{label}" if label else None)
            fake = ExternKernel(target, op, _rename(args), _rename(kwargs))
            sub = self._dispatcher(fake, op, resolve_op(op)._schema, self._bind(fake, resolve_op(op)._schema))
            if target is not None and target != line.name:
                kind = "wrapgen::Value" if label == "parts" else "wrapgen::Tensor"
                code.lines.append(f"{kind} t_{target};")
            code.lines += ["{", *(f"  {text}" for text in sub.lines), "}"]
            code.shims |= sub.shims
            if label == "parts":
                code.lines += [f"wrapgen::Tensor t___p{i} = t___parts.at({{{i}}}).tensor.share();" for i in (0, 1)]
        return code

    def _segment_reduce_initial(self, line: ExternKernel, values: dict) -> CallCode | None:
        """`segment_reduce(..., initial=v)` (a Scalar no shim route takes) for max / min / prod / sum:
        the reduction without `initial` combined with v elementwise. Exact: an empty segment
        yields the identity (-inf, inf, 1, 0), which the combine turns into v. (`mean` is not a
        combine of the two and stays refused.)"""
        combine = {"max": "aten::maximum.default", "min": "aten::minimum.default", "prod": "aten::mul.Tensor",
                   "sum": "aten::add.Tensor"}.get(values.get("reduce"))
        initial = values["initial"]
        if combine is None or not isinstance(initial, (int, float)) or line.name is None:
            return None
        kwargs = tuple((k, v) for k, v in line.kwargs if k != "initial")  # keyword-only in the schema
        code = CallCode(lines=["wrapgen::Tensor t___reduced;"])
        for target, op, a, kw in (
            ("__reduced", line.op, line.args, kwargs),
            (line.name, combine, (TensorRef("__reduced"), initial), ()),
        ):
            fake = ExternKernel(target, op, _rename(a), _rename(kw))
            sub = self.write(fake)  # add's Scalar alpha takes the routes `write` knows
            code.lines += ["{", *(f"  {text}" for text in sub.lines), "}"]
            code.shims |= sub.shims
        return code

    def _full_by_fill(self, line: ExternKernel, value: object, like: object = None) -> CallCode | None:
        """`full` / `full_like`: the result allocated, then filled through the generated
        `fill_.Scalar` shim (a double: exact for every float and for integers up to 2**53). A
        `full_like` whose layout is unknown here allocates through `aten::empty_like` with the
        same options, so torch picks the layout (preserve_format) exactly as `full_like` would."""
        result = self.types.get(line.name) if line.name else None
        if not isinstance(result, TensorType) or result.dtype.is_complex or isinstance(value, complex):
            return None
        if isinstance(value, (bool, int)):
            if abs(int(value)) > 2**53:
                return None
            number = cpp_float(float(value))
        elif isinstance(value, float):
            number = cpp_float(value)
        elif isinstance(value, sympy.Basic):
            number = cpp_double_expr(value)
        else:
            return None
        device = result.device.type
        shim = f"aoti_torch_{device}_fill__Scalar"
        if shim not in generated_shims(f"c_shim_{device}.h"):
            return None
        strides = result.strides
        if strides is None and like is None:
            strides = contiguous_strides(result.sizes)
        if strides is None:
            kwargs = tuple((k, v) for k, v in line.kwargs if k != "fill_value")
            empty = ExternKernel(line.name, "aten::empty_like.default", line.args[:1], kwargs=kwargs, result=line.result)
            code = self.write(empty)
            code.shims.add(shim)
        else:
            code = CallCode(shims={"aoti_torch_empty_strided", shim, dtype_code(result.dtype).removesuffix("()"),
                                   device_type_code(result.device).removesuffix("()")})
            code.lines.append(
                f"t_{line.name} = wrapgen::empty_strided({cpp_int_list(result.sizes)}, "
                f"{cpp_int_list(strides)}, {dtype_code(result.dtype)}, "
                f"{device_type_code(result.device)}, {device_index(result.device)});"
            )
        code.lines.append(f"wrapgen::check({shim}(t_{line.name}.get(), {number}), {cpp_string(shim)});")
        return code

    def _host_arange(self, line: ExternKernel, bound) -> CallCode | None:
        """Integer `aten::arange` on the CPU, filled by the runtime header."""
        _, name, overload = overload_parts(line.op)
        values = {a.name: v for a, v in bound}
        result = self.types.get(line.name) if line.name else None
        if name != "arange" or overload not in ("default", "start", "start_step") or not isinstance(result, TensorType):
            return None
        if result.device.type != "cpu" or result.dtype not in (torch.int64, torch.int32, torch.float32, torch.float64):
            return None
        start, end, step = values.get("start", 0), values["end"], values.get("step", 1)
        if any(isinstance(v, (float, bool)) or v is None for v in (start, end, step)):
            return None
        code = CallCode(shims={"aoti_torch_empty_strided", "aoti_torch_get_data_ptr", dtype_code(result.dtype).removesuffix("()")})
        code.lines.append(
            f"t_{line.name} = wrapgen::arange_cpu_int({cpp_expr(start)}, {cpp_expr(end)}, {cpp_expr(step)}, {dtype_code(result.dtype)});"
        )
        return code



def _rename(value: object) -> object:
    """Fake names of the add/sub composite are C++ locals `t___name` (three underscores)."""
    if isinstance(value, tuple):
        return tuple(_rename(v) for v in value)
    return value


def _refs(value: object) -> list[str]:
    if isinstance(value, TensorRef):
        return [value.name]
    if isinstance(value, tuple):
        return [n for v in value for n in _refs(v)]
    return []


def _default(arg: torch._C.Argument) -> object:
    """A schema default as a Wrapper IR value (lists become tuples; enums stay c10 codes, which
    are the shim's codes too)."""
    value = arg.default_value
    return tuple(value) if isinstance(value, list) else value


__all__ = ["CallCode", "CannotExpress", "ExternWriter", "device_index"]
