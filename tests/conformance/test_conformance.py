"""The conformance suite's fast subset (CI): fixed OpInfo ops x every registered target x
static / dynamic shapes (and in-place variants), failing on any *wrong* or *crash*.

Known failures (known_failures.py) are strict xfails: an entry that starts passing fails the
run until it is deleted. `make conformance` (python -m tests.conformance.run) runs every op.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

# torch's OpInfo database imports expecttest (a test dependency `make setup` installs); a host without
# it (the bare GPU host) skips this module with that reason instead of failing the whole collection.
pytest.importorskip("expecttest", reason="the OpInfo database (torch.testing._internal) needs expecttest")

import torch

import wrapgen
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir import ExternKernel, Output, Program, TensorRef

from . import fallbacks, run, schedule
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
from .journal import load
from .known_failures import ALL_MODES, HALF_FAILURES, KNOWN_FAILURES, known_failure, verdict
from .precision import DTYPES, float_reference, op_tolerance
from .subset import (
    FAST_INPLACE,
    FAST_MODES,
    FAST_SUBSET,
    HALF_CASES,
    HALF_DTYPES,
    PLANNING_MODES,
    PLANNING_SUBSET,
    SAMPLES_PER_OP,
    TRITON_SUBSET,
)


class KnownFailure(AssertionError):
    """A failure of the kind known_failures.py lists for the op (what the xfail expects)."""


@functools.cache
def _samples(key: str, device: str, dtype: str = "float32") -> tuple:
    return tuple(make_samples(op_database()[key], device, SAMPLES_PER_OP, DTYPES[dtype]))


def _cases() -> list:
    params = []
    for device in devices():
        for target in wrapgen.backends.registered_backends():
            cases = [(key, mode, {}) for key in FAST_SUBSET for mode in FAST_MODES]
            cases += [(key, "inplace-static", {}) for key in FAST_INPLACE]
            if device == "cpu" and target == "python" and compat.available() and compat.interpreting():
                cases += [(key, mode, {"cpu_kernels": "triton"}) for key in TRITON_SUBSET for mode in FAST_MODES]
            cases += [(key, mode, {"memory_planning": planning})
                      for planning in PLANNING_MODES for key in PLANNING_SUBSET for mode in FAST_MODES]
            for key, mode, options in cases:
                entry = known_failure(key, mode, target, device, [i for i, _ in _samples(key, device)])
                marks = [pytest.mark.xfail(reason=entry.reason, raises=KnownFailure, strict=True)] if entry else []
                name = "-".join([device, target, *(str(v) for v in options.values()), mode, key])
                params.append(pytest.param(device, target, key, mode, options, id=name, marks=marks))
    return params


@pytest.mark.parametrize(("device", "target", "key", "mode", "options"), _cases())
def test_op(device: str, target: str, key: str, mode: str, options: dict) -> None:
    """One op's samples in one mode, with config `options` (Triton CPU kernels, interpreted;
    another memory-planning mode) or the defaults."""
    samples = _samples(key, device)
    assert samples, f"{key} has no samples on {device}"
    with wrapgen.config.patch(**options):
        outcomes = [(i, run_sample(key, s, MODE_BY_NAME[mode], [target], device)[target]) for i, s in samples]
    failures = [(i, o) for i, o in outcomes if o.cls in FAILING]
    if not failures:
        return
    report = "\n".join(f"  sample #{i}: {o.cls}: {o.reason}" for i, o in failures)
    status, _ = verdict(key, mode, target, device, {i: o.cls for i, o in failures}, [i for i, _ in samples])
    if status == "known":
        raise KnownFailure(f"{key} ({mode}, {target}, {device}), as listed:\n{report}")
    raise AssertionError(f"{key} ({mode}, {target}, {device}):\n{report}")


def _half_cases() -> list:
    """bf16/fp16 samples (subset.HALF_CASES): on the CPU, C++ kernels, and Triton kernels under
    Triton's interpreter (where it runs); on CUDA the kernels are Triton's whichever
    `cpu_kernels` says, so the Triton cases would repeat the others there and are left out."""
    params = []
    interpreted = compat.available() and compat.interpreting()
    for device in devices():
        for dtype in HALF_DTYPES:
            cases = [(target, key, mode, kernels) for target, kernels, mode, keys in HALF_CASES for key in keys
                     if kernels != "triton" or (device == "cpu" and interpreted)]
            for target, key, mode, kernels in cases:
                ran = [i for i, _ in _samples(key, device, dtype)]
                entry = known_failure(key, mode, target, device, ran, dtype)
                marks = [pytest.mark.xfail(reason=entry.reason, raises=KnownFailure, strict=True)] if entry else []
                name = "-".join([device, dtype, target, f"{kernels}_kernels", mode, key])
                params.append(pytest.param(device, dtype, target, key, mode, kernels, id=name, marks=marks))
    return params


@pytest.mark.parametrize(("device", "dtype", "target", "key", "mode", "kernels"), _half_cases())
def test_op_half(device: str, dtype: str, target: str, key: str, mode: str, kernels: str) -> None:
    """One op's bf16/fp16 sample in one mode, with C++ or Triton kernels (`cpu_kernels` picks
    them on the CPU; on CUDA the kernels are Triton's either way)."""
    samples = _samples(key, device, dtype)
    assert samples, f"{key} has no {dtype} samples on {device}"
    with wrapgen.config.patch(cpu_kernels=kernels):
        outcomes = [(i, run_sample(key, s, MODE_BY_NAME[mode], [target], device, dtype=DTYPES[dtype])[target])
                    for i, s in samples]
    failures = [(i, o) for i, o in outcomes if o.cls in FAILING]
    if not failures:
        return
    report = "\n".join(f"  sample #{i}: {o.cls}: {o.reason}" for i, o in failures)
    status, _ = verdict(key, mode, target, device, {i: o.cls for i, o in failures}, [i for i, _ in samples], dtype)
    if status == "known":
        raise KnownFailure(f"{key} ({mode}, {target}, {device}, {dtype}), as listed:\n{report}")
    raise AssertionError(f"{key} ({mode}, {target}, {device}, {dtype}):\n{report}")


# -- the suite's own pieces -------------------------------------------------------------------


def test_subset_names_existing_ops() -> None:
    ops = op_database()
    assert not [k for k in FAST_SUBSET + FAST_INPLACE + TRITON_SUBSET + PLANNING_SUBSET if k not in ops]
    assert len(set(FAST_SUBSET)) == len(FAST_SUBSET)
    assert all(ops[k].inplace_variant is not None for k in FAST_INPLACE)
    for _target, _kernels, mode, keys in HALF_CASES:
        assert not [k for k in keys if k not in ops]
        assert all(DTYPES[d] in ops[k].supported_dtypes("cpu") for k in keys for d in HALF_DTYPES)
        assert mode.startswith("inplace") <= all(ops[k].inplace_variant is not None for k in keys)


def test_known_failures_are_well_formed() -> None:
    ops = op_database()
    for key, entry in [*KNOWN_FAILURES.items(), *HALF_FAILURES.items()]:
        assert key in ops, f"known_failures.py: {key!r} is no OpInfo op"
        assert entry.reason.strip(), key
        assert set(entry.kinds) <= set(FAILING) and entry.kinds, key
        assert set(entry.modes) <= set(ALL_MODES) and entry.modes, key
        assert entry.dtypes is None or (entry.dtypes and set(entry.dtypes) <= set(DTYPES)), key
    for key, entry in HALF_FAILURES.items():
        assert entry.dtypes is None or "float32" not in entry.dtypes, key


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


def test_half_tolerances_are_pytorchs() -> None:
    """assert_close's per-dtype defaults, raised to the OpInfo's own override for that dtype."""
    sin = op_database()["sin"]
    assert op_tolerance(sin, "cpu", torch.float32) == (1.3e-6, 1e-5)
    assert op_tolerance(sin, "cpu", torch.bfloat16) == (1.6e-2, 1e-5)
    assert op_tolerance(sin, "cpu", torch.float16) == (1e-3, 1e-5)
    assert op_tolerance(op_database()["addmv"], "cpu", torch.float16) == (3e-3, 1e-5)  # TestCommon's override
    assert op_tolerance(op_database()["masked.sum"], "cpu", torch.bfloat16) == (5e-2, 1e-3)


def test_a_half_result_may_match_the_float32_reference_instead_of_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager rounds a decomposed op's intermediates to bf16; a result computed in float32 and
    rounded once (the float32 reference) passes though it differs from eager, one that matches
    neither is wrong."""
    def chain(x):  # eager: three kernels, each rounding to bf16
        return (x * 1.001 + 0.3) * 3.7

    x = torch.linspace(-4, 4, 400, dtype=torch.bfloat16)
    program = lambda t: chain(t)  # noqa: E731
    expected = (chain(x), [x])
    wide = float_reference(program, [x.clone()], expected, torch.bfloat16)
    assert wide is not None and wide[0].dtype == torch.bfloat16 and wide[1][0].dtype == torch.bfloat16
    assert not torch.equal(wide[0], expected[0])  # the roundings differ somewhere ...
    assert compare(wide[0], expected[0], 0, 0) is not None
    assert float_reference(program, [x.float()], (chain(x.float()), [x.float()]), torch.float32) is None

    real_compile = wrapgen.compile

    class Computes:
        def __init__(self, compiled, fn):
            self.program, self.fn = compiled.program, fn

        def __call__(self, *args):
            return self.fn(*args)

    _, sample = _samples("mul", "cpu", "bfloat16")[0]
    exact = lambda a, b: (a.float() * b.float()).to(torch.bfloat16)  # noqa: E731
    for fn, cls in ((exact, (PASS, FALLBACK)), (lambda a, b: exact(a, b) * 1.1, (WRONG,))):
        monkeypatch.setattr(wrapgen, "compile", lambda *a, _fn=fn, **k: Computes(real_compile(*a, **k), _fn))
        outcome = run_sample("mul", sample, MODE_BY_NAME["static"], ["python"], "cpu", dtype=torch.bfloat16)["python"]
        assert outcome.cls in cls, outcome
    assert "float32 reference" in outcome.reason


def test_known_failures_by_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import known_failures

    monkeypatch.setitem(known_failures.HALF_FAILURES, "abs", known_failures.Known("half only", dtypes=("float16",)))
    assert verdict("abs", "static", "python", "cpu", {0: CRASH}, [0], "float16")[0] == "known"
    assert verdict("abs", "static", "python", "cpu", {}, [0], "float16")[0] == "stale"
    assert verdict("abs", "static", "python", "cpu", {0: CRASH}, [0], "bfloat16")[0] == "unexpected"
    assert verdict("abs", "static", "python", "cpu", {0: CRASH}, [0])[0] == "unexpected"
    # an entry of KNOWN_FAILURES covers every dtype unless it names some
    key = next(k for k, e in KNOWN_FAILURES.items() if e.dtypes is None and e.samples is None)
    entry = KNOWN_FAILURES[key]
    for dtype in DTYPES:
        assert known_failure(key, entry.modes[0], (entry.targets or ("python",))[0], "cpu", None, dtype) is entry


def test_half_journals_report_per_dtype(tmp_path) -> None:
    """One report per device x target x dtype: float32 keeps its file name, bf16 gets its own,
    and results, finished ops and plans of one dtype never count for another."""
    info = {"date": "d", "machine": "m", "cuda": {}, "versions": "v", "targets": ["python"], "devices": ["cpu"],
            "modes": ["static"], "dtypes": ["float32", "bfloat16"], "ops": ["abs", "sin"], "max_samples": 1,
            "jobs": 1, "budget_s": 0, "shard": None,
            "planned": {"cpu": {"abs": ["static"]}, "cpu/bfloat16": {"abs": ["static"], "sin": ["static"]}},
            "command": "python -m tests.conformance.run"}
    lines = [json.dumps({"run": info})]
    for dtype, op, cls in (("float32", "abs", PASS), ("bfloat16", "abs", WRONG)):
        lines.append(json.dumps({"device": "cpu", "target": "python", "op": op, "mode": "static", "index": 0,
                                 "cls": cls, "reason": "", "fallbacks": [], "dtype": dtype}))
        lines.append(json.dumps({"op_done": {"device": "cpu", "op": op, "seconds": 1.0, "dtype": dtype}}))
    lines.append(json.dumps({"end": {"elapsed_s": 3.0, "stopped": "budget"}}))
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    assert run.main(["--from-json", str(tmp_path / "r.jsonl"), "--out", str(tmp_path)]) == 1
    f32 = (tmp_path / "conformance-cpu-python.md").read_text()
    bf16 = (tmp_path / "conformance-cpu-python-bfloat16.md").read_text()
    assert "**Unexpected wrong/crash: 0**" in f32 and "**ops not run: 0**" in f32 and "with float32 support" in f32
    assert "**Unexpected wrong/crash: 1**" in bf16 and "**ops not run: 1**" in bf16 and "`sin`" in bf16
    assert "finished: no: the budget ran out" in bf16  # sin did not run in bf16
    assert "# wrapgen conformance: cpu / python / bfloat16" in bf16 and "float32 reference" in bf16
    assert "## Matched the float32 reference, not eager (0 op-modes)" in bf16 and "Matched the float32" not in f32


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


# -- the full run's budget, shards and partial reports --------------------------------------------


def _journal_lines(planned: dict, shard: list | None, results: list, done: list, end: bool) -> list[str]:
    info = {"date": "d", "machine": "m", "cuda": {}, "versions": "v", "targets": ["python"], "devices": ["cpu"],
            "modes": ["static", "dynamic"], "ops": ["abs", "sin", "cos", "tan"], "max_samples": 1, "jobs": 1, "budget_s": 30.0,
            "shard": shard, "planned": {"cpu": planned}, "command": "python -m tests.conformance.run"}
    lines = [json.dumps({"run": info})]
    lines += [json.dumps({"device": "cpu", "target": "python", "op": op, "mode": mode, "index": 0, "cls": cls,
                          "reason": "", "fallbacks": []}) for op, mode, cls in results]
    lines += [json.dumps({"op_done": {"device": "cpu", "op": op, "seconds": 1.5}}) for op in done]
    if end:
        lines.append(json.dumps({"end": {"elapsed_s": 30.0, "stopped": "budget"}}))
    return lines


def test_a_cut_short_journal_reports_what_did_not_run(tmp_path) -> None:
    """A killed run's journal (no end record, last line half written) still gives a report that
    counts and names the ops that did not run and the ones cut off part way."""
    planned = {op: ["static", "dynamic"] for op in ("abs", "sin", "cos", "tan")}
    lines = _journal_lines(planned, None, [("abs", "static", PASS), ("abs", "dynamic", PASS), ("sin", "static", WRONG)],
                           ["abs"], end=False)
    journal = tmp_path / "killed.jsonl"
    journal.write_text("\n".join(lines) + '\n{"device": "cpu", "targ')
    status = run.main(["--from-json", str(journal), "--out", str(tmp_path)])
    text = (tmp_path / "conformance-cpu-python.md").read_text()
    assert status == 1  # sin's wrong result is unexpected, whatever else did not run
    assert "**ops not run: 2** · ops cut off part way: 1" in text
    assert "## Not run (2 ops)" in text and "`cos`, `tan`" in text
    assert "## Cut off (1 ops)" in text and "`sin`" in text
    assert "journal has no end" in text
    # sin's dynamic mode never ran: "not run" in the dynamic row (sin, cos, tan), static (cos, tan)
    assert "| static | 1 | 0 | 0 | 1 | 0 | 0 | 2 | 4 |" in text
    assert "| dynamic | 1 | 0 | 0 | 0 | 0 | 0 | 3 | 4 |" in text


def test_shards_partition_the_ops_and_merge_back(tmp_path) -> None:
    ops = [f"op{i}" for i in range(7)]
    shards = [schedule.take_shard(ops, i, 3) for i in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(ops) and all(shards)
    assert schedule.parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "1", "a/b"):
        with pytest.raises(ValueError):
            schedule.parse_shard(bad)
    assert schedule.order(["b", "a", "c"], {"a": 5.0, "b": 1.0}) == ["b", "c", "a"]  # unknown c: the median
    paths = []
    for i, part in enumerate((["abs", "sin"], ["cos"]), 1):
        planned = {op: ["static", "dynamic"] for op in part}
        results = [(op, m, PASS) for op in part for m in ("static", "dynamic")]
        paths.append(tmp_path / f"s{i}.jsonl")
        paths[-1].write_text("\n".join(_journal_lines(planned, [i, 2], results, part, end=True)) + "\n")
    assert run.main(["--from-json", *map(str, paths), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "conformance-cpu-python.md").read_text()
    assert "3 OpInfo ops" in text and "merged from 2 shards" in text and "**ops not run: 0**" in text


def test_a_spent_budget_still_writes_the_report(tmp_path) -> None:
    """The real run path, with a budget that is spent before any worker can start: nothing is
    silently dropped, every planned op is reported as not run."""
    argv = ["--devices", "cpu", "--targets", "python", "--ops", "abs", "sin", "cos", "--max-samples", "1",
            "--jobs", "1", "--budget-s", "0.01", "--out", str(tmp_path), "--json", str(tmp_path / "r.jsonl"),
            "--no-progress", "--costs", str(tmp_path / "none.json")]
    assert run.main(argv) == 3  # clean, but incomplete
    text = (tmp_path / "conformance-cpu-python.md").read_text()
    assert "**ops not run: 3**" in text and "`abs`, `cos`, `sin`" in text
    assert "the budget ran out" in text
    assert json.loads((tmp_path / "r.jsonl").read_text().splitlines()[-1])["end"]["stopped"] == "budget"


@pytest.mark.slow
def test_the_budget_stops_real_workers_part_way(tmp_path) -> None:
    """Real workers, killed when the budget runs out: the journal holds every result that
    arrived, the report accounts for every planned op, and no worker outlives the run."""
    ops = sorted(k for k in op_database() if k.startswith(("nn.functional.", "linalg.")))[:40]
    argv = ["--devices", "cpu", "--targets", "python", "--ops", *ops, "--max-samples", "2", "--jobs", "1",
            "--budget-s", "20", "--report-every", "1", "--out", str(tmp_path), "--json", str(tmp_path / "r.jsonl"),
            "--no-progress"]
    started = time.monotonic()
    status = run.main(argv)
    assert time.monotonic() - started < 20 + 5
    journal = load([tmp_path / "r.jsonl"])
    assert journal.ends and journal.ends[0]["stopped"] == "budget"
    not_run, cut_off = journal.unfinished("cpu")
    finished = {op for (_d, op) in journal.done}
    assert status in (1, 3) and not_run + cut_off
    assert sorted([*not_run, *cut_off, *finished]) == sorted(journal.planned("cpu"))
    text = (tmp_path / "conformance-cpu-python.md").read_text()
    assert f"**ops not run: {len(not_run)}** · ops cut off part way: {len(cut_off)}" in text
    leftovers = subprocess.run(["pgrep", "-f", "tests.conformance.worker"], capture_output=True, text=True).stdout
    mine = [pid for pid in leftovers.split() if _parent(int(pid)) == os.getpid()]
    assert not mine, f"workers left running: {mine}"


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
