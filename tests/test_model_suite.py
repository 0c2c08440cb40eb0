"""The model suite (benchmarks/suite): its lists, every transformers model building at the small
size, and a small slice run through both wrapgen entry points and checked against eager."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine, report  # noqa: E402
from benchmarks.report import Report, Result  # noqa: E402
from benchmarks.suite import catalog, huggingface, merge, page, run, vision  # noqa: E402

pytest.importorskip("transformers")


def test_the_suites_hold_the_architectures_the_issue_names() -> None:
    counts = {suite: len(catalog.entries((suite,))) for suite in catalog.SUITES}
    assert counts["huggingface"] >= 20 and counts["timm"] >= 20 and counts["torchvision"] >= 10, counts
    keys = [e.key for e in catalog.entries()]
    assert len(keys) == len(set(keys))
    assert sum(e.trainable for e in catalog.entries()) * 3 >= counts["huggingface"]  # a third trains
    assert [e.key for e in catalog.select("timm,torchvision", "resnet50")] == ["timm/resnet50", "torchvision/resnet50"]
    with pytest.raises(ValueError, match="unknown model"):
        catalog.select(None, "gpt3")
    with pytest.raises(ValueError, match="unknown suite"):
        catalog.select("tensorflow", None)


@pytest.mark.parametrize("model", huggingface.MODELS, ids=lambda m: m.name)
def test_every_transformers_model_builds_small_and_runs_eager(model: huggingface.HFModel) -> None:
    module, inputs = huggingface.build(model, torch.device("cpu"), torch.float32, "small")
    with torch.no_grad():
        out = module(*inputs)
    assert isinstance(out, torch.Tensor) and out.shape[0] == inputs[0].shape[0] and torch.isfinite(out).all()


def test_a_library_that_does_not_import_is_named_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "torchvision_available", lambda: False)
    assert "torchvision does not import" in vision.available("torchvision")
    with pytest.raises(Exception, match="torchvision does not import"):
        vision.build(vision.TORCHVISION[0], torch.device("cpu"), torch.float32, "small")


def test_a_small_slice_passes_through_both_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "torchvision_available", lambda: False)  # the same page on every machine
    written: list[str | None] = []  # each write's partial-page notice: the page after every model, then the last
    write = run.report.write
    monkeypatch.setattr(run.report, "write", lambda r, *a, **k: written.append(r.extra.get("partial")) or write(r, *a, **k))
    paths = run.main(["--device", "cpu", "--models", "gpt2,t5,swin,torchvision/resnet18", "--quick", "--no-progress",
                      "--contenders", "wrapgen[python],wrapgen[cpp],wrapgen-dynamo[python]", "--out-dir", str(tmp_path)])
    md = next(p for p in paths if p.suffix == ".md")
    assert re.fullmatch(r"suite-huggingface-torchvision-fp32-small-gpt2-t5-swin-torchvision-resnet18-cpu-"
                        r"\d{4}-\d{2}-\d{2}-[\w.-]+\.md", md.name), md.name
    results = json.loads(md.with_suffix(".json").read_text())
    rows = {(r["workload"], r["contender"]): r for r in results["results"]}
    assert {w for w, _ in rows} == {"huggingface/gpt2", "huggingface/t5", "huggingface/swin"}
    for (workload, contender), r in rows.items():
        assert r["status"] == "ok", (workload, contender, r["detail"])
    lowering = results["settings"]["lowering"]
    for model, entries in lowering.items():  # both entry points' programs are counted
        assert all(isinstance(entries[e], dict) and entries[e]["kernels"] > 0 for e in ("compile", "dynamo")), model
    text = md.read_text()
    assert "| huggingface | 3 |" in text and "3/3" in text
    assert "torchvision/resnet18: torchvision does not import here" in text
    assert "through torch.compile" in text
    assert written == [f"{n} of 3 workloads measured so far" for n in (1, 2, 3)] + [None]
    assert "a partial page" not in text


def test_a_tensor_built_in_forward_is_no_library_call_through_torch_compile() -> None:
    """torch.compile hands wrapgen `lift_fresh_copy` of a constant the forward builds from Python
    data: it fuses as a clone, so both entry points run the same library calls."""
    from benchmarks.model_lowering import count

    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 1.0

    x = torch.randn(3, 4)
    with run.recorded_programs() as programs:
        compiled = torch.compile(Scaled(), backend="wrapgen", options={"target": "python"})
        torch.testing.assert_close(compiled(x), Scaled()(x))
    counts = [count(p) for p in programs]
    assert counts and all(not c.extern for c in counts), [c.by_op() for c in counts]


def _run(dtype: str, models: list[str], info: machine.MachineInfo, out: Path) -> Path:
    results = [Result(f"huggingface/{m}", c, "ok", median_s=t) for m in models
               for c, t in (("eager", 2e-3), ("torch.compile", 1e-3), ("wrapgen[python]", 5e-4))]
    run_report = Report(info=info, profile="small", plan={"repeats": 3, "warmup": 1, "min_sample_s": 1e-3, "max_calls": 10}, copy_bandwidth=None, copy_buffer_bytes=0,
                        workloads={f"huggingface/{m}": "small" for m in models}, results=results, elapsed_s=60.0,
                        extra={"dtype": dtype, "size": "small", "suites": {f"huggingface/{m}": "huggingface" for m in models},
                               "command": f"python -m benchmarks.suite --dtype {dtype}"})
    return next(p for p in report.write(run_report, out, f"run-{dtype}-{models[0]}") if p.suffix == ".json")


def test_runs_of_two_dtypes_merge_into_one_page(tmp_path: Path) -> None:
    info = machine.collect("cpu")
    slices = [_run("bf16", ["gpt2"], info, tmp_path), _run("bf16", ["bert"], info, tmp_path),
              _run("fp32", ["gpt2"], info, tmp_path)]
    paths = merge.main([str(p) for p in slices] + ["--out-dir", str(tmp_path / "page")])
    md = next(p for p in paths if p.suffix == ".md")
    assert md.name.startswith("suite-huggingface-bf16-fp32-small-cpu-"), md.name
    text = md.read_text()
    assert "| huggingface (bf16) | 2 |" in text and "| huggingface (fp32) | 1 |" in text
    assert "huggingface/gpt2 @fp32" in text and "2.00x" in text and "2.0 min" not in text and "3.0 min" in text
    other = dataclasses.replace(info, wrapgen_commit="0000000")
    with pytest.raises(SystemExit):  # a run of another commit is refused
        merge.main([str(slices[0]), str(_run("fp32", ["t5"], other, tmp_path)), "--out-dir", str(tmp_path)])


def test_runs_of_different_code_merge_with_mixed_code(tmp_path: Path) -> None:
    """--mixed-code joins runs of two commits; a model rerun later keeps only its later rows, and
    the page names the code each model ran."""
    info = machine.collect("cpu")
    old, new = (dataclasses.replace(info, wrapgen_commit=c) for c in ("1111111", "2222222"))
    first = _run("bf16", ["gpt2", "bert"], old, tmp_path)
    rerun = json.loads(first.read_text())
    second = _run("bf16", ["gpt2"], new, tmp_path / "rerun")
    fixed = json.loads(second.read_text())
    for row in fixed["results"]:
        if row["contender"] == "wrapgen[python]":
            row["median_s"] = 2.5e-4  # the rerun after a fix
    second.write_text(json.dumps(fixed))
    paths = merge.main([str(first), str(second), "--mixed-code", "--out-dir", str(tmp_path / "page")])
    md = next(p for p in paths if p.suffix == ".md")
    assert md.name.endswith("-2222222.md"), md.name  # named after the latest code
    assert "-training" not in md.name  # no training step among them
    merged = json.loads(md.with_suffix(".json").read_text())
    gpt2 = [r for r in merged["results"] if r["workload"] == "huggingface/gpt2"]
    assert len(gpt2) == 3 and {r["median_s"] for r in gpt2 if r["contender"] == "wrapgen[python]"} == {2.5e-4}
    assert merged["settings"]["code"] == {"huggingface/gpt2": "2222222", "huggingface/bert": "1111111"}
    text = md.read_text()
    assert "## Code per model" in text and "- `1111111`: huggingface/bert" in text
    assert len(rerun["results"]) == 6


def test_a_merged_page_with_training_steps_says_so_in_its_name(tmp_path: Path) -> None:
    info = machine.collect("cpu")
    inference, steps = _run("fp32", ["gpt2"], info, tmp_path), _run("fp32", ["gpt2-train"], info, tmp_path / "steps")
    paths = merge.main([str(inference), str(steps), "--out-dir", str(tmp_path / "page")])
    md = next(p for p in paths if p.suffix == ".md")
    assert md.name.startswith("suite-huggingface-fp32-small-training-cpu-")
    groups = [line.split(" | ")[0] for line in md.read_text().splitlines() if line.startswith("| huggingface")]
    assert "| huggingface training" in groups and "| huggingface" in groups  # a step's own geomean


def test_a_training_step_runs_once_per_target() -> None:
    """wrapgen[t] trains through torch.compile(backend="wrapgen"): beside it, wrapgen-dynamo[t]
    would time the same compiled step again, so it keeps its inference rows only."""
    chosen = {c.name: c for c in run.contenders("cpu", "wrapgen[python],wrapgen-dynamo[python],wrapgen-dynamo[cpp]")}
    assert chosen["wrapgen[python]"].train_build is not None
    assert chosen["wrapgen-dynamo[python]"].train_build is None  # the same step as wrapgen[python]'s
    assert chosen["wrapgen-dynamo[cpp]"].train_build is not None  # wrapgen[cpp] is not in the run
    assert chosen["wrapgen-dynamo[python]"].build is not None


def test_training_only_leaves_out_the_inference_rows() -> None:
    """`--training-only` measures the steps alone: their models' inference rows come from other runs."""
    gpt2 = catalog.select(None, "gpt2,bert")
    both = [w.name for w in catalog.workloads(gpt2, "small", "fp32", training=True)]
    steps = [w.name for w in catalog.workloads(gpt2, "small", "fp32", training=True, inference=False)]
    assert both == ["huggingface/gpt2", "huggingface/gpt2-train", "huggingface/bert"]
    assert steps == ["huggingface/gpt2-train"]
    args = run.parse_args(["--device", "cpu", "--models", "gpt2", "--training-only"])
    assert args.training and args.training_only and run.suite_name(args) == "suite-huggingface-fp32-small-training-gpt2"


def test_a_training_step_groups_apart_on_a_page_of_two_dtypes() -> None:
    """Rows named `<model>-train @<dtype>` (a merged page of two dtypes) group as that suite's
    training in that dtype, not with its inference rows nor untagged."""
    merged = Report(info=machine.collect("cpu"), profile="full", plan={}, copy_bandwidth=None, copy_buffer_bytes=0,
                    workloads={}, results=[], extra={"suites": {"huggingface/gpt2 @bf16": "huggingface (bf16)"}})
    assert page._suite_of(merged, "huggingface/gpt2 @bf16") == "huggingface (bf16)"
    assert page._suite_of(merged, "huggingface/gpt2-train @bf16") == "huggingface training (bf16)"
    assert page._suite_of(merged, "huggingface/opt-train") == "huggingface training"
