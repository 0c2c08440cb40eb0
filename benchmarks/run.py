"""Run the benchmarks: every workload x every contender, then write the result files
(`micro-<device>-<date>-<machine>-<commit>.{md,png,json}`; the models: `models-<dtype>...`).

python -m benchmarks.run --device cpu|cuda [--workloads a,b] [--contenders eager,wrapgen]
                         [--repeats N] [--rounds N] [--quick] [--out-dir DIR]
python -m benchmarks.run --models all|gpt2,llama,bert,resnet50,vit_b16 [--dtype fp32|bf16]
                         [--size auto|full|small] [--tasks inference,training] [--lowering-report]
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import contenders as contenders_mod
from benchmarks import machine, model_suite, models, report, workloads
from benchmarks.contenders import Contender
from benchmarks.harness import run_benchmarks
from benchmarks.measure import TimingPlan

RESULTS_DIR = Path(__file__).resolve().parent / "results"
COPY_BUFFER_BYTES = {"cuda": 512 * 2**20, "cpu": 256 * 2**20, "quick": 8 * 2**20}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--workloads", default="", help=f"comma-separated subset of: {', '.join(workloads.WORKLOADS)}")
    parser.add_argument(
        "--contenders",
        default="",
        help="comma-separated subset, e.g. 'wrapgen' or 'torch.compile,wrapgen[python]' (eager always runs)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per contender (default 10; 3 quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="whole measurements per cell, contenders taking turns; medians reported (default 3; 1 quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repeats, no warm-up: a smoke run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help=f"default: {RESULTS_DIR}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    suite = parser.add_argument_group("real models (instead of the micro workloads)")
    suite.add_argument("--models", default=None,
                       help=f"run the model suite: 'all' or a comma-separated subset of {', '.join(models.FAMILIES)}")
    suite.add_argument("--dtype", choices=tuple(model_suite.DTYPES), default=None, help="default: fp32")
    suite.add_argument("--size", choices=("auto", *models.SIZES), default=None,
                       help="auto (default): full on cuda, small on cpu")
    suite.add_argument("--tasks", default=None,
                       help=f"comma-separated subset of {', '.join(model_suite.TASKS)} (default: both)")
    suite.add_argument("--vision", choices=models.VISION_IMPLS, default=None,
                       help="ResNet/ViT from torchvision or transformers (default auto: torchvision where it imports)")
    suite.add_argument("--lowering-report", action="store_true",
                       help="print each model's generated kernels and library calls by op instead of timing it")
    args = parser.parse_args(argv)
    model_flags = [f"--{n.replace('_', '-')}" for n in ("dtype", "size", "tasks", "vision") if getattr(args, n)]
    if args.lowering_report:
        model_flags.append("--lowering-report")
    if args.models is None and model_flags:
        parser.error(f"{', '.join(model_flags)} only apply to the model suite: add --models all (or a list)")
    if args.models is not None and args.workloads:
        parser.error("--workloads picks micro workloads and --models real models: run them separately")
    if args.models is not None:
        try:
            models.select(args.models)
            model_suite.parse_tasks(args.tasks)
        except ValueError as error:
            parser.error(str(error))
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv: Sequence[str] | None = None, extra_contenders: Sequence[Contender] = ()) -> list[Path]:
    """The command line; `extra_contenders` join the default ones (tests use it)."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        plan = TimingPlan(repeats=args.repeats or 3, warmup=1, min_sample_s=0.001, max_calls=10)
        profile, copy_bytes = "quick", COPY_BUFFER_BYTES["quick"]
    else:
        plan = TimingPlan(repeats=args.repeats or 10)
        profile, copy_bytes = args.device, COPY_BUFFER_BYTES[args.device]
    rounds = args.rounds or (1 if args.quick else 3)
    if args.models is not None:
        try:
            if args.lowering_report:
                print(model_suite.lowering_report(args))
                return []
            return model_suite.main(args, plan, rounds, copy_bytes, extra_contenders)
        except models.MissingDependency as error:
            raise SystemExit(f"error: {error}") from error
    chosen = workloads.select(args.workloads)
    contenders = contenders_mod.select(contenders_mod.default_contenders(args.device), args.contenders)
    contenders += list(extra_contenders)
    result = run_benchmarks(
        args.device, chosen, contenders, plan, profile, copy_bytes, not args.no_progress, warm=not args.quick,
        rounds=rounds,
    )
    suite = "micro" + "".join(f"-{w.name}" for w in chosen if args.workloads)  # a subset names its workloads
    suite += (f"-threads{args.threads}" if args.threads else "") + ("-quick" if args.quick else "")
    stem = machine.file_stem(result.info, suite)
    paths = report.write(result, args.out_dir, stem)
    print(report.markdown(result).split("## Workloads")[0])
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
