"""Wrapper IR: the verifier rejects malformed programs naming the line; the printer is stable."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AssertInput,
    BindSymbol,
    Comment,
    ExternKernel,
    Free,
    KernelCall,
    MultiOutput,
    Output,
    Program,
    Reinterpret,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    VerificationError,
    WrapperLine,
    verify,
)

s0 = sympy.Symbol("s0", integer=True, positive=True)
CPU = torch.device("cpu")
F32 = torch.float32


def tensor(*sizes, strides=None) -> TensorType:
    sizes = tuple(sympy.sympify(s) for s in sizes)
    if strides is None:
        strides, acc = [], sympy.Integer(1)
        for size in reversed(sizes):
            strides.insert(0, acc)
            acc = acc * size
    return TensorType(F32, CPU, sizes, tuple(sympy.sympify(s) for s in strides))


def make_program(lines: list[WrapperLine], dynamic: bool = True) -> Program:
    x_type = tensor(s0, 8) if dynamic else tensor(4, 8)
    symbols = (SymbolInfo(s0, 4, 2, None),) if dynamic else ()
    return Program("forward", (TensorInput("x", x_type),), symbols, (), tuple(lines))


def good_lines() -> list[WrapperLine]:
    return [
        BindSymbol(s0, "x", "size", 0, OBSERVED, 2, None),
        AssertInput("x", F32, CPU, (s0, sympy.Integer(8)), (sympy.Integer(8), sympy.Integer(1))),
        Allocate("buf0", tensor(s0, 8)),
        ExternKernel(None, "aten::relu.out", (TensorRef("x"),), (("out", TensorRef("buf0")),), None, ("buf0",)),
        Reinterpret("buf1", "buf0", F32, CPU, (sympy.Integer(8), s0), (sympy.Integer(1), sympy.Integer(8))),
        ExternKernel(
            "buf2",
            "aten::topk.default",
            (TensorRef("buf1"), 2),
            (),
            (TensorType(F32, CPU, (sympy.Integer(8), sympy.Integer(2))), TensorType(torch.int64, CPU, (sympy.Integer(8), sympy.Integer(2)))),
        ),
        MultiOutput("buf3", "buf2", (1,), TensorType(torch.int64, CPU, (sympy.Integer(8), sympy.Integer(2)))),
        Free("buf2"),
        Free("buf0"),
        Comment("results"),
        Output((TensorRef("buf3"), TensorRef("buf1"), s0 * 2)),
    ]


GOLDEN = """\
program forward(
    x: f32[s0, 8] strides [8, 1] cpu,
)
symbols:
    s0 (hint 4, range [2, inf])
lines:
   1  bind s0 = x.size(0)  in [2, inf]
   2  assert_input x: f32[s0, 8] strides [8, 1] cpu
   3  buf0 = allocate f32[s0, 8] strides [8, 1] cpu
   4  extern aten::relu.out(x, out=buf0)  writes buf0
   5  buf1 = reinterpret buf0 as f32[8, s0] strides [1, 8] offset 0 cpu
   6  buf2: (f32[8, 2] cpu, i64[8, 2] cpu) = extern aten::topk.default(buf1, 2)
   7  buf3: i64[8, 2] cpu = buf2[1]
   8  free buf2
   9  free buf0
  10  # results
  11  return (buf3, buf1, 2*s0)
"""


def test_printer_golden() -> None:
    program = verify(make_program(good_lines()))
    assert str(program) == GOLDEN


def test_printer_is_stable_across_equal_programs() -> None:
    assert str(make_program(good_lines())) == str(make_program(good_lines()))
    assert make_program(good_lines()) == make_program(good_lines())


def test_lines_are_frozen_data() -> None:
    line = Free("buf0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        line.name = "buf1"  # type: ignore[misc]


def _expect_error(lines: list[WrapperLine], line_number: int, fragment: str, dynamic: bool = True) -> None:
    with pytest.raises(VerificationError) as info:
        verify(make_program(lines, dynamic))
    assert info.value.line_number == line_number
    assert f"line {line_number} (" in str(info.value)
    assert fragment in str(info.value)


def test_use_before_definition() -> None:
    lines = good_lines()
    lines.insert(2, ExternKernel(None, "aten::relu.out", (TensorRef("x"),), (("out", TensorRef("buf0")),), None, ("buf0",)))
    _expect_error(lines, 3, "uses buf0 before its definition at line 4")


def test_use_of_undefined_name() -> None:
    lines = good_lines()
    lines.insert(3, ExternKernel(None, "aten::relu_.default", (TensorRef("nope"),), (), None, ("nope",)))
    _expect_error(lines, 4, "uses undefined name nope")


def test_use_after_free() -> None:
    lines = good_lines()
    lines.insert(4, Free("buf0"))  # buf1 reinterprets buf0 on the next line
    _expect_error(lines, 6, "uses buf0 after it was freed at line 5")


def test_double_free() -> None:
    lines = good_lines()
    lines.insert(9, Free("buf0"))
    _expect_error(lines, 10, "double free of buf0 (first freed at line 9)")


def test_undefined_symbol() -> None:
    lines = good_lines()[1:]  # drop the binding of s0
    _expect_error(lines, 1, "uses undefined size symbol s0")


def test_symbol_bound_twice() -> None:
    lines = good_lines()
    lines.insert(1, BindSymbol(s0, "x", "size", 0, OBSERVED))
    _expect_error(lines, 2, "binds size symbol s0 a second time")


def test_dtype_mismatch_in_reinterpret() -> None:
    lines = good_lines()
    lines[4] = Reinterpret("buf1", "buf0", torch.float16, CPU, (sympy.Integer(8), s0), (sympy.Integer(1), sympy.Integer(8)))
    _expect_error(lines, 5, "dtype/device mismatch")


def test_device_mismatch_in_multi_output() -> None:
    lines = good_lines()
    lines[6] = MultiOutput("buf3", "buf2", (1,), TensorType(torch.int64, torch.device("meta"), (8, 2)))
    _expect_error(lines, 7, "dtype/device mismatch")


def test_bad_multi_output_index() -> None:
    lines = good_lines()
    lines[6] = MultiOutput("buf3", "buf2", (5,), TensorType(torch.int64, CPU, (8, 2)))
    _expect_error(lines, 7, "no element at index [5]")


def test_redefinition_of_live_name() -> None:
    lines = good_lines()
    lines.insert(3, Allocate("buf0", tensor(4)))
    _expect_error(lines, 4, "redefines buf0, still live since line 3")


def test_call_of_undefined_kernel() -> None:
    lines = good_lines()
    lines.insert(3, KernelCall("triton_poi_0", (TensorRef("buf0"),), (s0,), ("buf0",)))
    _expect_error(lines, 4, "calls kernel triton_poi_0, which no earlier KernelDefinition defines")


def test_line_self_check_is_reported_with_line() -> None:
    lines = good_lines()
    lines[2] = Allocate("buf0", TensorType(F32, CPU, (s0, sympy.Integer(8)), (sympy.Integer(1),)))
    _expect_error(lines, 3, "an allocation needs one stride per size")


def test_program_must_end_with_output() -> None:
    with pytest.raises(VerificationError, match="exactly one Output"):
        verify(make_program(good_lines()[:-1]))


def test_writes_must_be_arguments() -> None:
    lines = good_lines()
    lines[3] = ExternKernel(None, "aten::relu.out", (TensorRef("x"),), (), None, ("buf0",))
    _expect_error(lines, 4, "writes ['buf0'] which are not among its arguments")
