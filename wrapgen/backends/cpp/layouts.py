"""C++ for `EnsureStrides` (wrapper_ir/layout.py): compare a library result's strides with the
expected ones and, where one differs, replace the tensor by a copy laid out as expected, all
through the stable C shim (aoti_torch_empty_strided, aoti_torch_copy_)."""

from __future__ import annotations

from wrapgen.backends.cpp.exprs import device_index, device_type_code, dtype_code
from wrapgen.wrapper_ir.layout import EnsureStrides


class EnsureStridesMixin:
    """The CppEmitter's `emit_ensure_strides` (it provides writeline, use_shim, ints, expr)."""

    def emit_ensure_strides(self, line: EnsureStrides) -> None:
        name = f"t_{line.name}"
        differs = " || ".join(f"{name}.stride({d}) != {self.expr(line, line.strides[d])}" for d in line.checked_dims())  # type: ignore[attr-defined]
        if not differs:
            return  # no dimension of size other than 1: any strides are the expected ones
        self.use_shim("aoti_torch_empty_strided", "aoti_torch_copy_",  # type: ignore[attr-defined]
                      dtype_code(line.dtype).removesuffix("()"), device_type_code(line.device).removesuffix("()"))
        write = self.writeline  # type: ignore[attr-defined]
        write(f"if ({differs}) {{  // the library chose another layout than its meta function: copy")
        write(f"  wrapgen::Tensor restrided = wrapgen::empty_strided({self.ints(line, line.sizes)}, "  # type: ignore[attr-defined]
              f"{self.ints(line, line.strides)}, {dtype_code(line.dtype)}, {device_type_code(line.device)}, "  # type: ignore[attr-defined]
              f"{device_index(line.device)});")
        write(f"  wrapgen::check(aoti_torch_copy_(restrided.get(), {name}.get(), 0), \"aoti_torch_copy_\");")
        write(f"  {name} = std::move(restrided);")
        write("}")
