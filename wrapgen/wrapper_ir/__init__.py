"""The Wrapper IR: a typed, pure-data description of a compiled program's host-side work."""

from wrapgen.wrapper_ir.collectives import CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.graphs import GraphBegin, GraphEnd
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
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall
from wrapgen.wrapper_ir.program import Constant, Program, ScalarInput, SymbolInfo, TensorInput
from wrapgen.wrapper_ir.values import TensorRef, TensorType
from wrapgen.wrapper_ir.verify import VerificationError, verify

__all__ = [
    "OBSERVED",
    "Allocate",
    "AllocateFromPool",
    "AssertFinite",
    "AssertInput",
    "AssertScalar",
    "BindSymbol",
    "CollectiveStart",
    "CollectiveWait",
    "Comment",
    "Constant",
    "EnsureStrides",
    "ExternKernel",
    "Free",
    "GraphBegin",
    "GraphEnd",
    "KernelCall",
    "KernelDefinition",
    "MultiKernelCall",
    "MultiOutput",
    "Output",
    "Program",
    "Reinterpret",
    "ReuseBuffer",
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
