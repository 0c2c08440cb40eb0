"""`Emitter`: walks a verified Program and dispatches each line to `emit_<line_type>`.

Like `torch.fx.Interpreter`, a subclass changes one behaviour by overriding one method.
A line type without a method is refused with an error naming the line, never skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir.lines import WrapperLine
from wrapgen.wrapper_ir.program import Program


def method_name(line_type: type) -> str:
    """`KernelCall` -> `emit_kernel_call`."""
    return "emit_" + re.sub(r"(?<!^)(?=[A-Z])", "_", line_type.__name__).lower()


@dataclass
class CompiledArtifact:
    """What a target built: the callable `call(args)`, its text form, and where it lives on disk."""

    call: Callable[[list], Any]
    source: str
    path: str | None = None


class Emitter:
    """Base of all targets. `emit` produces the target's artifact; `compile` makes it runnable."""

    name: ClassVar[str] = ""

    def emit(self, program: Program) -> Any:
        self.program = program
        self.begin(program)
        for number, line in enumerate(program.lines, start=1):
            self.line_number = number
            self.dispatch(line)
        return self.finish(program)

    def dispatch(self, line: WrapperLine) -> None:
        method = getattr(self, method_name(type(line)), None)
        if method is None:
            raise UnsupportedLineError(
                f"{type(self).__name__} cannot emit line {self.line_number} ({line.format()}): "
                f"no {method_name(type(line))} method"
            )
        method(line)

    def begin(self, program: Program) -> None:
        """Called before the first line."""

    def finish(self, program: Program) -> Any:
        """Called after the last line; returns the artifact."""
        raise NotImplementedError

    def compile(self, program: Program) -> CompiledArtifact:
        """Emit `program` and make it runnable, now. A target implements this or `start_compile`."""
        return self.start_compile(program)()

    def start_compile(self, program: Program) -> Callable[[], CompiledArtifact]:
        """Emit `program` now and return the step that makes it runnable (waiting for its kernels,
        building, loading), for a caller with other work to do meanwhile: the dynamo backend
        lowers the backward while the forward's kernels compile."""
        raise NotImplementedError(f"{type(self).__name__} implements neither compile nor start_compile")

    def compile_in_steps(self, program: Program) -> Callable[[], CompiledArtifact]:
        """`start_compile`; but a target (or a subclass) that implements `compile` itself decides
        how it compiles: then all of it happens now."""
        if type(self).compile is not Emitter.compile:
            artifact = self.compile(program)
            return lambda: artifact
        return self.start_compile(program)
