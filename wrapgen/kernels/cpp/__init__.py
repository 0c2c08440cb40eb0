"""C++ kernels for CPU: code generation, compilation into one shared library, launch."""

from wrapgen.kernels.cpp.codegen import GeneratedKernel, generate_cpp

__all__ = ["GeneratedKernel", "generate_cpp"]
