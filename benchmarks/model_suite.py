"""The real-model suite: GPT-2, Llama-style (GQA), BERT, ResNet-50, ViT-B/16 as benchmark
workloads (inference, and a training step for the language models), run by the same harness
as the micro workloads and written to
`models-<dtype>[-<size>][-<models>][-<task>]-<device>-<date>-<machine>-<commit>.{md,png,json}`.

    python -m benchmarks.run --models all [--dtype bf16] [--size small] [--tasks inference]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import wrapgen
from benchmarks import contenders as contenders_mod
from benchmarks import machine, model_lowering, model_report, models, report
from benchmarks.contenders import Contender
from benchmarks.harness import run_benchmarks
from benchmarks.measure import TimingPlan
from benchmarks.training import TrainingStep
from benchmarks.workloads import Workload

DTYPES = model_lowering.DTYPES
TASKS = ("inference", "training")
# (rtol, atol relative to each output's largest magnitude) by dtype and task; why these: model_report's
# Method section. bf16 gradients get twice the inference tolerance: on an H100, torch.compile's
# GPT-2 gradients were 3.6e-2 of their scale from eager's, its logits 1.3e-2.
TOLERANCES = {"fp32": {"inference": (1e-3, 1e-3), "training": (1e-3, 1e-3)},
              "bf16": {"inference": (5e-2, 5e-2), "training": (1e-1, 1e-1)}}


def parse_tasks(text: str | None) -> tuple[str, ...]:
    """Tasks named in a comma-separated list (both for None or "")."""
    if not text:
        return TASKS
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown task(s) {', '.join(unknown) or repr(text)}; tasks are: {', '.join(TASKS)}")
    return tasks


def _training_step(device: torch.device, family: models.ModelFamily, dtype: torch.dtype, vision_impl: str,
                   **size: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    lm, inputs = family.instantiate(device, dtype, vision_impl, **size)
    return TrainingStep(models.LanguageModelLoss(lm)), inputs


def model_workloads(families: Sequence[models.ModelFamily], size: str, dtype_name: str, vision_impl: str = "auto",
                    tasks: Sequence[str] = TASKS) -> list[Workload]:
    """Harness workloads for the families: inference of each, a training step of the trainable ones.
    Their one size profile is `size`."""
    dtype = DTYPES[dtype_name]
    chosen = []
    for family in families:
        if size not in family.sizes:  # b1x32 is defined for the decoders only
            continue
        impl = f"; from {models.resolve_vision(vision_impl)}" if family.vision else ""
        description = f"{family.description}{impl}; {dtype_name}"
        sizes = {size: family.sizes[size]}
        if "inference" in tasks:
            rtol, atol = TOLERANCES[dtype_name]["inference"]
            make = functools.partial(family.instantiate, dtype=dtype, vision_impl=vision_impl)
            chosen.append(Workload(family.name, description, make, sizes, rtol=rtol, atol=atol, atol_scaled=True))
        if "training" in tasks and family.trainable:
            rtol, atol = TOLERANCES[dtype_name]["training"]
            make = functools.partial(_training_step, family=family, dtype=dtype, vision_impl=vision_impl)
            chosen.append(Workload(f"{family.name}-train", f"training step (forward + backward) of {description}",
                                   make, sizes, rtol=rtol, atol=atol, atol_scaled=True, training=True))
    return chosen


def model_contenders(device: str, names: str | None) -> list[Contender]:
    """By default eager, torch.compile (both modes on CUDA) and each registered wrapgen target;
    `names` picks from every contender, the memory-plan and page-size variants and the dynamo entry
    (`wrapgen-dynamo[t]`) too."""
    every = contenders_mod.default_contenders(device)
    if names:
        return contenders_mod.select(every + contenders_mod.dynamo_entry_contenders(), names)
    targets = {f"wrapgen[{t}]" for t in wrapgen.backends.registered_backends()}
    return [c for c in every if c.name.startswith(("eager", "torch.compile")) or c.name in targets]


def suite_name(args: argparse.Namespace, size: str) -> str:
    """The suite words of the file name: `models-<dtype>`, then what differs from the defaults:
    the size off the device's default (`-full`, `-small`, `-b1x32`), the models when not all of
    them (`-gpt2-llama`), the task when one only (`-inference`, `-training`), `-threads<N>`, `-quick`."""
    suite = f"models-{args.dtype or 'fp32'}"
    if size != models.default_size(args.device):
        suite += f"-{size}"
    chosen = list(dict.fromkeys(f.name for f in models.select(args.models)))
    if len(chosen) < len(models.FAMILIES):
        suite += "-" + "-".join(chosen)
    tasks = parse_tasks(args.tasks)
    if len(tasks) < len(TASKS):
        suite += "-" + "-".join(tasks)
    if args.threads:
        suite += f"-threads{args.threads}"
    return suite + ("-quick" if args.quick else "")


def _size(args: argparse.Namespace) -> str:
    if args.size in (None, "auto"):
        return "small" if args.quick else models.default_size(args.device)
    return args.size


def main(args: argparse.Namespace, plan: TimingPlan, rounds: int, copy_bytes: int,
         extra_contenders: Sequence[Contender] = ()) -> list[Path]:
    """Run the chosen models through the harness and write the result files; their paths."""
    families = models.select(args.models)
    vision = args.vision or "auto"
    models.check_available(families, vision)
    dtype_name, size = args.dtype or "fp32", _size(args)
    chosen = model_workloads(families, size, dtype_name, vision, parse_tasks(args.tasks))
    contenders = model_contenders(args.device, args.contenders) + list(extra_contenders)
    result = run_benchmarks(args.device, chosen, contenders, plan, size, copy_bytes, not args.no_progress,
                            warm=not args.quick, rounds=rounds)
    result.workloads = {w.name: f"{w.description}: {w.size_text(size)}" for w in chosen}
    result.profile = f"{size}, {dtype_name}"  # what the page and the chart's title say
    result.extra = {"suite": "models", "dtype": dtype_name, "size": size, "tolerances": TOLERANCES[dtype_name],
                    "atol_scaled": True, "vision": models.resolve_vision(vision) if any(f.vision for f in families)
                    else None, **models.library_versions()}
    stem = machine.file_stem(result.info, suite_name(args, size))
    paths = report.write(result, args.out_dir, stem, render=model_report.markdown)
    print("\n".join(model_report.results_table(result)))
    for path in paths:
        print(f"wrote {path}")
    return paths


def lowering_report(args: argparse.Namespace) -> str:
    """The `--lowering-report` text for the run's models, device, size and dtype."""
    families = models.select(args.models)
    vision = args.vision or "auto"
    models.check_available(families, vision)
    return model_lowering.report(families, args.device, _size(args), args.dtype or "fp32", vision)
