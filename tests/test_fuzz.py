"""The fuzzer: deterministic programs, a short fixed-seed slice through the targets (part of
`make test`), and a broken target caught, shrunk and written out as a runnable reproducer."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from dataclasses import replace

import pytest
import torch

from wrapgen.backends import InterpretEmitter, register_backend
from wrapgen.backends.registry import _BACKENDS
from wrapgen.fuzz import fuzz, generate
from wrapgen.fuzz.__main__ import main
from wrapgen.fuzz.generator import acceptable, make_inputs, run_eagerly
from wrapgen.fuzz.reproducer import reproducer_source
from wrapgen.fuzz.runner import Outcome, Variant
from wrapgen.fuzz.shrinker import shrink


def test_programs_are_deterministic_per_seed():
    assert [generate(3, i) for i in range(4)] == [generate(3, i) for i in range(4)]
    assert generate(3, 0).source() != generate(4, 0).source()


def test_generated_programs_run_eagerly_at_both_sizes():
    for index in range(12):
        program = generate(0, index)
        assert program.statements and program.outputs
        for which in (0, 1):
            values = run_eagerly(program, which)
            assert all(acceptable(values[name]) for name in program.outputs)
        sizes = [dict(s) for s in program.sizes]
        assert all(sizes[0][d] != sizes[1][d] for d in sizes[0]), "a dynamic program is called at new sizes"


def test_fuzz_slice():
    """A few fixed-seed programs through python, fx and the sanitized interpreter, every
    memory-planning mode: no mismatch."""
    report = fuzz(seconds=120, seed=0, programs=3, targets=["python", "fx", "interpret"], log=None)
    assert report.programs == 3
    assert report.findings == [], [f.reproducer.read_text() for f in report.findings]


class OffByOne(InterpretEmitter):
    """A wrong target: its first floating-point result is off by one."""

    def emit_output(self, line):
        super().emit_output(line)
        values = list(self.result)
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                values[i] = v + 1
                break
        self.result = tuple(values)


@pytest.fixture
def broken_target():
    register_backend("fuzz_off_by_one", OffByOne)
    yield "fuzz_off_by_one"
    _BACKENDS.pop("fuzz_off_by_one", None)


def test_a_wrong_target_is_caught_shrunk_and_reproduced(broken_target, tmp_path):
    report = fuzz(seconds=120, seed=0, programs=1, targets=[broken_target], out_dir=tmp_path, shrink_seconds=30, log=None)
    assert report.programs == 1 and len(report.findings) == 1
    finding = report.findings[0]
    assert {o.variant.label for o in finding.outcomes} == {f"{broken_target}/{m}" for m in ("none", "reuse", "pooled")}
    assert all(o.kind == "wrong" for o in finding.outcomes)
    assert len(finding.shrunk.statements) <= 1 < len(finding.program.statements)
    assert len(finding.shrunk.outputs) == 1 and not finding.shrunk.dynamic
    source = finding.reproducer.read_text()
    assert finding.reproducer.parent == tmp_path and f"'{broken_target}'" in source
    namespace: dict = {"__name__": "reproducer"}
    exec(compile(source, str(finding.reproducer), "exec"), namespace)
    with pytest.raises(AssertionError):
        namespace["main"]()  # the reproducer fails while the target is broken ...
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(namespace, "TARGET", "interpret")
        namespace["main"]()  # ... and passes on a correct one


def test_reproducer_inputs_are_the_fuzzers():
    program = generate(0, 2)
    source = reproducer_source(program, Outcome(Variant("python", "none"), "wrong", 'says """ and \\'), "r.py")
    ast.parse(source)
    namespace: dict = {"__name__": "reproducer"}
    exec(source, namespace)
    for which in (0, 1):
        theirs = namespace["make_inputs"](dict(program.sizes[which]), 1)
        torch.testing.assert_close(theirs, make_inputs(program.inputs, dict(program.sizes[which]), 1), rtol=0, atol=0)


def test_shrinker_keeps_what_fails():
    """Shrinking with a made-up failure (the program computes a softmax) keeps just that statement."""
    program = next(p for p in (generate(1, i) for i in range(50)) if len(p.statements) >= 5 and "softmax" in p.source())

    def fails(candidate) -> bool:
        try:
            run_eagerly(candidate, 0), run_eagerly(candidate, 1)
        except Exception:  # noqa: BLE001
            return False
        return "softmax" in candidate.source()

    shrunk = shrink(replace(program, dynamic=True), fails, seconds=30)
    assert "softmax" in shrunk.source() and len(shrunk.statements) == 1 and not shrunk.dynamic


def test_cli_prints_the_summary_last(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(["--seconds", "120", "--programs", "1", "--targets", "interpret", "--out", str(tmp_path)])
    assert status == 0
    assert re.fullmatch(r"1 programs, 0 mismatches", out.getvalue().strip().splitlines()[-1])


def test_fuzz_finding_cached_bf16_upcast_in_a_row_reduction():
    """Found by `python -m wrapgen.fuzz --seed 2` (program 125, shrunk): the C++ row cache kept the
    bf16-rounded cos for log_softmax's later passes, but the pass computing it never stored it (the
    cached node is an upcast, which codegen emits as no code), so they read uninitialized memory."""
    import wrapgen

    def program(x1):
        return (torch.log_softmax(torch.cos(x1).to(torch.bfloat16), 1),)

    x = torch.randn(3, 2)
    compiled = wrapgen.compile(program, (x,))
    torch.testing.assert_close(compiled(x), program(x), rtol=5e-2, atol=5e-2)


def test_fuzz_finding_pooled_offset_with_a_fraction():
    """Found by `python -m wrapgen.fuzz --seed 3` (program 96, shrunk): a pooled bf16 buffer's offset
    in elements, `Max(...)/2`, printed as a float in the python target (as_strided refused it)."""
    import wrapgen

    def program(x1):
        v4 = x1[..., :-1]
        return (torch.softmax(torch.where(v4 > 0, v4, v4 * 0.1), 1),)

    with wrapgen.config.patch(kernels=False, memory_planning="pooled"):
        compiled = wrapgen.compile(program, (torch.randn(3, 3).to(torch.bfloat16).mT,), dynamic=True, target="python")
    y = torch.randn(4, 5).to(torch.bfloat16).mT
    torch.testing.assert_close(compiled(y), program(y))
