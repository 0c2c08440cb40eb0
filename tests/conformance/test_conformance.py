"""The conformance suite's fast subset (CI): fixed OpInfo ops x every registered target x
static / dynamic shapes (and in-place variants), failing on any *wrong* or *crash*.

Known failures (known_failures.py) are strict xfails: an entry that starts passing fails the
run until it is deleted. `make conformance` (python -m tests.conformance.run) runs every op.
"""

from __future__ import annotations

import functools

import pytest
import torch

import wrapgen
from wrapgen.wrapper_ir import ExternKernel, Output, Program, TensorRef

from . import fallbacks
from .harness import (
    CAPTURE_FAILED,
    CLASSES,
    CRASH,
    FAILING,
    FALLBACK,
    MODE_BY_NAME,
    PASS,
    SKIPPED,
    WRONG,
    compare,
    compare_run,
    devices,
    make_samples,
    op_database,
    run_sample,
)
from .known_failures import ALL_MODES, KNOWN_FAILURES, known_failure, verdict
from .subset import FAST_INPLACE, FAST_MODES, FAST_SUBSET, SAMPLES_PER_OP


class KnownFailure(AssertionError):
    """A failure of the kind known_failures.py lists for the op (what the xfail expects)."""


@functools.cache
def _samples(key: str, device: str) -> tuple:
    return tuple(make_samples(op_database()[key], device, SAMPLES_PER_OP))


def _cases() -> list:
    params = []
    for device in devices():
        for target in wrapgen.backends.registered_backends():
            cases = [(key, mode) for key in FAST_SUBSET for mode in FAST_MODES]
            cases += [(key, "inplace-static") for key in FAST_INPLACE]
            for key, mode in cases:
                entry = known_failure(key, mode, target, device, [i for i, _ in _samples(key, device)])
                marks = [pytest.mark.xfail(reason=entry.reason, raises=KnownFailure, strict=True)] if entry else []
                params.append(pytest.param(device, target, key, mode, id=f"{device}-{target}-{mode}-{key}", marks=marks))
    return params


@pytest.mark.parametrize(("device", "target", "key", "mode"), _cases())
def test_op(device: str, target: str, key: str, mode: str) -> None:
    samples = _samples(key, device)
    assert samples, f"{key} has no samples on {device}"
    outcomes = [(i, run_sample(key, s, MODE_BY_NAME[mode], [target], device)[target]) for i, s in samples]
    failures = [(i, o) for i, o in outcomes if o.cls in FAILING]
    if not failures:
        return
    report = "\n".join(f"  sample #{i}: {o.cls}: {o.reason}" for i, o in failures)
    status, _ = verdict(key, mode, target, device, {i: o.cls for i, o in failures}, [i for i, _ in samples])
    if status == "known":
        raise KnownFailure(f"{key} ({mode}, {target}, {device}), as listed:\n{report}")
    raise AssertionError(f"{key} ({mode}, {target}, {device}):\n{report}")


# -- the suite's own pieces -------------------------------------------------------------------


def test_subset_names_existing_ops() -> None:
    ops = op_database()
    assert not [k for k in FAST_SUBSET + FAST_INPLACE if k not in ops]
    assert len(set(FAST_SUBSET)) == len(FAST_SUBSET)
    assert all(ops[k].inplace_variant is not None for k in FAST_INPLACE)


def test_known_failures_are_well_formed() -> None:
    ops = op_database()
    for key, entry in KNOWN_FAILURES.items():
        assert key in ops, f"known_failures.py: {key!r} is no OpInfo op"
        assert entry.reason.strip(), key
        assert set(entry.kinds) <= set(FAILING) and entry.kinds, key
        assert set(entry.modes) <= set(ALL_MODES) and entry.modes, key


def test_classes_are_distinct() -> None:
    assert len(set(CLASSES)) == len(CLASSES) == 6
    assert {PASS, FALLBACK, CAPTURE_FAILED, WRONG, CRASH, SKIPPED} == set(CLASSES)


def test_fallback_predicate() -> None:
    assert not fallbacks.is_library_call("aten::sin.out")
    for op in ("aten::mm.out", "aten::addmm.default", "aten::bmm.out", "aten::baddbmm.out", "aten::convolution.default",
               "aten::_scaled_dot_product_flash_attention_for_cpu.default"):
        assert fallbacks.is_library_call(op), op
    x, w, y, z = (TensorRef(n) for n in "xwyz")
    lines = (
        ExternKernel(None, "aten::mm.out", (x, w), (("out", y),), None, ("y",)),
        ExternKernel(None, "aten::sin.out", (y,), (("out", z),), None, ("z",)),
        ExternKernel(None, "aten::sin.out", (z,), (("out", y),), None, ("y",)),
        Output((y,)),
    )
    assert fallbacks.fallback_ops(Program("p", (), (), (), lines)) == ("aten::sin.out",)
    assert fallbacks.fallback_ops(Program("p", (), (), (), (Output(()),))) == ()


def test_compare_is_strict_where_it_should_be() -> None:
    f = torch.tensor([1.0, float("nan")])
    assert compare(f, f.clone(), 1e-6, 1e-5) is None  # NaNs are equal
    assert compare(f + 1e-3, f, 1e-6, 1e-5) is not None
    i = torch.tensor([1, 2])
    assert compare(i + 0, i, 1.0, 10.0) is None
    assert compare(i + 1, i, 1.0, 10.0) is not None  # integers exact, whatever the float tolerance
    assert compare(True, False, 1.0, 1.0) is not None
    assert compare(3, 3.0, 1.0, 1.0) is not None  # python types must match
    assert compare(f.double(), f, 1.0, 1.0) is not None  # dtypes must match
    assert compare((f, i), [f, i], 1.0, 1.0) is not None  # structure must match
    assert compare(torch.return_types.max((f, i)), (f, i), 1.0, 1.0) is not None


def test_a_wrong_result_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A miscompiled program is classified wrong (not pass/fallback): the comparison has teeth."""
    real_compile = wrapgen.compile

    class OffByALittle:
        def __init__(self, compiled):
            self.program = compiled.program
            self.compiled = compiled

        def __call__(self, *args):
            return self.compiled(*args) + 1e-3

    monkeypatch.setattr(wrapgen, "compile", lambda *a, **k: OffByALittle(real_compile(*a, **k)))
    _, sample = _samples("sin", "cpu")[0]
    outcome = run_sample("sin", sample, MODE_BY_NAME["static"], ["python"], "cpu")["python"]
    assert outcome.cls == WRONG, outcome
    assert "Tensor-likes are not close" in outcome.reason


def test_a_mutation_is_compared() -> None:
    """The inputs after the call are compared too: a dropped in-place write is wrong."""
    out = torch.ones(3)
    mismatch = compare_run((out, [torch.zeros(3)]), (out, [torch.ones(3)]), 1e-6, 1e-5)
    assert mismatch is not None and mismatch.startswith("input after the call")


def test_known_failure_verdicts() -> None:
    key = next(iter(KNOWN_FAILURES))
    mode = KNOWN_FAILURES[key].modes[0]
    kind = KNOWN_FAILURES[key].kinds[0]
    assert verdict(key, mode, "python", "cpu", {0: kind})[0] == "known"
    assert verdict(key, mode, "python", "cpu", {})[0] == "stale"
    assert verdict(key, mode, "python", "cpu", {0: "wrong" if kind == "crash" else "crash"})[0] == "unexpected"
    assert verdict("abs", "static", "python", "cpu", {})[0] == "ok"
    assert verdict("abs", "static", "python", "cpu", {0: WRONG})[0] == "unexpected"
    # An entry naming its failing samples covers only those.
    assert verdict("masked_select", "static", "python", "cpu", {2: CRASH}, [0, 2])[0] == "known"
    assert verdict("masked_select", "static", "python", "cpu", {0: CRASH}, [0, 2])[0] == "unexpected"
    assert verdict("masked_select", "static", "python", "cpu", {}, [0])[0] == "ok"
    assert verdict("masked_select", "static", "python", "cpu", {}, [0, 3])[0] == "stale"


# -- bugs the full run found, pinned down ---------------------------------------------------------


def _check(fn, inputs: list, dynamic: bool, calls: list | None = None) -> None:
    compiled = wrapgen.compile(fn, inputs, dynamic=dynamic)
    for args in [inputs] + (calls or []):
        with torch.no_grad():
            assert compare(compiled(*args), fn(*args), 1.3e-6, 1e-5) is None


@pytest.mark.parametrize("dynamic", [False, True])
def test_as_strided_with_explicit_offset_into_an_offset_input(dynamic: bool) -> None:
    """as_strided's storage_offset is absolute: an input's own offset must not shift it."""
    base = torch.randn(40)

    def fn(x):
        return torch.as_strided(x, (2, 2), (1, 2), 10)

    _check(fn, [base[5:15]], dynamic, calls=[[base[5:15]], [base[3:13]]] if not dynamic else [[base[7:20]]])


def test_conj_view_is_not_a_reinterpretation() -> None:
    _check(lambda x: torch.fft.ifft(x, n=10, dim=1, norm="ortho"), [torch.randn(5, 6, 7)], dynamic=False)


@pytest.mark.parametrize("dynamic", [False, True])
def test_data_dependent_sizes_are_bound(dynamic: bool) -> None:
    x = torch.tensor([0.0, 1.0, 0.0, 2.0])
    _check(lambda t: torch.nonzero(t) * 2, [x], dynamic, calls=[[torch.tensor([1.0, 1.0, 0.0, 3.0])]])


def test_side_effect_tokens_are_removed() -> None:
    a = torch.randn(4, 4) + 4 * torch.eye(4)
    _check(torch.linalg.inv, [a], dynamic=True)


def test_dynamic_program_without_inputs() -> None:
    _check(lambda: torch.arange(0, 10, 2), [], dynamic=True)


def test_float_size_expressions_print_as_python() -> None:
    """Sizes like TruncToInt(1.7*ToFloat(s2)) print as math.trunc(...) in the Python wrapper."""

    def fn(x):
        return torch.nn.functional.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)

    _check(fn, [torch.randn(2, 3, 4, 4)], dynamic=True, calls=[[torch.randn(2, 3, 5, 6)]])
