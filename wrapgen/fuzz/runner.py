"""Run one generated program eagerly and through every variant (target x memory planning, the
interpreter with the sanitizer), and compare each with eager."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wrapgen import config
from wrapgen.api import build, lower
from wrapgen.errors import InputMismatchError, LoweringError, UnsupportedLineError
from wrapgen.fuzz.generator import FuzzProgram
from wrapgen.wrapper_ir.program import Program

MEMORY_PLANNING = ("none", "reuse", "pooled")
# Relative tolerance by the least precise float type a program computes in; the absolute tolerance
# is the same times each expected output's largest magnitude (at least 1). Fused kernels round
# half precision once where eager rounds after every op, so half results differ by a few ulps.
TOLERANCES = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Variant:
    target: str
    memory_planning: str
    sanitize: bool = False
    kernels: bool = True  # config.kernels: generated kernels, or library calls only

    @property
    def label(self) -> str:
        extra = ("+sanitize" if self.sanitize else "") + ("" if self.kernels else "+library-calls")
        return f"{self.target}{extra}/{self.memory_planning}"


def variants(targets: list[str]) -> list[Variant]:
    """Every target in every memory-planning mode, the interpreter always with the sanitizer; and
    the interpreter and python on the program lowered to library calls only (many more buffers
    for memory planning, in-place library calls)."""
    chosen = [Variant(t, mode, t == "interpret") for mode in MEMORY_PLANNING for t in targets]
    chosen += [Variant(t, mode, t == "interpret", kernels=False)
               for mode in MEMORY_PLANNING for t in targets if t in ("interpret", "python")]
    return chosen


@dataclass(frozen=True)
class Outcome:
    """What one variant did: "ok", "wrong" (results differ), "error" (it raised), or "refused"
    (a documented UnsupportedLineError)."""

    variant: Variant
    kind: str
    message: str = ""

    @property
    def signature(self) -> str:
        """What a shrunk program must still show: the kind, and for errors the exception type."""
        return self.kind if self.kind != "error" else f"error:{self.message.split(':', 1)[0]}"


class EagerRefused(Exception):
    """Eager PyTorch rejects the program (it is skipped, not counted)."""


class NotCaptured(Exception):
    """torch.export could not capture the program (not wrapgen's to judge; counted apart)."""


def size_sets(program: FuzzProgram) -> tuple[int, ...]:
    return (0, 1) if program.dynamic else (0,)


def eager(program: FuzzProgram, which: int) -> list[torch.Tensor]:
    """Eager's outputs, then its inputs as the program left them, on the data compiled code sees."""
    args = program.inputs_at(which, 1)
    try:
        with torch.no_grad():
            outputs = program.function()(*args)
    except Exception as error:  # noqa: BLE001
        raise EagerRefused(f"{type(error).__name__}: {error}") from error
    return list(outputs) + args


def compare(actual: list, expected: list, precision: str, outputs: int) -> str | None:
    """None when they agree within the program's tolerance, else what differs. Both lists hold the
    `outputs` results, then the inputs as the program left them."""
    if len(actual) != len(expected):
        return f"{len(actual) - len(expected) + outputs} results, eager has {outputs}"
    tol = TOLERANCES[precision]
    for i, (a, e) in enumerate(zip(actual, expected)):
        scale = max(1.0, float(e.abs().max())) if e.is_floating_point() and e.numel() else 1.0
        try:
            torch.testing.assert_close(a, e, rtol=tol, atol=tol * scale, equal_nan=True)
        except AssertionError as error:
            return f"{f'result {i}' if i < outputs else f'input {i - outputs} (as updated)'}: {error}"
    return None


def lower_program(program: FuzzProgram, kernels: bool = True) -> Program:
    """The program's Wrapper IR, traced once for all variants of a kind (raises NotCaptured where
    torch.export fails)."""
    try:
        with torch.no_grad(), config.patch(kernels=kernels):
            return lower(program.function(), program.inputs_at(0, 0), dynamic=program.dynamic)
    except LoweringError as error:
        if "torch.export could not capture" in str(error):
            raise NotCaptured(str(error).splitlines()[0]) from error
        raise


def run_variant(program: FuzzProgram, ir: Program, variant: Variant, expected: dict[int, list]) -> Outcome:
    try:
        with config.patch(memory_planning=variant.memory_planning, sanitize=variant.sanitize):
            artifact = build(ir, variant.target)
    except UnsupportedLineError as error:
        return Outcome(variant, "refused", str(error))
    except Exception as error:  # noqa: BLE001 - a finding
        return Outcome(variant, "error", f"{type(error).__name__}: compiling: {error}")
    for which in size_sets(program):
        args = program.inputs_at(which, 1)
        try:
            with torch.no_grad():
                outputs = list(artifact.call(list(args)))
        except InputMismatchError as error:
            if which == 0:
                return Outcome(variant, "error", f"{type(error).__name__}: {error}")
            # Called at sizes other than those it was compiled for, outside the range torch.export
            # proved (e.g. [3, inf] for a dim sliced [1:-1]): a documented refusal, not a mismatch.
            return Outcome(variant, "refused", f"{type(error).__name__}: {error}")
        except Exception as error:  # noqa: BLE001 - a finding
            return Outcome(variant, "error", f"{type(error).__name__}: {error}")
        problem = compare(outputs + args, expected[which], program.precision(), len(program.outputs))
        if problem is not None:
            sizes = dict(program.sizes[which])
            return Outcome(variant, "wrong", f"at sizes {sizes}: {problem}")
    return Outcome(variant, "ok")


def check(program: FuzzProgram, chosen: list[Variant]) -> list[Outcome]:
    """Every variant's outcome (raises EagerRefused or NotCaptured for programs that are skipped).
    A lowering failure is one "error" outcome for the pseudo-variant "lower"."""
    expected = {which: eager(program, which) for which in size_sets(program)}
    outcomes = []
    for kernels in dict.fromkeys(v.kernels for v in chosen):
        try:
            ir = lower_program(program, kernels)
        except NotCaptured:
            raise
        except Exception as error:  # noqa: BLE001 - a finding
            lowering = Variant("lower", "none", kernels=kernels)
            outcomes.append(Outcome(lowering, "error", f"{type(error).__name__}: {error}"))
            continue
        outcomes += [run_variant(program, ir, v, expected) for v in chosen if v.kernels == kernels]
    return outcomes


def still_fails(program: FuzzProgram, variant: Variant, signature: str) -> bool:
    """Whether `program` (a shrinking candidate) shows the same failure in `variant`."""
    try:
        outcome = check(program, [variant])[0]
    except (EagerRefused, NotCaptured):
        return False
    return outcome.signature == signature
