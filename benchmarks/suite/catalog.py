"""The suite's models as harness workloads: every entry of the three lists (transformers, timm,
torchvision), inference in the run's dtype, and a training step for the causal language models."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.models import LanguageModelLoss
from benchmarks.suite import huggingface, vision
from benchmarks.training import TrainingStep
from benchmarks.workloads import Workload

SUITES = ("huggingface", "timm", "torchvision")
TRAINING_SUFFIX = "-train"  # a model's training-step row: `huggingface/gpt2-train`
SIZES = ("small", "full")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (rtol, atol x each output's largest magnitude), as benchmarks.model_suite judges the five families.
TOLERANCES = {"fp32": {"inference": (1e-3, 1e-3), "training": (1e-3, 1e-3)},
              "bf16": {"inference": (5e-2, 5e-2), "training": (1e-1, 1e-1)},
              "fp16": {"inference": (1e-2, 1e-2), "training": (5e-2, 5e-2)}}


@dataclass(frozen=True)
class Entry:
    """One model of one suite: how to build it, whether it trains, what it shows."""

    suite: str
    name: str
    note: str
    trainable: bool
    model: Any  # huggingface.HFModel | vision.VisionModel

    @property
    def key(self) -> str:
        """The row name: unique across suites (`timm/resnet50` and `torchvision/resnet50`)."""
        return f"{self.suite}/{self.name}"

    def build(self, device: torch.device | str, dtype: torch.dtype, size: str) -> tuple[nn.Module, tuple]:
        device = torch.device(device)
        torch.manual_seed(0)
        with device:  # weights are initialized where they live
            if self.suite == "huggingface":
                return huggingface.build(self.model, device, dtype, size)
            return vision.build(self.model, device, dtype, size)


def entries(suites: tuple[str, ...] = SUITES) -> list[Entry]:
    found = []
    if "huggingface" in suites:
        found += [Entry("huggingface", m.name, m.note, m.trainable, m) for m in huggingface.MODELS]
    for suite, models in (("timm", vision.TIMM), ("torchvision", vision.TORCHVISION)):
        if suite in suites:
            found += [Entry(suite, m.name, m.note, False, m) for m in models]
    return found


def select(suites: str | None, models: str | None) -> list[Entry]:
    """Entries of the named suites (all for None), then only the named models (a model's name, or
    `suite/name`) when `models` is given; an unknown name is an error naming the known ones."""
    chosen_suites = tuple(s.strip() for s in (suites or ",".join(SUITES)).split(",") if s.strip())
    unknown = [s for s in chosen_suites if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; suites are: {', '.join(SUITES)}")
    found = entries(chosen_suites)
    if not models:
        return found
    wanted = [m.strip() for m in models.split(",") if m.strip()]
    picked = [e for e in found if e.name in wanted or e.key in wanted]
    missing = [w for w in wanted if not any(w in (e.name, e.key) for e in picked)]
    if missing:
        raise ValueError(f"unknown model(s) {', '.join(missing)}; models are: {', '.join(e.key for e in found)}")
    return picked


def _inference(entry: Entry, dtype: torch.dtype, size: str, device: str) -> tuple[nn.Module, tuple]:
    return entry.build(device, dtype, size)


def _training(entry: Entry, dtype: torch.dtype, size: str, device: str) -> tuple[nn.Module, tuple]:
    lm, inputs = entry.build(device, dtype, size)
    return TrainingStep(LanguageModelLoss(lm)), inputs


def workloads(chosen: list[Entry], size: str, dtype_name: str, training: bool,
              inference: bool = True) -> list[Workload]:
    """Harness workloads: each entry's inference (unless not `inference`), and with `training` the
    step of each trainable one. Their one size profile is `size`."""
    dtype = DTYPES[dtype_name]
    found = []
    for entry in chosen:
        text = f"{entry.suite} {entry.name}" + (f" ({entry.note})" if entry.note else "") + f"; {dtype_name}"
        rtol, atol = TOLERANCES[dtype_name]["inference"]
        make = functools.partial(_inference, entry, dtype)
        if inference:
            found.append(Workload(entry.key, text, lambda device, _make=make, **_: _make(size, device),
                                  {size: {}}, rtol=rtol, atol=atol, atol_scaled=True, float64_fallback=True))
        if training and entry.trainable:
            rtol, atol = TOLERANCES[dtype_name]["training"]
            make = functools.partial(_training, entry, dtype)
            found.append(Workload(f"{entry.key}{TRAINING_SUFFIX}", f"training step of {text}",
                                  lambda device, _make=make, **_: _make(size, device),
                                  {size: {}}, rtol=rtol, atol=atol, atol_scaled=True, training=True))
    return found
