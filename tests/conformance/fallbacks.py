"""Which lines of a program count as ATen fallbacks — the one place that decides it.

A "fallback" is work that runs as a plain ATen call because wrapgen has no lowering for it.
Matrix products, convolutions and fused attention are meant to stay library calls (the
vendor kernels are what we want there), so they never count. Today, with no generated
kernels yet, every other `ExternKernel` line is a fallback; issue #4 (generated kernels)
refines `is_fallback` as lowerings land (e.g. copies that write a mutation back).
"""

from __future__ import annotations

from wrapgen.wrapper_ir import ExternKernel, Program, WrapperLine

# ATen ops (schema names, any overload) that are library calls by design.
LIBRARY_CALL_OPS: frozenset[str] = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::convolution",
    }
)
# Schema-name prefixes of library calls by design (the fused attention kernels).
LIBRARY_CALL_PREFIXES: tuple[str, ...] = ("aten::_scaled_dot_product_",)


def schema_name(qualified: str) -> str:
    """`"aten::addmm.out"` -> `"aten::addmm"` (ExternKernel.op is the qualified overload)."""
    namespace, _, rest = qualified.partition("::")
    return f"{namespace}::{rest.split('.', 1)[0]}"


def is_library_call(qualified: str) -> bool:
    name = schema_name(qualified)
    return name in LIBRARY_CALL_OPS or name.startswith(LIBRARY_CALL_PREFIXES)


def is_fallback(line: WrapperLine) -> bool:
    """True when `line` runs an op as an ATen fallback rather than as lowered code."""
    return isinstance(line, ExternKernel) and not is_library_call(line.op)


def fallback_ops(program: Program) -> tuple[str, ...]:
    """The distinct ops (qualified overloads, first-use order) that `program` runs as fallbacks."""
    return tuple(dict.fromkeys(line.op for line in program.lines if is_fallback(line)))
