"""Kernel code generators: fused loop bodies → kernel source, one generator per language."""

from __future__ import annotations

from collections.abc import Callable


def kernel_codegen(language: str) -> Callable:
    """The generator for `language`: (group, name, needed buffers, dtypes, hints, aligned) -> GeneratedKernel."""
    if language == "cpp":
        from wrapgen.kernels.cpp.column_reduction import generate_cpp_kernel

        return generate_cpp_kernel
    if language == "triton":
        from wrapgen.kernels.triton.codegen import generate_triton

        return generate_triton
    raise ValueError(f"no kernel code generator for language {language!r}")
