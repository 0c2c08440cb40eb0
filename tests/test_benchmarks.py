"""The benchmark harness in --quick mode: it writes its files, and a contender that raises or
computes a wrong answer (or wrong gradients) is reported as such while the run goes on; the
real-model suite's small configs build and run. Nothing here is about speed."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level package of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    contenders,
    harness,
    measure,
    model_lowering,
    model_report,
    model_suite,
    models,
    run,
    training,
    workloads,
)
from benchmarks.contenders import Contender  # noqa: E402
from benchmarks.report import Report, Result  # noqa: E402

# `<suite>-<device>-<YYYY-MM-DD>-<machine>-<commit>` (benchmarks/results/README.md)
RESULT_NAME = r"(?P<suite>[a-z0-9.-]+)-(?P<device>cpu|cuda)-(?P<date>\d{4}-\d{2}-\d{2})-(?P<machine>[A-Za-z0-9.-]+?)-(?P<commit>[0-9a-f]{7,}(-dirty)?|nocommit)"


def _named(path: Path, suite: str, device: str = "cpu") -> None:
    """`path` is named by the results scheme, for `suite` on `device`, today, on this host."""
    import datetime
    import re
    import socket

    match = re.fullmatch(RESULT_NAME, path.stem)
    assert match, path.name
    assert match["suite"] == suite and match["device"] == device, path.name
    assert match["date"] == datetime.date.today().isoformat(), path.name
    assert device != "cpu" or match["machine"] == re.sub(r"[^A-Za-z0-9.]+", "-", socket.gethostname()).strip("-")
    assert "session" not in path.name and not re.search(r"-s\d+(-|$)", path.stem), path.name

BUILDS_THAT_RAISED: list[str] = []


def _raises_at_build(model, inputs):
    BUILDS_THAT_RAISED.append(type(model).__name__)
    raise RuntimeError("broken at build")


def _raises_at_call(model, inputs):
    def call(*args):
        raise ValueError("broken at call")

    return call


def _wrong(model, inputs):
    def call(*args):
        out = model(*args)
        return out + 1.0

    return call


BROKEN = [
    Contender("broken_build", _raises_at_build),
    Contender("broken_call", _raises_at_call),
    Contender("wrong_answer", _wrong),
]


def test_quick_run_writes_files_and_reports_failures(tmp_path: Path) -> None:
    argv = [
        "--device=cpu",
        "--quick",
        "--workloads=softmax,tiny_chain_50",
        "--contenders=wrapgen",
        "--repeats=1",
        "--rounds=2",
        f"--out-dir={tmp_path}",
        "--no-progress",
    ]
    BUILDS_THAT_RAISED.clear()
    paths = run.main(argv, extra_contenders=BROKEN)
    assert len(BUILDS_THAT_RAISED) == 2  # once per workload: a failed contender is not retried next round

    assert sorted(p.suffix for p in paths) == [".json", ".md", ".png"]
    for path in paths:
        assert path.exists() and path.stat().st_size > 0
        _named(path, "micro-softmax-tiny-chain-50-quick")  # the workloads of a subset run are in the name

    raw = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    status = {(r["workload"], r["contender"]): r for r in raw["results"]}
    for workload in ("softmax", "tiny_chain_50"):
        assert status[workload, "eager"]["status"] == "ok"
        assert status[workload, "wrapgen[python]"]["status"] == "ok"
        assert status[workload, "broken_build"]["status"] == "error"
        assert "broken at build" in status[workload, "broken_build"]["detail"]
        assert status[workload, "broken_call"]["status"] == "error"
        assert status[workload, "wrong_answer"]["status"] == "wrong"
        assert status[workload, "wrong_answer"]["median_s"] is None  # failures are not timed
        assert status[workload, "broken_call"]["detail"].startswith("round 1 of 2: ")
        assert len(status[workload, "wrapgen[python]"]["round_times"]) == 2  # contenders took turns twice
    assert status["softmax", "eager"]["copy_bw_fraction"] is not None  # memory-bound workload
    assert status["tiny_chain_50", "eager"]["copy_bw_fraction"] is None

    markdown = next(p for p in paths if p.suffix == ".md").read_text()
    assert "| softmax | broken_build | ERROR" in markdown
    assert "| tiny_chain_50 | wrong_answer | WRONG" in markdown
    assert f"| torch | {torch.__version__} |" in markdown


def test_rounds_combine_into_medians_and_keep_failures() -> None:
    def cell(status: str, seconds: float | None = None, compile_s: float | None = None, peak: int | None = None):
        return Result("softmax", "wrapgen[python]", status, "boom" if status != "ok" else "", seconds, compile_s, peak)

    combined = harness.combine_rounds([cell("ok", 3.0, 1.0, 10), cell("ok", 1.0, 5.0, 30), cell("ok", 2.0, 2.0, 20)])
    assert (combined.median_s, combined.compile_s, combined.peak_bytes) == (2.0, 2.0, 30)
    assert combined.round_times == [3.0, 1.0, 2.0]
    assert Report.spread(combined) == 0.5
    low, high = cell("ok", 1.0, 1.0, 10), cell("ok", 1.0, 1.0, 30)
    low.base_bytes, high.base_bytes, low.error, high.error = 5, 7, 1e-6, 1e-7
    low.requested_peak_above, high.requested_peak_above = 21, 18
    combined = harness.combine_rounds([low, high])  # the peak round's baseline, the worst error
    assert (combined.base_bytes, model_report.peak_above_inputs(combined), combined.error) == (7, 23, 1e-6)
    assert combined.requested_peak_above == 21  # the largest of any round, whichever round peaked
    failed = harness.combine_rounds([cell("ok", 1.0), cell("wrong")])
    assert failed.status == "wrong" and failed.detail == "round 2 of 2: boom"


def test_selection_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.select("softmax,nope")
    with pytest.raises(ValueError, match="unknown contender"):
        contenders.select(contenders.default_contenders("cpu"), "nope")
    names = [c.name for c in contenders.select(contenders.default_contenders("cpu"), "wrapgen")]
    assert names[0] == "eager" and all(n.startswith("wrapgen[") for n in names[1:])


def test_every_workload_has_every_profile() -> None:
    for workload in workloads.WORKLOADS.values():
        assert set(workload.sizes) == set(workloads.PROFILES), workload.name


# -- the real-model suite --------------------------------------------------------------------------

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[models]'; `make test` installs it)",
)


def _vision_impls() -> list[str]:
    return ["transformers"] + (["torchvision"] if models.torchvision_available() else [])


def _family_cases() -> list:
    cases = []
    for family in models.FAMILIES.values():
        for impl in _vision_impls() if family.vision else ["auto"]:
            cases.append(pytest.param(family.name, impl, id=f"{family.name}-{impl}" if family.vision else family.name))
    return cases


@needs_transformers
@pytest.mark.parametrize("name,impl", _family_cases())
def test_small_model_builds_and_runs_a_forward_quickly(name: str, impl: str) -> None:
    family = models.FAMILIES[name]
    start = time.perf_counter()
    model, inputs = family.build("cpu", "small", torch.float32, impl)
    with torch.no_grad():
        out = model(*inputs)
    seconds = time.perf_counter() - start
    assert not model.training
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and torch.isfinite(out).all()
    size = family.sizes["small"]
    assert out.shape[0] == size["batch"]
    if "tokens" in size:
        assert inputs[0].shape == (size["batch"], size["tokens"]) and inputs[0].dtype == torch.int64
    else:
        assert inputs[0].shape == (size["batch"], 3, size["image"], size["image"]) and out.shape[-1] == 1000
    assert seconds < 20, f"{name}: building and running the small config took {seconds:.1f} s"


@needs_transformers
def test_small_llama_uses_grouped_query_attention_and_bf16_casts() -> None:
    model, _ = models.FAMILIES["llama"].build("cpu", "small", torch.bfloat16)
    config = model.model.config
    assert config.num_key_value_heads < config.num_attention_heads
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@needs_transformers
def test_training_step_returns_loss_and_every_gradient() -> None:
    lm, inputs = models.FAMILIES["gpt2"].build("cpu", "small")
    step = training.TrainingStep(models.LanguageModelLoss(lm))
    loss, grads = step(*inputs)
    params = [p for p in step.parameters() if p.requires_grad]
    assert loss.ndim == 0 and len(grads) == len(params) and all(g is not None for g in grads)
    assert all(p.grad is None for p in params)  # taken off: the next contender starts clean
    compiled = training.compiled_step(step, lambda module, _: module, inputs)  # the identity "compiler"
    torch.testing.assert_close(compiled(*inputs), (loss, grads))
    with pytest.raises(ValueError, match="no training build"):
        training.compiled_step(step, None, inputs)


def _scaled_loss(module, inputs):
    return lambda *args: module(*args) * 1.01


WRONG_TRAINER = Contender("wrong_gradients", _wrong, train_build=_scaled_loss)


@needs_transformers
def test_quick_model_run_checks_outputs_and_gradients(tmp_path: Path) -> None:
    argv = ["--device=cpu", "--models=gpt2", "--quick", "--contenders=wrapgen[python]", "--repeats=1",
            f"--out-dir={tmp_path}", "--no-progress"]
    paths = run.main(argv, extra_contenders=[WRONG_TRAINER, BROKEN[1]])
    assert sorted(p.suffix for p in paths) == [".json", ".md", ".png"]
    assert all(p.stat().st_size > 0 for p in paths)
    for path in paths:
        _named(path, "models-fp32-gpt2-quick")
    raw = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    assert raw["settings"]["dtype"] == "fp32" and raw["settings"]["size"] == "small"
    status = {(r["workload"], r["contender"]): r for r in raw["results"]}
    for workload in ("gpt2", "gpt2-train"):
        for contender in ("eager", "wrapgen[python]"):
            assert status[workload, contender]["status"] == "ok", status[workload, contender]["detail"]
        assert status[workload, "wrapgen[python]"]["error"] < 1e-3
        assert status[workload, "wrong_gradients"]["status"] == "wrong"
    assert ("gpt2-train", "broken_call") not in status  # no train_build: not a training contender
    assert status["gpt2", "broken_call"]["status"] == "error"
    markdown = next(p for p in paths if p.suffix == ".md").read_text()
    assert "| gpt2-train | wrapgen[python] | ok |" in markdown and "peak above inputs" in markdown


def test_scaled_tolerance_follows_each_output_scale() -> None:
    big, small = torch.full((4,), 1000.0), torch.full((4,), 1e-3)
    off = 0.5  # 5e-4 of the big tensor's scale, 500x the small one's values
    assert measure.check_close((big + off, small), (big, small), rtol=0, atol=1e-3, scaled=True) is None
    assert measure.check_close((big, small + off), (big, small), rtol=0, atol=1e-3, scaled=True) is not None
    assert measure.check_close((big + off, small), (big, small), rtol=0, atol=1e-3) is not None
    assert measure.relative_error((big + off, small), (big, small)) == pytest.approx(5e-4)


@needs_transformers
def test_lowering_report_counts_kernels_and_library_calls() -> None:
    counts = model_lowering.lower_family(models.FAMILIES["bert"], "cpu", "small", torch.float32)
    assert counts.kernels > 0 and counts.launches >= counts.kernels and counts.extern_lines > 0
    assert model_lowering.op_name("aten::addmm.out") == "addmm"
    assert model_lowering.op_name("quantized::linear.default") == "quantized::linear"
    text = model_lowering.report([models.FAMILIES["bert"]], "cpu", "small", "fp32")
    assert text.count("\n| bert |") == 1 and "ERROR" not in text


def test_model_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--dtype=bf16"])  # a model option without --models
    with pytest.raises(SystemExit):
        run.parse_args(["--models=gpt2,nope"])
    with pytest.raises(SystemExit):
        run.parse_args(["--models=gpt2", "--tasks=inference,sleeping"])
    args = run.parse_args(["--device=cpu", "--models=all", "--dtype=bf16", "--size=full", "--threads=1"])
    assert model_suite.suite_name(args, "full") == "models-bf16-full-threads1"  # full is not the CPU's default
    args = run.parse_args(["--device=cpu", "--models=gpt2,llama", "--tasks=inference", "--size=b1x32"])
    assert model_suite.suite_name(args, "b1x32") == "models-fp32-b1x32-gpt2-llama-inference"
    args = run.parse_args(["--device=cpu", "--models=gpt2,llama,bert,resnet50,vit_b16", "--dtype=bf16"])
    assert model_suite.suite_name(args, "small") == "models-bf16"  # every model, both tasks, the default size
    names = [c.name for c in model_suite.model_contenders("cpu", None)]
    assert names[:2] == ["eager", "torch.compile"] and "wrapgen[python]" in names and "wrapgen[python+pooled]" not in names
    workloads_ = model_suite.model_workloads(models.select("gpt2,bert"), "small", "bf16")
    assert [w.name for w in workloads_] == ["gpt2", "gpt2-train", "bert"]
    assert workloads_[1].training and all(w.atol_scaled for w in workloads_)
    assert [w.rtol for w in workloads_] == [5e-2, 1e-1, 5e-2]


def test_interleaved_rounds_rotate_the_order_and_time_every_contender() -> None:
    from benchmarks import interleaved

    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    times = interleaved.interleave(calls, "cpu", rounds=4, per_batch=2)
    assert {name: len(values) for name, values in times.items()} == {"a": 4, "b": 4, "c": 4}
    firsts = order[::6]  # each round is 3 batches of 2 calls
    assert firsts == ["a", "b", "c", "a"]
    text = interleaved.table({"gpt2": {"torch.compile": [0.002, 0.004, 0.003], "wrapgen[python]": [0.0015, 0.0015]}})
    assert "| gpt2 | torch.compile | 3.00 | 2.00 - 4.00 | — |" in text
    assert "| gpt2 | wrapgen[python] | 1.50 | 1.50 - 1.50 | 2.000x |" in text
    header = interleaved.provenance("cpu", ["--models", "gpt2", "--rounds", "4"])
    assert torch.__version__ in header and "commit" in header
    assert "`python -m benchmarks.interleaved --models gpt2 --rounds 4`" in header


def test_a_dirty_checkout_is_named_by_the_tree_that_ran(tmp_path: Path) -> None:
    """A result file names a modified checkout by its working tree's hash, which equals the tree
    of the commit that later holds those files."""
    import shutil
    import subprocess

    from benchmarks import machine

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("one\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    (tmp_path / "a.py").write_text("two\n")
    (tmp_path / "b.py").write_text("new\n")
    running = machine._working_tree(tmp_path)
    git("add", "-A")
    git("commit", "-qm", "two")
    assert running == git("rev-parse", "HEAD^{tree}")[:12]


# -- optimizer steps and greedy decode (benchmarks.optimizer, benchmarks.decode) -------------------


def _results(paths: list[Path], suite: str) -> tuple[dict, str]:
    assert sorted(p.suffix for p in paths) == [".json", ".md"]
    assert all(p.stat().st_size > 0 for p in paths)
    for path in paths:
        _named(path, suite)
    raw = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
    return raw, next(p for p in paths if p.suffix == ".md").read_text()


def test_optimizer_benchmark_checks_and_times_every_contender(tmp_path: Path) -> None:
    from benchmarks import optimizer

    argv = ["--device=cpu", "--optimizers=adamw,sgd", "--contenders=eager[foreach],wrapgen[python]", "--rounds=1",
            "--steps=2", "--check-steps=2", "--warmup=0", f"--out-dir={tmp_path}"]
    raw, markdown = _results(optimizer.main(argv), "optimizer-small")
    assert raw["settings"]["parameter_set"] == "small" and raw["settings"]["tensors"] == 40
    assert 2e6 <= raw["settings"]["parameters"] <= 4e6
    rows = {(r["case"], r["contender"]): r for r in raw["results"]}
    assert set(rows) == {(o, c) for o in ("adamw", "sgd") for c in ("eager[foreach]", "wrapgen[python]")}
    for (case, contender), row in rows.items():
        assert row["check"] in ("ok", "mismatch", "error"), row  # checked, whatever wrapgen does today
        assert row["status"] == "ok" or row["detail"], row  # a failure says why
        assert f"| {case} | {contender} | {row['status']} |" in markdown
    assert rows["adamw", "eager[foreach]"]["check"] == "ok" and len(rows["adamw", "eager[foreach]"]["round_times"]) == 1
    assert "| optimizer | contender | status | µs/step (median) |" in markdown and "| check |" in markdown


def test_aot_package_benchmark_checks_and_times_wrapgen_and_aotinductor(tmp_path: Path) -> None:
    from benchmarks import aot_packages

    argv = ["--models=mlp", "--rounds=2", "--calls=5", "--cpp", "--cpp-calls=50", f"--out-dir={tmp_path}"]
    raw, markdown = _results(aot_packages.main(argv), "aot-packages")
    cells = {c["contender"]: c for c in raw["results"]}
    assert set(cells) == {"wrapgen", "wrapgen[arrayref]", "AOTInductor"}
    for name, cell in cells.items():
        assert cell["status"] == "ok", cell  # built, loaded, outputs equal to eager's
        assert len(cell["round_us"]) == 2 and cell["median_us"] > 0 and cell["package_bytes"] > 0
        assert f"| mlp | {name} | ok |" in markdown
    assert "| model | contender | status | µs per call (median) |" in markdown
    # from C++: the example ran both entries on the array-ref package (and found them equal)
    (row,) = raw["cpp"]
    assert row["model"] == "mlp" and row["handle_us"] > 0 and row["arrayref_us"] > 0
    assert f"| mlp | {row['handle_us']:.2f} | {row['arrayref_us']:.2f} |" in markdown


def test_aot_package_benchmark_marks_a_wrong_package(tmp_path: Path, monkeypatch) -> None:
    """A contender whose outputs differ from eager's is marked wrong and not timed."""
    from benchmarks import aot_packages, arrayref

    real = aot_packages._build

    def off_by_one(contender, model, inputs, path, cell):
        call = real(contender, model, inputs, path, cell)
        return (lambda: call() + 1) if contender == "wrapgen" else call

    monkeypatch.setattr(aot_packages, "_build", off_by_one)
    calls, cells = aot_packages.build_contenders("mlp", *arrayref.build_model("mlp")[:2], tmp_path, ["wrapgen"])
    assert not calls and cells[0].status == "wrong" and cells[0].detail


def test_optimizer_shapes_are_gpt2_small() -> None:
    from benchmarks import optimizer

    shapes = optimizer.gpt2_shapes(**optimizer.PARAMETER_SETS["gpt2"])
    assert len(shapes) == 148 and sum(math.prod(s) for _, s in shapes) == 124_439_808
    with pytest.raises(SystemExit):
        optimizer.parse_args(["--device=cpu", "--optimizers=adam-capturable"])  # CUDA only


def test_optimizer_check_names_the_first_differing_tensor() -> None:
    from benchmarks import optimizer

    case, shapes = optimizer.OPTIMIZERS["sgd"], [("w", (4, 3)), ("b", (3,))]
    values, grads = optimizer.make_tensors(shapes, "cpu")
    contender = optimizer.CONTENDERS[0]
    a, b = (optimizer.build(case, contender, values, grads) for _ in range(2))
    a.step(), b.step()
    assert optimizer.compare(a, b, ["w", "b"])[0] is None
    with torch.no_grad():
        b.params[1][0] += 1.0
    reason, worst = optimizer.compare(a, b, ["w", "b"])
    assert reason is not None and reason.startswith("b: Mismatched elements: 1 / 3") and worst == pytest.approx(1.0)


@needs_transformers
def test_decode_benchmark_checks_tokens_of_every_contender(tmp_path: Path) -> None:
    from benchmarks import decode

    argv = ["--device=cpu", "--contenders=eager,wrapgen[python]", "--rounds=1", "--tokens=2", "--prompt=4",
            f"--out-dir={tmp_path}"]
    raw, markdown = _results(decode.main(argv), "decode-small-fp32")
    assert raw["settings"]["size"] == "small" and raw["settings"]["dtype"] == "fp32"
    rows = {r["contender"]: r for r in raw["results"]}
    assert list(rows) == ["eager", "wrapgen[python]"]
    assert rows["eager"]["status"] == "ok" and rows["eager"]["check"] == "ok"
    assert len(rows["eager"]["round_times"]) == 1 and rows["eager"]["median_s"] > 0
    row = rows["wrapgen[python]"]
    assert row["check"] in ("ok", "mismatch", "error") and (row["status"] == "ok" or row["detail"]), row
    for name, row in rows.items():
        assert f"| {name} | {row['status']} |" in markdown
    assert "| contender | status | ms/token (median) | tokens/s |" in markdown and "| tokens |" in markdown


@needs_transformers
def test_decode_static_cache_and_loop_match_the_full_forward() -> None:
    """The manual loop (a prefill, then one token a step through the StaticCache) gives the logits a
    forward over the whole sequence gives: the cache and calling convention of this transformers work."""
    from benchmarks import decode

    model = decode.build_model("small", "cpu", torch.float32)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        generation = decode.Generation(model, model.forward, prompt, 3, "cpu", torch.float32)
        out: list[torch.Tensor] = []
        first = generation.prefill()
        generation.decode(first, out)
        sequence = torch.cat([prompt, first, *out[:-1]], dim=1)
        full = model(sequence, use_cache=False).logits[0, -4:].argmax(-1)
    assert full.tolist() == [first.item(), *decode.tokens_of(out)]


# -- result file names and the results folder ---------------------------------------------------


def test_result_names_carry_date_machine_and_commit() -> None:
    import dataclasses

    from benchmarks import interleaved, machine

    info = machine.MachineInfo(
        date="2026-11-27", time="18:59:28", device="cuda", hostname="vm", cpu="Intel(R) Xeon(R) Processor", cores=16,
        torch_threads=16, huge_pages="THP madvise; torch THP_MEM_ALLOC_ENABLE off", gpu="NVIDIA H100 80GB HBM3",
        cuda="13.0", python="3.12.3", torch="2.11.0+cu130", triton="3.6.0", wrapgen="0.1.0",
        wrapgen_commit="d44332e")
    assert machine.file_stem(info, "models-bf16-inference") == "models-bf16-inference-cuda-2026-11-27-H100-d44332e"
    dirty = dataclasses.replace(info, wrapgen_commit="d44332e+dirty, tree a7dfbc30eed0")
    assert machine.file_stem(dirty, "micro") == "micro-cuda-2026-11-27-H100-d44332e-dirty"
    assert machine.machine_tag(dataclasses.replace(info, gpu="NVIDIA GeForce RTX 4090")) == "RTX-4090"
    assert machine.machine_tag(dataclasses.replace(info, gpu="NVIDIA A100-SXM4-80GB")) == "A100"
    cpu = dataclasses.replace(info, device="cpu", gpu=None, hostname="build host.local", wrapgen_commit=None)
    assert machine.file_stem(cpu, "decode-small-fp32") == "decode-small-fp32-cpu-2026-11-27-build-host.local-nocommit"
    thp = dataclasses.replace(cpu, huge_pages="THP always; torch THP_MEM_ALLOC_ENABLE on")
    assert machine.file_stem(thp, "micro").startswith("micro-torch-thp-cpu-")

    args = interleaved.argparse.Namespace(device="cuda", dtype="bf16", models="gpt2", tasks="training")
    assert interleaved.suite_name(args, "full") == "interleaved-bf16-gpt2-training"


def test_results_folder_holds_current_pages_named_by_the_scheme() -> None:
    """benchmarks/results: at most 47 files (one current page per suite and device), each named
    `<suite>-<device>-<date>-<machine>-<commit>`, no page worded after a working session, every page listed in the folder's README."""
    import re

    folder = ROOT / "benchmarks" / "results"
    files = sorted(p for p in folder.iterdir() if p.is_file())
    assert len(files) <= 47, [p.name for p in files]
    index = (folder / "README.md").read_text()
    for path in files:
        if path.name == "README.md":
            continue
        assert re.fullmatch(RESULT_NAME, path.stem), path.name
        if path.suffix in (".md", ".json"):
            text = path.read_text()
            assert not re.search(r"\bsessions?\b|-s\d\d\b", text, re.IGNORECASE), path.name
        if path.suffix == ".md":
            assert path.name in index, f"{path.name} is not in benchmarks/results/README.md"
    assert not re.search(r"\bsessions?\b", index, re.IGNORECASE)


# -- train-mode batch norm (benchmarks.bn_training) ------------------------------------------------


@needs_transformers
def test_bn_training_benchmark_checks_gradients_and_running_stats(tmp_path: Path) -> None:
    from benchmarks import bn_training

    argv = ["--device=cpu", "--size=narrow", "--contenders=eager,wrapgen[python]", "--rounds=1", "--steps=1",
            "--check-steps=2", f"--out-dir={tmp_path}"]
    raw, markdown = _results(bn_training.main(argv), "bn-training-narrow-fp32")
    rows = {r["contender"]: r for r in raw["results"]}
    assert list(rows) == ["eager", "wrapgen[python]"]
    for name, row in rows.items():  # the running statistics are buffers the compiled forward writes in place
        assert row["status"] == "ok" and row["check"] == "ok", row
        assert len(row["round_times"]) == 1 and row["median_s"] > 0
        assert f"| {name} | ok |" in markdown
    assert rows["wrapgen[python]"]["graphs"] >= 1 and "batch norms" in raw["settings"]["model"]


@needs_transformers
def test_bn_training_check_names_a_running_stat_that_moved() -> None:
    import copy

    from benchmarks import bn_training

    model, images = bn_training.narrow_resnet("cpu", torch.float32)
    model.train()
    labels = torch.zeros(images.shape[0], dtype=torch.long)
    a, b, exact_model = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model).double()
    instances = [bn_training.Instance(m, bn_training.make_step(m, m, x, labels))
                 for m, x in ((a, images), (b, images), (exact_model, images.double()))]
    losses = [i.step() for i in instances]
    assert bn_training.compare(*instances, losses, torch.float32) is None
    name, buffer = next((n, t) for n, t in a.named_buffers() if n.endswith("running_var"))
    with torch.no_grad():
        buffer[0] += 0.5
    reason = bn_training.compare(*instances, losses, torch.float32)
    assert reason is not None and reason.startswith(f"{name}: RMS error"), reason


class _Cancellation(torch.nn.Module):
    """sum(x) - sum(flip(x)): zero in exact arithmetic, fp32 rounding noise in eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.sum() - x.flip(0).sum()).reshape(1)


def _other_order(model, inputs):
    return lambda x: (x.flip(0).sum() - x.sum()).reshape(1)  # the same noise, negated


def _noise_plus_one(model, inputs):
    return lambda x: model(x) + 1.0


@pytest.mark.parametrize("fallback", [False, True])
def test_an_inference_workload_with_the_float64_fallback_admits_rounding_noise(fallback: bool) -> None:
    """Another summation order's rounding noise fails the direct comparison; with
    `float64_fallback` (the suite's inference workloads) the float64 result admits it, and a wrong
    value still fails."""
    x = torch.randn(200_000) * 1000
    assert float(_Cancellation()(x)) != 0.0  # the noise this test is about
    workload = workloads.Workload("cancellation", "sum minus reversed sum", lambda device, **_: (_Cancellation(), (x,)),
                                  {"small": {}}, rtol=1e-3, atol=1e-3, atol_scaled=True, float64_fallback=fallback)
    chosen = [Contender("eager", contenders._eager, compiles=False), Contender("other_order", _other_order),
              Contender("wrong", _noise_plus_one)]
    plan = measure.TimingPlan(repeats=1, warmup=0, min_sample_s=0.0, max_calls=1)
    result = harness.run_benchmarks("cpu", [workload], chosen, plan, "small", 2**20, progress=False, warm=False)
    status = {r.contender: r.status for r in result.results}
    assert status == {"eager": "ok", "other_order": "ok" if fallback else "wrong", "wrong": "wrong"}


def test_float64_check_decides_where_a_gradient_is_rounding_noise() -> None:
    """A gradient zero in exact arithmetic holds only rounding noise: the direct comparison
    refuses another kernel order's noise, the float64 criterion admits it; a wrong value fails
    both."""
    exact = (torch.tensor(1.0, dtype=torch.float64), torch.zeros(8, dtype=torch.float64))
    eager = (torch.tensor(1.0), torch.full((8,), 7e-11))
    noise = (torch.tensor(1.0), torch.full((8,), -2e-10))
    assert measure.check_close(noise, eager, 1e-3, 1e-3, scaled=True) is not None
    assert measure.float64_check(noise, eager, exact) is None
    wrong = (torch.tensor(1.5), torch.full((8,), 7e-11))
    assert "output 0" in measure.float64_check(wrong, eager, exact)
