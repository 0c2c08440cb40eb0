"""Sharded models on several ranks: eager, torch.compile (Inductor) and wrapgen, one process per rank.

    torchrun --nproc-per-node N -m benchmarks.distributed --device cuda|cpu
        [--scenarios tp-block,tp-train,fsdp2,fsdp2-gpt2] [--contenders eager,torch.compile,wrapgen,wrapgen-dynamo,...]
        [--size full|tiny] [--rounds 7] [--steps 10] [--check-steps 2] [--warmup 2] [--profile-steps 3]
        [--compile-optimizer] [--threads N] [--out-dir DIR]

It runs as one process per rank (torchrun's environment names the group): NCCL on CUDA, with
NCCL_NVLS_ENABLE=0 (never NVLink multicast), gloo on CPU. Full size: bf16 on CUDA; CPU runs take
float32 and mostly `--size tiny`.

Scenarios (benchmarks/distributed_models.py):

    tp-block  the forward of four tensor-parallel Llama-style blocks written by hand: column-parallel qkv
              and gate/up, row-parallel o and down, each followed by a functional all_reduce
    tp-train  a training step (forward, backward, AdamW) of a Llama-style decoder under DTensor tensor
              parallelism (`parallelize_module`, ColwiseParallel / RowwiseParallel)
    fsdp2     the same step under FSDP2 (`fully_shard` on each decoder layer, then the root), each rank
              on its own batch
    fsdp2-gpt2  transformers' GPT-2 (12 x 768 at `full`) under FSDP2 (`fully_shard` on each block, then the
              root), each rank on its own batch; needs transformers

Contenders, each on its own copy of the model (and optimizer):

    eager                         the reference
    torch.compile                 Inductor
    wrapgen[python|cpp]           wrapgen.compile(model, (x,), target=t)            (tp-block: inference only)
    wrapgen[python+overlap-off]   the same with overlap_collectives=False   (tp-block)
    wrapgen-dynamo[python|cpp]    torch.compile(model, backend="wrapgen", options={"target": t})

Every contender is built and checked first (its output, or its losses over `--check-steps` steps,
against eager's on every rank); then each round times `--steps` steps of every contender, the order
rotating by one each round, with a barrier between contenders; a round's time is the slowest rank's.
On CUDA a last pass measures each contender's peak memory and, under torch.profiler, its exposed
communication (time in which an NCCL kernel runs and nothing else does). A contender that raises on
any rank is reported with the exception's first line on every rank, and the run goes on. Rank 0
prints the table and, with --out-dir, writes `distributed-...` pages (`machine.file_stem`).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import distributed_models as models
from benchmarks import machine, step_rounds
from benchmarks.distributed_report import exposed_communication, markdown, table
from benchmarks.measure import check_close
from benchmarks.step_rounds import Row

REFERENCE = "eager"
SCENARIOS = ("tp-block", "tp-train", "fsdp2", "fsdp2-gpt2")
DATA_PARALLEL = ("fsdp2", "fsdp2-gpt2")  # each rank trains on its own batch
LR = 1e-3


# -- the contenders ------------------------------------------------------------------------------------


Build = Callable[[torch.nn.Module, tuple], Callable[..., Any]]  # (model, example inputs) -> its forward
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]  # a function (optimizer.step) -> its compiled form


@dataclass(frozen=True)
class Contender:
    name: str
    forward: Build
    step: Wrap | None  # how --compile-optimizer compiles optimizer.step; None: not compiled
    scenarios: tuple[str, ...] = SCENARIOS
    dynamo: bool = True  # compiled through torch.compile (its graphs are counted)


@dataclass(frozen=True)
class Scenario:
    name: str
    inputs: tuple[torch.Tensor, ...]  # this rank's: tp-block's activations, or token ids and targets
    tolerance: tuple[float, float, bool]  # rtol, atol, atol relative to eager's largest magnitude (measure.check_close)


def _eager(model: torch.nn.Module, example: tuple) -> Callable[..., Any]:
    return model


def _inductor(model: torch.nn.Module, example: tuple) -> Callable[..., Any]:
    return torch.compile(model)


def _wrapgen_dynamo(target: str) -> tuple[Build, Wrap]:
    """torch.compile(backend="wrapgen") for `target`: of the model, and of optimizer.step."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        import wrapgen.dynamo

        wrapgen.dynamo.ensure_registered()  # run from a checkout, the entry point may be missing
        return torch.compile(fn, backend="wrapgen", options={"target": target})

    return (lambda model, example: wrap(model)), wrap


def _wrapgen_compile(target: str, **options: Any) -> Build:
    """wrapgen.compile (torch.export; inference) for `target`, with `options` set while it compiles."""

    def build(model: torch.nn.Module, example: tuple) -> Callable[..., Any]:
        import wrapgen

        with wrapgen.config.patch(**options):
            return wrapgen.compile(model, example, target=target)

    return build


CONTENDERS = [
    Contender(REFERENCE, _eager, None, dynamo=False),
    Contender("torch.compile", _inductor, torch.compile),
    Contender("wrapgen[python]", _wrapgen_compile("python"), None, ("tp-block",), dynamo=False),
    Contender("wrapgen[cpp]", _wrapgen_compile("cpp"), None, ("tp-block",), dynamo=False),
    Contender("wrapgen[python+overlap-off]", _wrapgen_compile("python", overlap_collectives=False), None,
              ("tp-block",), dynamo=False),
    Contender("wrapgen-dynamo[python]", *_wrapgen_dynamo("python")),
    Contender("wrapgen-dynamo[cpp]", *_wrapgen_dynamo("cpp")),
]


# -- agreement between ranks ---------------------------------------------------------------------------


class RankFailure(RuntimeError):
    """A step failed on some rank; every rank raises it, so every rank marks the same contender."""


class Ranks:
    """This process's rank and the all_reduces through which the ranks agree."""

    def __init__(self, device: str) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device
        self.tensor_device = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"

    def max(self, values: Sequence[float]) -> list[float]:
        """The elementwise maximum of `values` over the ranks."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.tensor_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def first_error(self, error: str | None) -> str | None:
        """None where no rank failed, else the lowest failing rank's message, on every rank."""
        if not self.max([0.0 if error is None else 1.0])[0]:
            return None
        rank, text = next((r, e) for r, e in enumerate(self.gather(error)) if e is not None)
        return f"rank {rank}: {text}"

    def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on every rank; if it raised on any, RankFailure on all (the lowest rank's message)."""
        result, error = None, None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - handed to every rank, then raised there
            error = step_rounds.first_line(exc)
        agreed = self.first_error(error)
        if agreed is not None:
            raise RankFailure(agreed)
        return result


def _progress(ranks: Ranks, text: str) -> None:
    if ranks.rank == 0:
        print(text, file=sys.stderr, flush=True)


# -- one contender's copy of a scenario ----------------------------------------------------------------


@dataclass
class Instance:
    """A contender's model (and optimizer) and its step: a forward, or a whole training step."""

    model: torch.nn.Module
    step: Callable[[], torch.Tensor]  # the output (tp-block) or the loss (training)


def build(scenario: Scenario, contender: Contender, args: argparse.Namespace) -> Instance:
    size, device, dtype = args.size_spec, args.device, args.dtype
    if scenario.name == "tp-block":
        model = models.tp_stack(size, args.ranks.rank, args.ranks.world, device, dtype)
        example = scenario.inputs
        forward = contender.forward(model, example)

        def infer() -> torch.Tensor:
            with torch.no_grad():
                return forward(*example)

        return Instance(model, infer)
    if scenario.name == "fsdp2-gpt2":
        model = models.fully_sharded_gpt2(models.gpt2(args.size, size, device, dtype), args.mesh)
    else:
        model = models.decoder(size, device, dtype)
        model = (models.tensor_parallel if scenario.name == "tp-train" else models.fully_sharded)(model, args.mesh)
    forward = contender.forward(model, scenario.inputs)
    optimizer = torch.optim.AdamW(parameter_groups(model), lr=LR, weight_decay=0.01, foreach=True)
    update = contender.step(optimizer.step) if args.compile_optimizer and contender.step else optimizer.step

    def train() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = forward(*scenario.inputs)
        loss.backward()
        update()
        return loss.detach()

    return Instance(model, train)


def parameter_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The parameters in two groups, DTensors and plain tensors: tensor parallelism leaves the
    embedding, norms and head plain, and one foreach update cannot mix the two kinds."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return [{"params": group} for group in groups if group]


def compare(actual: torch.Tensor, expected: torch.Tensor,
            tolerance: tuple[float, float, bool]) -> tuple[str | None, float]:
    """(None or why `actual` differs from `expected`, largest |difference|)."""
    worst = float((actual.float() - expected.float()).abs().max()) if actual.numel() else 0.0
    rtol, atol, scaled = tolerance
    return check_close(actual, expected.cpu(), rtol, atol, scaled), worst


def first_steps(scenario: Scenario, contender: Contender, steps: int,
                args: argparse.Namespace) -> tuple[Instance, torch.Tensor, float]:
    """The contender's instance, the results of its first `steps` steps stacked (tp-block: one
    output; training: the losses) and the seconds of its build and first step, which compile it."""
    begin = time.perf_counter()
    instance = build(scenario, contender, args)
    results = [instance.step()]
    step_rounds.synchronize(args.device)
    seconds = time.perf_counter() - begin
    results += [instance.step() for _ in range(steps - 1)]
    step_rounds.synchronize(args.device)
    return instance, torch.stack(results), seconds


def prepare(scenario: Scenario, args: argparse.Namespace) -> tuple[dict[str, Row], dict[str, Instance]]:
    """Build every contender, take its first step (compiling) and its check; rows and instances."""
    ranks = args.ranks
    rows: dict[str, Row] = {}
    instances: dict[str, Instance] = {}
    reference: torch.Tensor | None = None
    steps = 1 if scenario.name == "tp-block" else args.check_steps
    for contender in args.chosen:
        if scenario.name not in contender.scenarios:
            continue
        row = rows[contender.name] = Row(scenario.name, contender.name)
        _progress(ranks, f"{scenario.name}: {contender.name}: build and {steps} checked step(s) (the first compiles)")
        graphs = step_rounds.dynamo_graphs()
        try:
            instance, result, seconds = ranks.run(lambda c=contender: first_steps(scenario, c, steps, args))
            row.first_call_s = ranks.max([seconds])[0]
            if contender.dynamo:
                row.graphs = int(ranks.max([step_rounds.dynamo_graphs() - graphs])[0])
        except Exception as error:  # noqa: BLE001 - the row says what broke (on every rank); the run goes on
            row.fail("build and check steps", error)
            continue
        instances[contender.name] = instance
        if contender.name == REFERENCE:
            reference, row.check = result, "ok"
            continue
        if reference is None:
            row.detail = f"not checked: {REFERENCE} failed"
            continue
        reason, worst = compare(result, reference, scenario.tolerance)
        row.extra["max_abs_diff"] = ranks.max([worst])[0]
        agreed = ranks.first_error(reason)
        row.check, row.detail = ("ok", "") if agreed is None else ("mismatch", f"check: {agreed}")
    return rows, instances


# -- timing, memory and communication ------------------------------------------------------------------


def time_rounds(scenario: Scenario, rows: dict[str, Row], instances: dict[str, Instance],
                args: argparse.Namespace) -> None:
    """`--rounds` rounds of `--steps` steps per contender (step_rounds.run_rounds: its rotation
    depends on the round only, and a failure is agreed on by every rank before it is raised)."""
    ranks, device = args.ranks, args.device

    def measure_of(instance: Instance) -> Callable[[], float]:
        def steps() -> None:
            for _ in range(args.steps):
                instance.step()

        def measure() -> float:
            dist.barrier()
            seconds = ranks.run(lambda: step_rounds.time_block(steps, device) / args.steps)
            return ranks.max([seconds])[0]

        return measure

    def warm_up(instance: Instance) -> None:
        for _ in range(args.warmup):
            instance.step()
        step_rounds.synchronize(device)

    measures = {}
    for name, instance in instances.items():
        try:
            ranks.run(lambda i=instance: warm_up(i))
        except Exception as error:  # noqa: BLE001
            rows[name].fail("warm-up", error)
            continue
        measures[name] = measure_of(instance)
    _progress(ranks, f"{scenario.name}: {args.rounds} rounds of {args.steps} steps per contender")
    step_rounds.run_rounds(rows, measures, args.rounds)


def profile_pass(rows: dict[str, Row], instances: dict[str, Instance], args: argparse.Namespace) -> None:
    """CUDA: each timed contender's peak memory above its starting allocation, and its exposed
    communication per step under torch.profiler (the slowest rank's); a failure here is noted,
    the timing kept."""
    ranks = args.ranks
    for name, instance in instances.items():
        row = rows[name]
        if row.status != "ok":
            continue
        dist.barrier()
        try:
            peak, exposed, step = ranks.run(lambda i=instance: _memory_and_exposed(i, args.profile_steps))
        except RankFailure as error:
            row.detail = (row.detail + "; " if row.detail else "") + f"profile pass: {error}"
            continue
        row.extra["peak_bytes_per_rank"] = ranks.gather(peak)
        row.extra["exposed_comm_s"], row.extra["profiled_step_s"] = ranks.max([exposed, step])


def _memory_and_exposed(instance: Instance, steps: int) -> tuple[int, float, float]:
    """Peak bytes above the start over two steps; then, profiled, the exposed communication per
    step and the seconds per step under the profiler (the share's denominator: profiling slows it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    for _ in range(2):
        instance.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # device activity only: less host overhead
        begin = time.perf_counter()
        for _ in range(steps):
            instance.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
    return peak, exposed_communication(prof.events()) / steps, seconds / steps


# -- the run -------------------------------------------------------------------------------------------


def make_scenario(name: str, args: argparse.Namespace) -> Scenario:
    size, device, dtype = args.size_spec, args.device, args.dtype
    low = dtype == torch.bfloat16
    if name == "tp-block":  # bf16: the model suite's inference tolerance (model_suite.TOLERANCES)
        tolerance = (5e-2, 5e-2, True) if low else (1.3e-6, 1e-5, False)  # float32: assert_close's defaults
        return Scenario(name, (models.tp_block_input(size, device, dtype),), tolerance)
    seed = models.SEED + 2 + (args.ranks.rank if name in DATA_PARALLEL else 0)  # FSDP2: data parallel over ranks
    tolerance = (1.6e-2, 1e-3, False) if low else (1e-4, 1e-5, False)  # the loss is float32 either way
    vocab = models.GPT2_SHAPES[args.size].vocab if name == "fsdp2-gpt2" else None
    return Scenario(name, models.token_batch(size, seed, device, vocab), tolerance)


def run_scenario(name: str, args: argparse.Namespace) -> list[Row]:
    scenario = make_scenario(name, args)
    rows, instances = prepare(scenario, args)
    time_rounds(scenario, rows, instances, args)
    if args.device == "cuda":
        _progress(args.ranks, f"{name}: peak memory and exposed communication ({args.profile_steps} profiled steps)")
        profile_pass(rows, instances, args)
    instances.clear()
    torch._dynamo.reset()
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m benchmarks.distributed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated subset of {', '.join(c.name for c in CONTENDERS)}; 'wrapgen' names every "
                             f"wrapgen[...] (wrapgen.compile), 'wrapgen-dynamo' every wrapgen-dynamo[...] "
                             f"(torch.compile(backend='wrapgen')); {REFERENCE} always runs")
    parser.add_argument("--size", choices=tuple(models.SIZES), default="full")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--steps", type=int, default=10, help="steps per contender per round (default 10)")
    parser.add_argument("--check-steps", type=int, default=2,
                        help="training steps whose losses are checked against eager's (default 2)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before the rounds (default 2)")
    parser.add_argument("--profile-steps", type=int, default=3, help="CUDA: steps under torch.profiler (default 3)")
    parser.add_argument("--compile-optimizer", action="store_true",
                        help="training: compile optimizer.step with the contender's compiler too")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the page and its numbers here (rank 0)")
    args = parser.parse_args(argv)
    step_rounds.settle_device(parser, args)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    for option in ("rounds", "steps", "check_steps", "profile_steps"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    args.scenario_names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for name in args.scenario_names:
        if name not in SCENARIOS:
            parser.error(f"unknown scenario {name!r}; scenarios are: {', '.join(SCENARIOS)}")
    try:
        wanted = step_rounds.select([c.name for c in CONTENDERS], args.contenders, REFERENCE)
    except ValueError as error:
        parser.error(str(error))
    args.chosen = [c for c in CONTENDERS if c.name in wanted]
    args.size_spec = models.SIZES[args.size]
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return args


def init(device: str) -> Ranks:
    """Join the process group torchrun describes: NCCL (NVLink multicast off) or gloo."""
    if device == "cuda":
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=timedelta(minutes=10), device_id=local)
    else:
        dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    return Ranks(device)


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.ranks = ranks = init(args.device)
    try:
        reason = models.check_divisible(args.size_spec, ranks.world)
        if reason is not None:
            raise SystemExit(f"--size {args.size}: {reason}")
        from torch.distributed.device_mesh import init_device_mesh

        args.mesh = init_device_mesh(args.device, (ranks.world,))
        started = time.perf_counter()
        rows: list[Row] = []
        with step_rounds.raised_recompile_limits():
            for name in args.scenario_names:
                rows += run_scenario(name, args)
        minutes = (time.perf_counter() - started) / 60
        return report(rows, args, minutes, argv) if ranks.rank == 0 else []
    finally:
        dist.destroy_process_group()


def report(rows: list[Row], args: argparse.Namespace, minutes: float, argv: Sequence[str] | None) -> list[Path]:
    """Rank 0: print the table; with --out-dir, write the page and its numbers."""
    info = machine.collect(args.device)
    world, dtype = args.ranks.world, "bf16" if args.dtype == torch.bfloat16 else "fp32"
    command = (f"torchrun --nproc-per-node {world} -m benchmarks.distributed "
               + " ".join(sys.argv[1:] if argv is None else argv))
    settings = {
        "ranks": f"{world} ({'NCCL, NCCL_NVLS_ENABLE=0' if args.device == 'cuda' else 'gloo'}), one process per rank",
        "size": f"`{args.size}`, {dtype}: {args.size_spec.describe()}"
                + (f"; fsdp2-gpt2: {models.GPT2_SHAPES[args.size]}" if "fsdp2-gpt2" in args.scenario_names else ""),
        "optimizer": f"AdamW(lr={LR}, weight_decay=0.01, foreach=True), "
                     + ("compiled with the contender's compiler" if args.compile_optimizer else "not compiled"),
        "rounds × steps": f"{args.rounds} × {args.steps} (after the checked steps and {args.warmup} warm-up steps)",
        "run took": f"{minutes:.1f} min",
    }
    text = markdown(rows, info, settings, command)
    print(table(rows))
    print()
    print("\n".join(step_rounds.failures(rows)))
    if args.out_dir is None:
        return []
    payload = {"machine": info.as_dict(), "settings": settings | {
        "world": world, "size": args.size, "dtype": dtype, "rounds": args.rounds, "steps": args.steps,
        "check_steps": args.check_steps, "warmup": args.warmup, "compile_optimizer": args.compile_optimizer},
        "command": command, "results": step_rounds.rows_json(rows)}
    suite = f"distributed-{args.size}-{dtype}-{world}ranks"
    if args.scenario_names != list(SCENARIOS):
        suite += "-" + "-".join(args.scenario_names)
    if args.compile_optimizer:
        suite += "-compiled-optimizer"
    if args.threads:
        suite += f"-threads{args.threads}"
    paths = step_rounds.write(args.out_dir, machine.file_stem(info, suite), text, payload)
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
