"""Exceptions wrapgen raises on purpose, so callers can tell our refusals from bugs."""


class WrapgenError(Exception):
    """Base of wrapgen's own errors."""


class LoweringError(WrapgenError, ValueError):
    """A program cannot be lowered to the Wrapper IR (the message says which part and why)."""


class UnsupportedLineError(WrapgenError, NotImplementedError):
    """An emitter was given a line type it cannot express."""


class InputMismatchError(WrapgenError, ValueError):
    """A compiled program was called with an input it was not compiled for."""
