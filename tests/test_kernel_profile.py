"""benchmarks.kernel_profile on CPU: a tiny transformer block and a small optimizer step, profiled per contender."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import kernel_profile


def _check_row(row: dict) -> None:
    assert row["status"] == "ok", row
    for key in ("wall_ms", "host_us", "kernel_us", "kernels"):
        assert row[key] > 0, (key, row)
    assert row["library_calls"] >= 0  # a compiled optimizer step may leave none
    assert len(row["round_ms"]) == 2 and all(t > 0 for t in row["round_ms"])
    assert row["top"] and all(k["name"] and k["calls"] > 0 and k["us"] > 0 for k in row["top"])
    assert row["first_step_peak_mib"] is None and row["warm_step_peak_mib"] is None  # CUDA only


def test_model_on_cpu_writes_its_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WRAPGEN_CONSTANT_MASKS", "0")  # listed on the page (read at import: no effect here)
    payload = kernel_profile.main(["--model", "block_b1_t16", "--size", "quick", "--device", "cpu", "--steps", "2",
                                   "--rounds", "2", "--warmup", "1", "--top", "3", "--contenders", "wrapgen-python",
                                   "--tag", "ab", "--out-dir", str(tmp_path)])
    rows = payload["results"]
    assert list(rows) == ["eager", "wrapgen[python]"]
    for row in rows.values():
        _check_row(row)
    wrapgen = rows["wrapgen[python]"]
    assert wrapgen["generated_visible"]
    assert any(k["name"].startswith("cpp_") for k in wrapgen["top"])  # generated C++ kernels seen on CPU
    assert wrapgen["kernels"] > wrapgen["library_calls"]
    md = list(tmp_path.glob("kernel-profile-block-b1-t16-quick-fp32-ab-cpu-*.md"))
    raw = list(tmp_path.glob("kernel-profile-block-b1-t16-quick-fp32-ab-cpu-*.json"))
    assert len(md) == 1 and len(raw) == 1
    text = md[0].read_text()
    assert "| contender | ms/step |" in text and "top 3 kernels" in text and "WRAPGEN_CONSTANT_MASKS=0" in text
    saved = json.loads(raw[0].read_text())
    assert saved["environment"]["WRAPGEN_CONSTANT_MASKS"] == "0"
    assert set(saved["results"]) == set(rows)


def test_optimizer_step_on_cpu() -> None:
    payload = kernel_profile.main(["--optimizer", "sgd", "--device", "cpu", "--steps", "2", "--rounds", "2",
                                   "--warmup", "1", "--contenders", "wrapgen[python]"])
    rows = payload["results"]
    assert list(rows) == ["eager[foreach]", "wrapgen[python]"]
    for row in rows.values():
        _check_row(row)
    assert rows["eager[foreach]"]["library_calls"] > 0  # the foreach ops


def test_a_model_of_the_suite_by_its_row_name() -> None:
    payload = kernel_profile.main(["--model", "huggingface/opt", "--device", "cpu", "--steps", "2", "--rounds", "2",
                                   "--warmup", "1", "--top", "3", "--contenders", "wrapgen[python],wrapgen-dynamo[python]"])
    rows = payload["results"]
    assert list(rows) == ["eager", "wrapgen[python]", "wrapgen-dynamo[python]"]  # both entry points
    for row in rows.values():
        _check_row(row)


def test_an_unknown_suite_model_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="no_such_model"):
        kernel_profile.main(["--model", "huggingface/no_such_model", "--device", "cpu"])
