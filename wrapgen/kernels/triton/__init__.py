"""Triton kernels: codegen from fusion groups, the version-compatibility layer, and the runtime
that compiles and launches them."""
