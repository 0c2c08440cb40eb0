"""Run the model suite: every model of the chosen suites x every contender, then one page per run
(`suite-<suites>-<dtype>-<size>[-training]-<device>-<date>-<machine>-<commit>.{md,png,json}`).

    python -m benchmarks.suite [--device cpu|cuda] [--suites huggingface,timm,torchvision]
        [--models gpt2,timm/resnet50] [--dtype fp32|bf16|fp16] [--size small|full] [--training[-only]]
        [--contenders eager,torch.compile,wrapgen[python],wrapgen[cpp],wrapgen-dynamo[python],...]
        [--rounds N] [--repeats N] [--no-lowering] [--out-dir DIR]

Contenders (each built with cold caches, checked against eager, then timed in rounds whose order
rotates): eager; torch.compile (Inductor); wrapgen.compile per target (`wrapgen[python]`,
`wrapgen[cpp]`); torch.compile(backend="wrapgen") per target (`wrapgen-dynamo[python]`, ...),
the entry point most users take. Training steps (the causal language models, `--training`) go
through torch.compile for every compiler (for wrapgen: `backend="wrapgen"`, timed once, under
`wrapgen[t]`, where `wrapgen-dynamo[t]` runs too). Per model, wrapgen's lowered program is counted too:
generated kernels, their launches and the library calls left, by op.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import contenders as contenders_mod
from benchmarks import machine, report, step_rounds
from benchmarks.contenders import Contender
from benchmarks.harness import run_benchmarks
from benchmarks.measure import TimingPlan
from benchmarks.model_lowering import LoweringCounts, count
from benchmarks.models import library_versions
from benchmarks.report import Report
from benchmarks.suite import catalog, page
from benchmarks.suite.vision import available

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
DEFAULT_CONTENDERS = "torch.compile,wrapgen[python],wrapgen[cpp],wrapgen-dynamo[python],wrapgen-dynamo[cpp]"


def contenders(device: str, names: str) -> list[Contender]:
    """eager (always) and the named ones; `wrapgen-dynamo[t]` is torch.compile(backend="wrapgen").

    A training step compiles through torch.compile for every compiler, so `wrapgen[t]` and
    `wrapgen-dynamo[t]` would time the same compiled step twice, and their rows differed only by
    noise (a GPT-J step 2.25 and 2.91 ms in one CPU run): where both are named, the step runs once,
    under `wrapgen[t]`."""
    every = [c for c in contenders_mod.default_contenders(device) if c.name != "torch.compile[reduce-overhead]"]
    every += contenders_mod.dynamo_entry_contenders()
    chosen = contenders_mod.select(every, names)
    named = {c.name for c in chosen}
    return [dataclasses.replace(c, train_build=None) if _same_training_step_as(c.name) in named else c
            for c in chosen]


def _same_training_step_as(name: str) -> str | None:
    """`wrapgen[t]` for `wrapgen-dynamo[t]`: the contender whose training step is the same."""
    prefix = "wrapgen-dynamo["
    return "wrapgen[" + name[len(prefix):] if name.startswith(prefix) else None


@contextlib.contextmanager
def recorded_programs() -> Iterator[list]:
    """Every program wrapgen emits inside the block (through either entry point), in order."""
    import wrapgen.api

    programs: list = []
    start_emit = wrapgen.api._start_emit  # every program emitted goes through it

    def recording(program: Any, target: str) -> Any:
        programs.append(program)
        return start_emit(program, target)

    wrapgen.api._start_emit = recording
    try:
        yield programs
    finally:
        wrapgen.api._start_emit = start_emit


def _merged(programs: list) -> LoweringCounts:
    total = LoweringCounts()
    for program in programs:
        counts = count(program)
        total.kernels, total.launches = total.kernels + counts.kernels, total.launches + counts.launches
        total.extern.update(counts.extern)
    return total


def _why(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"


def lowering_counts(chosen: list[catalog.Entry], device: str, dtype: torch.dtype, size: str
                    ) -> dict[str, dict[str, LoweringCounts | str]]:
    """Each model's programs counted through each entry point (`compile`: wrapgen.lower, what
    wrapgen.compile runs; `dynamo`: the graphs torch.compile(backend="wrapgen") hands wrapgen at
    the first call), or why one did not lower: the two should be the same program."""
    import wrapgen
    import wrapgen.dynamo

    wrapgen.dynamo.ensure_registered()
    found: dict[str, dict[str, LoweringCounts | str]] = {}
    for entry in chosen:
        found[entry.key] = counts = {}
        try:
            model, inputs = entry.build(device, dtype, size)
        except Exception as error:  # a model that does not build is a row that says why
            counts["compile"] = counts["dynamo"] = _why(error)
            continue
        with torch.no_grad():
            try:
                counts["compile"] = count(wrapgen.lower(model, inputs))
            except Exception as error:
                counts["compile"] = _why(error)
            torch._dynamo.reset()
            try:
                with recorded_programs() as programs:
                    torch.compile(model, backend="wrapgen", options={"target": "python"})(*inputs)
                counts["dynamo"] = _merged(programs)
            except Exception as error:
                counts["dynamo"] = _why(error)
            torch._dynamo.reset()
    return found


def _as_json(counts: LoweringCounts | str) -> dict[str, Any] | str:
    if isinstance(counts, str):
        return counts
    return {"kernels": counts.kernels, "launches": counts.launches, "library_calls": dict(counts.extern)}


def suite_name(args: argparse.Namespace) -> str:
    """`suite-<suites>-<dtype>-<size>[-training][-<models>]`: what the page's run covered."""
    present = {e.suite for e in catalog.select(args.suites, args.models)}
    suites = "-".join(s for s in catalog.SUITES if s in present)
    name = f"suite-{suites}-{args.dtype}-{args.size}" + ("-training" if args.training else "")
    if args.models:
        name += "-" + "-".join(m.replace("/", "_") for m in args.models.split(",") if m.strip())[:60]
    return name


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--suites", default=",".join(catalog.SUITES), help="comma-separated subset of the suites")
    parser.add_argument("--models", default=None, help="only these models (a name, or suite/name)")
    parser.add_argument("--dtype", choices=tuple(catalog.DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--size", choices=catalog.SIZES, default=None, help="default: full on cuda, small on cpu")
    parser.add_argument("--training", action="store_true", help="also a training step of each causal language model")
    parser.add_argument("--training-only", action="store_true",
                        help="only the training steps (their models' inference rows measured in another run)")
    parser.add_argument("--contenders", default=DEFAULT_CONTENDERS, help="comma-separated (eager always runs)")
    parser.add_argument("--rounds", type=int, default=3, help="whole measurements per cell (medians reported)")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per measurement")
    parser.add_argument("--quick", action="store_true", help="few samples, no warm-up: a smoke run")
    parser.add_argument("--no-lowering", action="store_true", help="skip counting each model's lowered program")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    args.training = args.training or args.training_only
    step_rounds.settle_device(parser, args)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.size = args.size or ("full" if args.device == "cuda" else "small")
    try:
        catalog.select(args.suites, args.models)
        contenders(args.device, args.contenders)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    chosen = catalog.select(args.suites, args.models)
    skipped = {e.key: problem for e in chosen if e.suite != "huggingface" and (problem := available(e.suite))}
    runnable = [e for e in chosen if e.key not in skipped]
    plan = (TimingPlan(repeats=3, warmup=1, min_sample_s=0.001, max_calls=10) if args.quick
            else TimingPlan(repeats=args.repeats))
    started = time.perf_counter()
    dtype = catalog.DTYPES[args.dtype]
    settings = {"suite": "suite", "dtype": args.dtype, "size": args.size, "tolerances": catalog.TOLERANCES[args.dtype],
                "atol_scaled": True, "suites": {e.key: e.suite for e in chosen}, "not_built": skipped,
                "command": "python -m benchmarks.suite " + " ".join(argv or []), **library_versions()}
    stem: list[str] = []  # fixed at the first checkpoint: every later write replaces the same files

    def write(measured: Report, lowering: dict) -> list[Path]:
        measured.extra = {**settings, "lowering": {k: {entry: _as_json(c) for entry, c in v.items()}
                                                   for k, v in lowering.items()}}
        if not stem:
            stem.append(machine.file_stem(measured.info, suite_name(args)))
        return report.write(measured, args.out_dir, stem[0], render=page.markdown)

    def checkpoint(partial: Report) -> None:
        """The page so far, after each model (a run cut short by a time limit keeps it)."""
        settings["partial"] = f"{len(partial.workloads)} of {len(workloads)} workloads measured so far"
        write(partial, {})

    workloads = catalog.workloads(runnable, args.size, args.dtype, args.training, inference=not args.training_only)
    result = run_benchmarks(args.device, workloads,
                            contenders(args.device, args.contenders), plan, args.size,
                            8 * 2**20 if args.quick else 256 * 2**20, not args.no_progress,
                            warm=not args.quick, rounds=1 if args.quick else args.rounds, checkpoint=checkpoint)
    settings.pop("partial", None)
    lowering = {} if args.no_lowering else lowering_counts(runnable, args.device, dtype, args.size)
    result.elapsed_s = time.perf_counter() - started
    paths = write(result, lowering)
    print("\n".join(page.summary_table(result)))
    for path in paths:
        print(f"wrote {path}")
    return paths
