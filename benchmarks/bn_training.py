"""A convolution network's training step in train mode: batch norm normalizes by the batch and
updates its running statistics in place, so the compiled forward mutates module buffers.

    python -m benchmarks.bn_training [--device cpu|cuda] [--size full|small] [--dtype fp32|bf16]
        [--contenders 'torch.compile,wrapgen'] [--rounds N] [--steps N] [--check-steps N] [--threads N]
        [--out-dir DIR]

The model is benchmarks.models' ResNet-50 family (torchvision's on a machine that has it, else
transformers'; `--size small`, the default on CPU: one bottleneck block per stage, 8×3×64×64) in
`train()` mode, with random weights from one seed; `--size narrow`: the same at widths 32-256. A step is cross entropy against fixed labels,
forward and backward, gradients cleared first: what `benchmarks.training` times, with batch norm
live. Contenders compile the model (not the step) as a user would:

    eager                  the model
    torch.compile          torch.compile(model) (Inductor, default mode)
    wrapgen[python|cpp]    torch.compile(model, backend="wrapgen", options={"target": t})

Each contender has its own deep copy of the model, so its running statistics are its own. It takes
`--check-steps` steps on the same batch (the first compiles); then its loss, every gradient and every
batch-norm buffer (running mean, running variance, batches tracked) are compared with eager's
against the same steps run in float64: the loss's and each buffer's root-mean-square error at most 2x
eager's plus 1e-4 in fp32, 3x plus 1e-3 in bf16 (PyTorch's benchmark runner's rule); each gradient's
relative error at most 2x eager's plus 2e-2 in fp32, 3x plus 5e-2 in bf16, since a ReLU input within
rounding of zero takes either branch and moves a small channel's gradients by a percent: `compare`). Then each round times
`--steps` steps of every contender, the order rotating by one each round (CUDA events on a GPU, the
wall clock on CPU); the median over rounds is reported in ms per step.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import machine, measure, models, step_rounds
from benchmarks.report import fmt_time
from benchmarks.step_rounds import Row

REFERENCE = "eager"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CRITERION = measure.FLOAT64_CRITERION  # (multiplier, tolerance) of PyTorch's `same(..., fp64_ref)`
# a gradient's relative error allowed beyond MULTIPLIER times eager's (see `compare`)
GRADIENT_FLOOR = {torch.float32: 2e-2, torch.bfloat16: 5e-2}
CLASSES = 1000


def _wrapgen(target: str) -> Callable[[nn.Module], Callable[..., Any]]:
    def build(model: nn.Module) -> Callable[..., Any]:
        import wrapgen.dynamo

        wrapgen.dynamo.ensure_registered()  # run from a checkout, the entry point may be missing
        return torch.compile(model, backend="wrapgen", options={"target": target})

    return build


CONTENDERS: dict[str, Callable[[nn.Module], Callable[..., Any]]] = {
    REFERENCE: lambda model: model,
    "torch.compile": torch.compile,
    "wrapgen[python]": _wrapgen("python"),
    "wrapgen[cpp]": _wrapgen("cpp"),
}


@dataclass
class Instance:
    """One contender's model (its own parameters and running statistics) and its step."""

    model: nn.Module
    step: Callable[[], torch.Tensor]


def make_step(model: nn.Module, forward: Callable[..., Any], images: torch.Tensor,
              labels: torch.Tensor) -> Callable[[], torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> torch.Tensor:
        for p in params:
            p.grad = None
        with torch.enable_grad():
            loss = nn.functional.cross_entropy(forward(images).float(), labels)
            loss.backward()
        return loss.detach()

    return step


def state_of(instance: Instance) -> list[tuple[str, torch.Tensor]]:
    """Every gradient and every buffer (batch norm's running statistics), by name."""
    grads = [(f"{n}.grad", p.grad) for n, p in instance.model.named_parameters() if p.grad is not None]
    return grads + [(n, b) for n, b in instance.model.named_buffers()]


def relative_error(actual: torch.Tensor, exact: torch.Tensor) -> float:
    exact = exact.double()
    return float((actual.double() - exact).norm() / exact.norm().clamp_min(1e-30))


def compare(actual: Instance, expected: Instance, exact: Instance, losses: Sequence[torch.Tensor],
            dtype: torch.dtype) -> str | None:
    """None when the contender's loss, gradients and buffers are as close to the float64 steps' as
    eager's are, else the first that is not. The loss and the running statistics: root-mean-square
    error at most MULTIPLIER times eager's plus a tenth of the tolerance (PyTorch's benchmark runner's
    `same(..., fp64_ref)`). A gradient: relative error at most MULTIPLIER times eager's plus
    GRADIENT_FLOOR, since a ReLU whose input lies within rounding of zero takes either branch: in the
    small ResNet two such inputs (float64: +2e-6) come out negative in a compiled forward that rounds
    otherwise than eager's kernel, and a float64 step with just those two masks flipped moves its
    gradients as far (1.4e-2 on a last-stage bias, 7.7e-3 on the first stage), while eager flips
    another of its own (8.2e-3)."""
    mine, theirs, exacts = dict(state_of(actual)), dict(state_of(expected)), dict(state_of(exact))
    if mine.keys() != theirs.keys():
        return f"different gradients or buffers: {sorted(mine.keys() ^ theirs.keys())[:3]}"
    multiplier, tolerance = CRITERION[dtype]
    pairs = [("loss", *losses)] + [(name, mine[name], theirs[name], exacts[name]) for name in theirs]
    for name, a, e, x in pairs:
        if not e.is_floating_point():
            if not torch.equal(a.cpu(), e.cpu()):
                return f"{name}: {a.tolist()} != {e.tolist()}"
            continue
        if name.endswith(".grad"):
            mine_error, eager_error = relative_error(a, x), relative_error(e, x)
            if mine_error > multiplier * eager_error + GRADIENT_FLOOR[dtype]:
                return f"{name}: relative error {mine_error:.2e} against float64's, eager's {eager_error:.2e}"
            continue
        mine_error, eager_error = measure.rmse(a, x), measure.rmse(e, x)
        if mine_error > multiplier * eager_error + tolerance / 10:
            return f"{name}: RMS error {mine_error:.2e} against float64's, eager's {eager_error:.2e}"
    return None


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def narrow_resnet(device: str, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    """transformers' bottleneck ResNet at widths 32-256, one block per stage (the CPU training step
    the stateful-programs issue measured), and a batch of 8×3×64×64, from one seed."""
    tf = models._transformers()
    torch.manual_seed(0)
    config = tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                             layer_type="bottleneck", num_labels=CLASSES)
    model = models.LogitsOf(tf.ResNetForImageClassification(config), "logits").to(device, dtype)
    return model, torch.randn(8, 3, 64, 64, device=device, dtype=dtype)


def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    family = models.FAMILIES["resnet50"]
    dtype = DTYPES[args.dtype]
    if args.size == "narrow":
        base, images = narrow_resnet(args.device, dtype)
        size_text = "transformers ResNet, bottleneck, widths 32, 64, 128, 256, depths 1, 1, 1, 1, batch 8, image 64"
    else:
        base, (images,) = family.build(args.device, args.size, dtype)
        size_text = f"{family.description}, {family.size_text(args.size)}"
    base.train()
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, CLASSES, (images.shape[0],), generator=generator).to(args.device)
    bn_layers = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in base.modules())
    rows: dict[str, Row] = {}
    instances: dict[str, Instance] = {}
    exact_model = copy.deepcopy(base).double()
    exact = Instance(exact_model, make_step(exact_model, exact_model, images.double(), labels))
    _progress(f"float64: {args.check_steps} steps (the exact result every contender's error is measured from)")
    for _ in range(args.check_steps):
        exact_loss = exact.step()
    reference_loss: torch.Tensor | None = None
    for name in args.chosen:
        row = rows[name] = Row("resnet50-train", name)
        model = copy.deepcopy(base)
        try:
            instance = Instance(model, make_step(model, CONTENDERS[name](model), images, labels))
            _progress(f"{name}: {args.check_steps} steps (the first compiles)")
            graphs = step_rounds.dynamo_graphs()
            loss, row.first_call_s = step_rounds.wall_time(instance.step, args.device)
            for _ in range(args.check_steps - 1):
                loss = instance.step()
            step_rounds.synchronize(args.device)
            if name != REFERENCE:
                row.graphs = step_rounds.dynamo_graphs() - graphs
        except Exception as error:  # noqa: BLE001 - the row says what broke; the run goes on
            row.fail("compile and check steps", error)
            continue
        if name == REFERENCE:
            reference_loss, row.check = loss, "ok"
        elif reference_loss is None:
            row.detail = f"not checked: {REFERENCE} failed"
        else:
            reason = compare(instance, instances[REFERENCE], exact, (loss, reference_loss, exact_loss), dtype)
            row.check, row.detail = ("ok", "") if reason is None else ("mismatch", reason)
        instances[name] = instance

    measures: dict[str, Callable[[], float]] = {}
    for name, instance in instances.items():
        def measure(step: Callable[[], torch.Tensor] = instance.step) -> float:
            def steps() -> None:
                for _ in range(args.steps):
                    step()

            return step_rounds.time_block(steps, args.device) / args.steps

        measures[name] = measure
    _progress(f"{args.rounds} rounds of {args.steps} steps per contender")
    step_rounds.run_rounds(rows, measures, args.rounds, _progress)
    described = {"model": f"{size_text}, in train mode, {args.dtype}, "
                          f"{sum(p.numel() for p in base.parameters()):,} parameters, {bn_layers} batch norms "
                          f"({type(getattr(base, 'model', base)).__module__.split('.')[0]})"}
    return list(rows.values()), described


def markdown(rows: list[Row], info: machine.MachineInfo, settings: dict[str, Any], command: str) -> str:
    lines = step_rounds.header(info, "wrapgen benchmarks: train-mode batch-norm training step", settings, command)
    lines += ["## ms per training step", "",
              "| contender | status | ms/step (median) | min - max | vs eager | vs torch.compile | first step | graphs "
              "| check |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ref = next((r.median_s for r in rows if r.contender == REFERENCE), None)
    inductor = next((r.median_s for r in rows if r.contender == "torch.compile"), None)
    for r in rows:
        median = r.median_s
        spread = f"{min(r.round_times) * 1e3:.2f} - {max(r.round_times) * 1e3:.2f}" if median else "—"
        lines.append("| " + " | ".join(step_rounds.cell(c) for c in [
            r.contender, r.status, step_rounds.fmt(median and median * 1e3, ".2f"), spread,
            step_rounds.fmt(ref / median if ref and median else None, ".2f", "x"),
            step_rounds.fmt(inductor / median if inductor and median and r.contender != "torch.compile" else None,
                            ".2f", "x"),
            fmt_time(r.first_call_s), step_rounds.fmt(r.graphs, "d"), step_rounds.CHECK_TEXT[r.check],
        ]) + " |")
    lines.append("")
    lines += step_rounds.failures(rows)
    lines += ["## Method", "", *[line for line in __doc__.split("\n\n")[3:5]], ""]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bn_training", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--size", choices=("full", "small", "narrow"), default=None,
                        help="ResNet-50 (full), one block per stage (small), or also narrow (widths 32-256); "
                             "default: full on CUDA, small on CPU")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated subset of {', '.join(CONTENDERS)}; 'wrapgen' names every "
                             f"wrapgen[...] ({REFERENCE} always runs)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--steps", type=int, default=5, help="steps per contender per round (default 5)")
    parser.add_argument("--check-steps", type=int, default=3, help="steps before the check (default 3)")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=None, help=argparse.SUPPRESS)
    args = step_rounds.parse_common(parser, argv)
    on_cuda = args.device == "cuda"
    args.size = args.size or ("full" if on_cuda else "small")
    args.dtype = args.dtype or ("bf16" if on_cuda else "fp32")
    for name in ("rounds", "steps", "check_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.chosen = step_rounds.select(list(CONTENDERS), args.contenders, REFERENCE)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with step_rounds.raised_recompile_limits():
        rows, described = run(args)
    gc.collect()
    info = machine.collect(args.device)
    command = "python -m benchmarks.bn_training " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = described | {
        "rounds × steps": f"{args.rounds} × {args.steps} (after {args.check_steps} checked steps)",
        "run took": f"{(time.perf_counter() - started) / 60:.1f} min"}
    payload = {"machine": info.as_dict(), "settings": settings | {"size": args.size, "dtype": args.dtype},
               "command": command, "results": step_rounds.rows_json(rows)}
    suite = f"bn-training-{args.size}-{args.dtype}" + (f"-threads{args.threads}" if args.threads else "")
    paths = step_rounds.write(args.out_dir, machine.file_stem(info, suite),
                              markdown(rows, info, settings, command), payload)
    for r in rows:
        median = f"{r.median_s * 1e3:.2f} ms" if r.median_s else r.status
        print(f"{r.contender:18s} {median:>10s}  check {r.check} {r.detail[:200]}")
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
