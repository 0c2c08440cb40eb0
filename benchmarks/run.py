"""Run the benchmarks: every workload x every contender, then write the result files.

python -m benchmarks.run --device cpu|cuda [--workloads a,b] [--contenders eager,wrapgen]
                         [--repeats N] [--rounds N] [--quick] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks import contenders as contenders_mod
from benchmarks import machine, measure, report, workloads
from benchmarks.contenders import Contender
from benchmarks.measure import TimingPlan
from benchmarks.report import Report, Result
from benchmarks.workloads import Workload

RESULTS_DIR = Path(__file__).resolve().parent / "results"
COPY_BUFFER_BYTES = {"cuda": 512 * 2**20, "cpu": 256 * 2**20, "quick": 8 * 2**20}


def bench_one(
    workload: Workload,
    contender: Contender,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    reference: object,
    device: str,
    plan: TimingPlan,
    cache_root: str,
) -> Result:
    """Build, check, time and measure one contender on one workload; never raises."""
    result = Result(workload.name, contender.name, "error")
    try:
        with torch.no_grad():
            measure.reset_peak_memory(device)
            with contender.caches(cache_root):
                measure.synchronize(device)
                start = time.perf_counter()
                fn = contender.build(model, inputs)
                output, _ = measure.timed_call(lambda: fn(*inputs), device)
                cold_s = time.perf_counter() - start
            result.compile_s = cold_s if contender.compiles else None
            problem = measure.check_close(output, reference, workload.rtol, workload.atol)
            del output
            if problem is not None:
                result.status, result.detail = "wrong", problem
                return result
            median = measure.median_time(lambda: fn(*inputs), device, plan)
            problem = measure.check_close(fn(*inputs), reference, workload.rtol, workload.atol)
            if problem is not None:
                result.status, result.detail = "wrong", f"on a warm call: {problem}"
                return result
            peak = measure.peak_memory(device)
        result.status, result.median_s, result.peak_bytes = "ok", median, peak
        if workload.memory_bound:
            result.bytes_moved = measure.tensor_bytes(
                inputs, list(model.parameters()), list(model.buffers()), reference
            )
    except Exception as error:  # a contender's failure is a result, not the end of the run
        result.status, result.detail = "error", f"{type(error).__name__}: {error}"
    return result


def combine_rounds(rounds: list[Result], planned: int | None = None) -> Result:
    """One cell from its rounds (`planned` of them, a failed contender stops early): the failure
    if a round failed; else the median of the rounds' median times, the median cold compile and
    the largest peak memory."""
    planned = planned or len(rounds)
    failed = next((r for r in rounds if r.status != "ok"), None)
    if failed is not None:
        if planned > 1:
            failed.detail = f"round {rounds.index(failed) + 1} of {planned}: {failed.detail}"
        return failed
    first = rounds[0]
    times = [r.median_s for r in rounds]
    compiles = [r.compile_s for r in rounds if r.compile_s is not None]
    peaks = [r.peak_bytes for r in rounds if r.peak_bytes is not None]
    return Result(
        first.workload, first.contender, "ok",
        median_s=statistics.median(times),
        compile_s=statistics.median(compiles) if compiles else None,
        peak_bytes=max(peaks) if peaks else None,
        bytes_moved=first.bytes_moved,
        round_times=times,
    )


class _WarmUp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.tanh(x) @ x.T, dim=-1) + 1.0


def warm_up(contender: Contender, device: str, cache_root: str) -> None:
    """Compile and run a tiny unrelated model once, so that one-time process costs (imports,
    compile worker pools, device context) are not charged to the first workload's cold compile."""
    model, x = _WarmUp().to(device), torch.randn(8, 8, device=device)
    try:
        with torch.no_grad(), contender.caches(cache_root):
            fn = contender.build(model, (x,))
            fn(x)
            fn(x)
        measure.synchronize(device)
    except Exception:
        pass  # a contender that fails here fails on the workloads too, and is reported there
    torch._dynamo.reset()


def run_benchmarks(
    device: str,
    chosen: list[Workload],
    contenders: list[Contender],
    plan: TimingPlan,
    profile: str,
    copy_buffer_bytes: int,
    progress: bool = True,
    warm: bool = True,
    rounds: int = 1,
) -> Report:
    info = machine.collect(device)
    started = time.perf_counter()
    results: list[Result] = []
    cache_root = tempfile.mkdtemp(prefix="wrapgen-bench-")
    bar = tqdm(total=len(chosen) * len(contenders) * rounds + 2, disable=not progress, unit="run", file=sys.stderr)
    try:
        bar.set_description("warm-up")
        for contender in contenders if warm else ():
            warm_up(contender, device, cache_root)
        bar.update()
        bar.set_description("copy bandwidth")
        bandwidth = measure.copy_bandwidth(device, copy_buffer_bytes, plan)
        bar.update()
        for workload in chosen:
            try:
                model, inputs = workload.build(device, profile)
                with torch.no_grad():
                    reference = measure.host_copy(model(*inputs))
            except Exception as error:
                for contender in contenders:
                    detail = f"building the workload failed: {type(error).__name__}: {error}"
                    results.append(Result(workload.name, contender.name, "error", detail))
                    bar.update(rounds)
                measure.release(device)
                continue
            cells: dict[str, list[Result]] = {c.name: [] for c in contenders}
            for round_index in range(rounds):
                for contender in contenders:
                    tried = cells[contender.name]
                    if tried and tried[-1].status != "ok":  # failed once: reported, not retried
                        bar.update()
                        continue
                    bar.set_description(f"{workload.name} / {contender.name}"
                                        + (f" (round {round_index + 1}/{rounds})" if rounds > 1 else ""))
                    cells[contender.name].append(
                        bench_one(workload, contender, model, inputs, reference, device, plan, cache_root))
                    torch._dynamo.reset()
                    measure.release(device)
                    bar.update()
            results += [combine_rounds(cell, rounds) for cell in cells.values()]
            del model, inputs, reference
            gc.collect()
            measure.release(device)
    finally:
        bar.close()
        shutil.rmtree(cache_root, ignore_errors=True)
    return Report(
        info=info,
        profile=profile,
        plan={
            "repeats": plan.repeats,
            "warmup": plan.warmup,
            "min_sample_s": plan.min_sample_s,
            "max_calls": plan.max_calls,
        },
        copy_bandwidth=bandwidth,
        copy_buffer_bytes=copy_buffer_bytes,
        workloads={w.name: w.size_text(profile) for w in chosen},
        results=results,
        elapsed_s=time.perf_counter() - started,
        rounds=rounds,
    )


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
    args = parser.parse_args(argv)
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
    chosen = workloads.select(args.workloads)
    contenders = contenders_mod.select(contenders_mod.default_contenders(args.device), args.contenders)
    contenders += list(extra_contenders)
    if args.quick:
        plan = TimingPlan(repeats=args.repeats or 3, warmup=1, min_sample_s=0.001, max_calls=10)
        profile, copy_bytes = "quick", COPY_BUFFER_BYTES["quick"]
    else:
        plan = TimingPlan(repeats=args.repeats or 10)
        profile, copy_bytes = args.device, COPY_BUFFER_BYTES[args.device]
    rounds = args.rounds or (1 if args.quick else 3)
    result = run_benchmarks(
        args.device, chosen, contenders, plan, profile, copy_bytes, not args.no_progress, warm=not args.quick,
        rounds=rounds,
    )
    suffix = (f"-threads{args.threads}" if args.threads else "") + ("-quick" if args.quick else "")
    stem = machine.file_stem(result.info, suffix)
    paths = report.write(result, args.out_dir, stem)
    print(report.markdown(result).split("## Workloads")[0])
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
