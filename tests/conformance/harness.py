"""Run OpInfo samples through eager PyTorch and through `wrapgen.compile`, and classify each.

One sample of one op, in one mode (function or in-place variant; static or dynamic shapes),
for one target, gets exactly one class:

    pass            matches eager, and nothing ran as an ATen fallback
    fallback        matches eager, but some op ran as an ATen fallback (see fallbacks.py)
    capture failed  torch.export could not trace the program: torch's limit, not ours
    wrong           our result (an output, or an input the op mutates) differs from eager's
    crash           wrapgen raised (or timed out) on a program torch.export did capture
    skipped         not comparable: eager itself fails on the sample, or the op is random /
                    nondeterministic (always with the reason, never silently)

Tensors anywhere in the sample (input, args, kwargs, lists of tensors) become inputs of the
compiled program; everything else (ints, dtypes, strings, ...) is closed over, as a user's
program would hold it. Comparison is `torch.testing.assert_close` with NaNs equal, dtypes,
devices and layouts checked, integer and bool results exact, and float tolerances the
assert_close defaults for the sample dtype raised to the OpInfo's own `toleranceOverride` for
it where it declares one for a test that compares against eager or a reference. Samples are
float32 unless a `dtype` says otherwise (bfloat16, float16: see precision.py, which also says
how half results may match the float32 reference instead of eager).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

import wrapgen
from wrapgen.errors import LoweringError
from wrapgen.wrapper_ir import ExternKernel, Program

from .fallbacks import fallback_ops
from .precision import float_reference, op_tolerance

PASS, FALLBACK, CAPTURE_FAILED, WRONG, CRASH, SKIPPED = "pass", "fallback", "capture failed", "wrong", "crash", "skipped"
CLASSES = (PASS, FALLBACK, CAPTURE_FAILED, WRONG, CRASH, SKIPPED)
FAILING = (WRONG, CRASH)
# An op's class in a mode is the worst class among its samples, in this order (worst last).
SEVERITY = {SKIPPED: 0, PASS: 1, FALLBACK: 2, CAPTURE_FAILED: 3, WRONG: 4, CRASH: 5}

CAPTURE_PREFIX = "torch.export could not capture the program"
# A half-precision pass (or fallback) that matched the float32 reference, not eager (precision.py).
FLOAT_REFERENCE_NOTE = "matches the float32 reference, not eager"
DTYPE = torch.float32  # the default sample dtype (--dtypes picks others)
DEFAULT_TIMEOUT_S = 120.0
REASON_CHARS = 200
_OTHER_SEEDS = (1, 2, 3)

# assert_close's float32 defaults.
DEFAULT_RTOL, DEFAULT_ATOL = 1.3e-6, 1e-5


@dataclass(frozen=True)
class Mode:
    """How a sample is run: the OpInfo's function or in-place variant; static or dynamic shapes."""

    variant: str  # "op" | "inplace"
    dynamic: bool

    @property
    def name(self) -> str:
        shapes = "dynamic" if self.dynamic else "static"
        return shapes if self.variant == "op" else f"{self.variant}-{shapes}"


MODES = (Mode("op", False), Mode("op", True), Mode("inplace", False), Mode("inplace", True))
MODE_BY_NAME = {m.name: m for m in MODES}


@dataclass(frozen=True)
class Outcome:
    cls: str
    reason: str = ""
    fallbacks: tuple[str, ...] = ()


# -- the op database ------------------------------------------------------------------------


def op_key(op: Any) -> str:
    """`"max.reduction_with_dim"`: the OpInfo's name plus its variant_test_name, if any."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def op_database() -> dict[str, Any]:
    """PyTorch's OpInfo database by op_key (imported lazily: it takes seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {op_key(op): op for op in op_db}


def ops_for(device_type: str, dtype: torch.dtype = DTYPE) -> list[str]:
    """Keys of the ops that support `dtype` on `device_type`, sorted."""
    return sorted(k for k, op in op_database().items() if dtype in op.supported_dtypes(device_type))


def modes_for(op: Any, modes: Sequence[Mode] = MODES) -> list[Mode]:
    return [m for m in modes if m.variant == "op" or op.inplace_variant is not None]


def devices() -> list[str]:
    """Devices the suite runs on: CPU, and CUDA when present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def spread(count: int, limit: int | None) -> list[int]:
    """`limit` indices out of range(count), evenly spaced, first and last included (all when
    `limit` is None or not smaller): later samples of an OpInfo vary other arguments than its first."""
    if limit is None or count <= limit:
        return list(range(count))
    if limit == 1:
        return [0]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def make_samples(op: Any, device: str, limit: int | None = None, dtype: torch.dtype = DTYPE) -> list[tuple[int, Any]]:
    """(index, sample) for `limit` of the op's `dtype` samples on `device`, spread over all of
    them (the same ones on every call: the generator is seeded)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generator = iter(op.sample_inputs(device, dtype, requires_grad=False))
        try:
            samples = [next(generator)] if limit == 1 else list(generator)
        except StopIteration:
            samples = []
        finally:
            # Close it now: a generator left open is finalized whenever the garbage collector
            # gets to it (its grad-mode context then exits in the middle of a later trace).
            close = getattr(generator, "close", None)
            if close is not None:
                close()
    return [(i, samples[i]) for i in spread(len(samples), limit)]


@functools.cache
def tolerances(key: str, device_type: str, dtype: torch.dtype = DTYPE) -> tuple[float, float]:
    """(rtol, atol) for the op's float results in `dtype` samples: assert_close's defaults for
    the dtype, raised to the OpInfo's toleranceOverride for it in comparable tests."""
    return op_tolerance(op_database()[key], device_type, dtype)


# -- samples as programs --------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    index: int


def split_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace every tensor in `value` by a slot (appending the tensor to `tensors`)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, dict):
        return {k: split_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if not any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(list(value))):
            return value  # keeps torch.Size and other tuple types exactly as they are
        items = [split_tensors(v, tensors) for v in value]
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*items)
        return type(value)(items)
    return value


def fill_tensors(template: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(template, _Slot):
        return tensors[template.index]
    if isinstance(template, dict):
        return {k: fill_tensors(v, tensors) for k, v in template.items()}
    if isinstance(template, (list, tuple)) and any(isinstance(v, (_Slot, list, tuple, dict)) for v in template):
        items = [fill_tensors(v, tensors) for v in template]
        if isinstance(template, tuple) and hasattr(template, "_fields"):
            return type(template)(*items)
        return type(template)(items)
    return template


def clone_input(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and storage offset (compiled programs check strides;
    a plain clone would make expanded or sliced inputs contiguous)."""
    if t.layout != torch.strided or t.is_nested or t.is_quantized:
        return t.clone()
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    out.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return out


class SampleProgram:
    """One sample of one op variant as a function of its tensors only."""

    def __init__(self, fn: Callable, sample: Any) -> None:
        self.fn = fn
        self.tensors: list[torch.Tensor] = []
        self.template = split_tensors((sample.input, tuple(sample.args), dict(sample.kwargs)), self.tensors)

    def __call__(self, *tensors: torch.Tensor) -> Any:
        input_, args, kwargs = fill_tensors(self.template, tensors)
        return self.fn(input_, *args, **kwargs)

    def fresh_inputs(self) -> list[torch.Tensor]:
        return [clone_input(t) for t in self.tensors]


def run_eager(program: SampleProgram, seed: int = 0) -> tuple[Any, list[torch.Tensor]]:
    """Eager's outputs and its inputs after the call (in-place ops mutate them)."""
    inputs = program.fresh_inputs()
    torch.manual_seed(seed)
    with torch.no_grad():
        return program(*inputs), inputs


# -- comparing ------------------------------------------------------------------------------


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _mismatch_summary(err: AssertionError) -> str:
    """assert_close's message as one line: the headline plus its first detail lines."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return one_line("; ".join(lines[:3]), 2 * REASON_CHARS)


def _is_exact(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def compare(actual: Any, expected: Any, rtol: float, atol: float, what: str = "output") -> str | None:
    """None when `actual` matches `expected`; else a one-line description of the first difference."""
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        return one_line(f"{what} structure differs: got {actual_spec}, eager {expected_spec}", 2 * REASON_CHARS)
    for index, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = what if len(expected_leaves) == 1 else f"{what}[{index}]"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{where}: got a {type(a).__name__}, eager a Tensor"
            exact = _is_exact(e) or _is_exact(a)
            try:
                torch.testing.assert_close(
                    a, e, rtol=0 if exact else rtol, atol=0 if exact else atol, equal_nan=True,
                    check_device=True, check_dtype=True, check_layout=True,
                )
            except AssertionError as err:
                return f"{where}: {_mismatch_summary(err)}"
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (math.isnan(a) and math.isnan(e)) or abs(a - e) <= atol + rtol * abs(e)):
                return f"{where}: got {a!r}, eager {e!r}"
        elif type(a) is not type(e) or a != e:  # ints, bools, None, dtypes, ...: exact
            return f"{where}: got {a!r}, eager {e!r}"
    return None


def compare_run(actual: tuple[Any, list], expected: tuple[Any, list], rtol: float, atol: float) -> str | None:
    """Compare outputs, then the inputs after the call (what the op mutated)."""
    mismatch = compare(actual[0], expected[0], rtol, atol)
    if mismatch is None:
        mismatch = compare(tuple(actual[1]), tuple(expected[1]), rtol, atol, "input after the call")
    return mismatch


def exactly_equal(a: Any, b: Any) -> bool:
    return compare(a, b, 0.0, 0.0) is None


# -- guarding -------------------------------------------------------------------------------


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise SampleTimeout in the block after `seconds` (main thread on POSIX; else unguarded)."""
    usable = seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise SampleTimeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_WRAPGEN_DIR = os.path.dirname(os.path.abspath(wrapgen.__file__)) + os.sep


def _short_path(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    if path.startswith(_WRAPGEN_DIR):
        path = "wrapgen/" + path[len(_WRAPGEN_DIR) :]
    elif "/site-packages/" in path:
        path = path.rsplit("/site-packages/", 1)[-1]
    else:
        path = os.path.basename(path)  # generated code, the standard library
    return f"{path}:{frame.lineno}"


def raised_where(err: BaseException) -> str:
    """Where an error came from: the frame that raised, after the innermost wrapgen frame
    when the error was raised elsewhere (torch, generated code)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "?"
    ours = [f for f in frames if f.filename.startswith(_WRAPGEN_DIR)]
    places = [_short_path(frames[-1])]
    if ours and ours[-1] is not frames[-1]:
        places.insert(0, _short_path(ours[-1]))
    return " > ".join(places)


def _error_outcome(stage: str, err: BaseException) -> Outcome:
    text = str(err)
    if isinstance(err, LoweringError) and text.startswith(CAPTURE_PREFIX):
        return Outcome(CAPTURE_FAILED, one_line(text[len(CAPTURE_PREFIX) :].lstrip(": ")))
    return Outcome(CRASH, one_line(f"{stage} [{raised_where(err)}]: {type(err).__name__}: {text}"))


# -- one sample -----------------------------------------------------------------------------


def skip_reason(op: Any, sample: Any, mode: Mode) -> str | None:
    """Why a sample cannot be compared at all, known before running it."""
    # torch 2.11's OpInfos lack the flag: the empty* factories are the ops it marks.
    uninitialized = op.name in ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided")
    if getattr(op, "has_nondeterministic_output", uninitialized):
        return "nondeterministic: the output is uninitialized memory (OpInfo has_nondeterministic_output)"
    if op.skip_correctness_check_compile_vs_eager:
        return "nondeterministic: OpInfo skip_correctness_check_compile_vs_eager"
    if mode.variant == "inplace" and getattr(sample, "broadcasts_input", False):
        return "in-place variant: the sample broadcasts its input (eager refuses to resize it)"
    return None


def nondeterminism(program: SampleProgram, reference: tuple[Any, list]) -> str | None:
    """Eager again with the same seed (must agree), then with other seeds (random ops differ;
    several, because a small random output can repeat by chance)."""
    if not exactly_equal(run_eager(program, seed=0), reference):
        return "nondeterministic: two identical eager calls differ"
    for seed in _OTHER_SEEDS:
        if not exactly_equal(run_eager(program, seed=seed), reference):
            return "nondeterministic: the output depends on the random seed"
    return None


def _overload(qualified: str) -> torch._ops.OpOverload:
    """`"aten::bernoulli.p"` -> torch.ops.aten.bernoulli.p (ExternKernel.op is the qualified overload)."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")


def random_ops(program: Program) -> tuple[str, ...]:
    """Ops of `program` that draw from the random number generator (ATen's nondeterministic_seeded
    tag): a compiled program may draw in another order than eager, so it cannot be compared."""
    names = []
    for line in program.lines:
        if isinstance(line, ExternKernel) and torch.Tag.nondeterministic_seeded in _overload(line.op).tags:
            names.append(line.op)
    return tuple(dict.fromkeys(names))


def run_target(
    program: SampleProgram,
    expected: tuple[Any, list],
    target: str,
    dynamic: bool,
    tolerance: tuple[float, float],
    timeout: float | None = DEFAULT_TIMEOUT_S,
    reference: Callable[[], tuple[Any, list] | None] | None = None,
) -> Outcome:
    """Compile the sample for `target`, run it on fresh inputs, and classify the result; a
    result that differs from eager's may still match `reference()` (half precision: the float32
    reference, see precision.py)."""
    rtol, atol = tolerance
    stage = "compile"
    try:
        with time_limit(timeout):
            compiled = wrapgen.compile(program, program.fresh_inputs(), target=target, dynamic=dynamic)
            stage = "run"
            inputs = program.fresh_inputs()
            torch.manual_seed(0)
            actual = (compiled(*inputs), inputs)
    except Exception as err:
        return _error_outcome(stage, err)
    randoms = random_ops(compiled.program)
    if randoms:
        return Outcome(SKIPPED, f"nondeterministic: the program calls random ops ({', '.join(randoms)})")
    mismatch = compare_run(actual, expected, rtol, atol)
    note = ""
    if mismatch is not None:
        wide = reference() if reference is not None else None
        if wide is None or compare_run(actual, wide, rtol, atol) is not None:
            both = "differs from eager and from the float32 reference; eager: " if wide is not None else ""
            return Outcome(WRONG, one_line(both + mismatch, 2 * REASON_CHARS))
        note = FLOAT_REFERENCE_NOTE
    fallbacks = fallback_ops(compiled.program)
    if fallbacks:
        return Outcome(FALLBACK, ", ".join(fallbacks) + (f" ({note})" if note else ""), fallbacks)
    return Outcome(PASS, note)


@dataclass
class PreparedSample:
    """A sample ready to compile: the program, eager's result and the tolerances to compare with
    (and, for half samples, the float32 reference, computed the first time a target needs it)."""

    program: SampleProgram
    expected: tuple[Any, list]
    tolerance: tuple[float, float]
    dynamic: bool
    dtype: torch.dtype = DTYPE

    def run(self, target: str, timeout: float | None = DEFAULT_TIMEOUT_S) -> Outcome:
        return run_target(self.program, self.expected, target, self.dynamic, self.tolerance, timeout, self.reference)

    @functools.cached_property
    def wide(self) -> tuple[Any, list] | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float_reference(self.program, self.program.fresh_inputs(), self.expected, self.dtype)

    def reference(self) -> tuple[Any, list] | None:
        return self.wide


def prepare_sample(
    key: str, sample: Any, mode: Mode, device_type: str, timeout: float | None = DEFAULT_TIMEOUT_S,
    dtype: torch.dtype = DTYPE,
) -> PreparedSample | Outcome:
    """Run eager on the sample; a skipped Outcome when it cannot be compared."""
    op = op_database()[key]
    reason = skip_reason(op, sample, mode)
    if reason is None and mode.variant == "inplace" and op.inplace_variant is None:
        reason = "the op has no in-place variant"
    if reason is not None:
        return Outcome(SKIPPED, reason)
    program = SampleProgram(op.op if mode.variant == "op" else op.inplace_variant, sample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with time_limit(timeout):
                expected = run_eager(program)
                reason = nondeterminism(program, expected)
        except Exception as err:
            reason = one_line(f"eager raised {type(err).__name__}: {err}")
    if reason is not None:
        return Outcome(SKIPPED, reason)
    return PreparedSample(program, expected, tolerances(key, device_type, dtype), mode.dynamic, dtype)


def run_sample(
    key: str,
    sample: Any,
    mode: Mode,
    targets: Sequence[str],
    device_type: str,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    dtype: torch.dtype = DTYPE,
) -> dict[str, Outcome]:
    """Classify one sample (of `dtype`) in one mode for each target (eager runs once, for all of them)."""
    prepared = prepare_sample(key, sample, mode, device_type, timeout, dtype)
    if isinstance(prepared, Outcome):
        return {t: prepared for t in targets}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {t: prepared.run(t, timeout) for t in targets}


def worst(classes: Sequence[str]) -> str:
    return max(classes, key=SEVERITY.__getitem__) if classes else SKIPPED
