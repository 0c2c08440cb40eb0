"""The "cpp" target: C++ through torch's ABI-stable C shim (Jinja templates), built into a `.so`
with `cpp_runtime/`, and the loader that calls it from Python."""

from wrapgen.backends.cpp.emitter import CppEmitter

__all__ = ["CppEmitter"]
