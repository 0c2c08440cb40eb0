"""The "interpret" target: runs a Wrapper IR program line by line (the IR's reference semantics)."""

from wrapgen.backends.interpret.emitter import InterpretEmitter

__all__ = ["InterpretEmitter"]
