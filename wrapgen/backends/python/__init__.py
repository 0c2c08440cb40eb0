"""The "python" target: a Python module with `call(args)`, and the helpers it imports."""

from wrapgen.backends.python.emitter import PythonEmitter

__all__ = ["PythonEmitter"]
