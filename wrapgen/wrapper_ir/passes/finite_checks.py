"""Add an `AssertFinite` for every floating-point tensor output (config.check_finite)."""

from __future__ import annotations

from wrapgen.wrapper_ir.lines import AssertFinite, Output
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorRef, TensorType, is_floating


def add_finite_checks(program: Program) -> Program:
    types = program.value_types()
    *body, output = program.lines
    assert isinstance(output, Output)
    checks = []
    for value in dict.fromkeys(v for v in output.values if isinstance(v, TensorRef)):
        type_ = types.get(value.name)
        if isinstance(type_, TensorType) and is_floating(type_.dtype):
            checks.append(AssertFinite(value.name, type_.dtype))
    return program.with_lines([*body, *checks, output])
