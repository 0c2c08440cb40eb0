"""Exceptions wrapgen raises on purpose, so callers can tell our refusals from bugs."""


class WrapgenError(Exception):
    """Base of wrapgen's own errors."""


class LoweringError(WrapgenError, ValueError):
    """A program cannot be lowered to the Wrapper IR (the message says which part and why)."""


class UnsupportedLineError(WrapgenError, NotImplementedError):
    """An emitter was given a line type it cannot express."""


class InputMismatchError(WrapgenError, ValueError):
    """A compiled program was called with an input it was not compiled for."""


class SanitizerError(WrapgenError, RuntimeError):
    """The sanitizer (config.sanitize) caught a program breaking the Wrapper IR's rules at run time:
    a write the line does not declare, a reuse of storage still in use, a view past its storage, a
    read of freed data, or a size symbol outside its range. `line_number` is 1-based, as in
    `str(program)`; `buffer` names the tensor concerned (None for a symbol)."""

    def __init__(self, line_number: int, line_text: str, buffer: str | None, problem: str) -> None:
        self.line_number = line_number
        self.line_text = line_text
        self.buffer = buffer
        self.problem = problem
        super().__init__(f"line {line_number} ({line_text}): {problem}")
