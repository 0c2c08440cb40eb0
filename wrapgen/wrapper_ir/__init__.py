"""The Wrapper IR: a typed, pure-data description of a compiled program's host-side work."""

from wrapgen.wrapper_ir.lines import (
    OBSERVED,
    Allocate,
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
    SymbolicCallArg,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Constant, Program, ScalarInput, SymbolInfo, TensorInput
from wrapgen.wrapper_ir.values import TensorRef, TensorType
from wrapgen.wrapper_ir.verify import VerificationError, verify

__all__ = [
    "OBSERVED",
    "Allocate",
    "AssertFinite",
    "AssertInput",
    "AssertScalar",
    "BindSymbol",
    "Comment",
    "Constant",
    "ExternKernel",
    "Free",
    "KernelCall",
    "KernelDefinition",
    "MultiOutput",
    "Output",
    "Program",
    "Reinterpret",
    "ScalarInput",
    "SymbolInfo",
    "SymbolicCallArg",
    "TensorInput",
    "TensorRef",
    "TensorType",
    "VerificationError",
    "WrapperLine",
    "verify",
]
