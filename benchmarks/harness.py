"""The measuring loop: every workload x every contender, in rounds, each cell built, checked
against eager, timed and measured; a contender's failure is a result, not the end of the run."""

from __future__ import annotations

import copy
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from benchmarks import machine, measure, training
from benchmarks.contenders import Contender
from benchmarks.measure import TimingPlan
from benchmarks.report import Report, Result
from benchmarks.workloads import Workload


def build_callable(
    workload: Workload, contender: Contender, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> Callable[..., Any]:
    """What a contender runs for a workload: its build of the model, or for a training workload
    the step around its `train_build` of the loss module."""
    if workload.training:
        return training.compiled_step(model, contender.train_build, inputs)
    return contender.build(model, inputs)


def bench_one(
    workload: Workload,
    contender: Contender,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    reference: object,
    device: str,
    plan: TimingPlan,
    cache_root: str,
    exact: object | None = None,
) -> Result:
    """Build, check, time and measure one contender on one workload; never raises. `exact`, the
    workload's float64 result, decides where the comparison with eager's fails
    (`measure.float64_check`)."""
    result = Result(workload.name, contender.name, "error")
    try:
        with torch.no_grad():
            result.base_bytes = measure.reset_peak_memory(device)
            requested_base = measure.requested_memory(device)
            with contender.caches(cache_root):
                measure.synchronize(device)
                start = time.perf_counter()
                fn = build_callable(workload, contender, model, inputs)
                output, _ = measure.timed_call(lambda: fn(*inputs), device)
                cold_s = time.perf_counter() - start
            result.compile_s = cold_s if contender.compiles else None
            result.error = measure.relative_error(output, reference)
            problem = _check(output, reference, workload, exact)
            del output
            if problem is not None:
                result.status, result.detail = "wrong", problem
                return result
            median = measure.median_time(lambda: fn(*inputs), device, plan)
            problem = _check(fn(*inputs), reference, workload, exact)
            if problem is not None:
                result.status, result.detail = "wrong", f"on a warm call: {problem}"
                return result
            peak = measure.peak_memory(device)
            requested = measure.requested_memory(device)
        if requested is not None and requested_base is not None:
            result.requested_peak_above = requested[1] - requested_base[0]
        result.status, result.median_s, result.peak_bytes = "ok", median, peak
        if workload.memory_bound:
            result.bytes_moved = measure.tensor_bytes(
                inputs, list(model.parameters()), list(model.buffers()), reference
            )
    except Exception as error:  # a contender's failure is a result, not the end of the run
        result.status, result.detail = "error", f"{type(error).__name__}: {error}"
    return result


def _check(output: object, reference: object, workload: Workload, exact: object | None) -> str | None:
    problem = measure.check_close(output, reference, workload.rtol, workload.atol, workload.atol_scaled)
    if problem is None or exact is None:
        return problem
    return None if measure.float64_check(output, reference, exact) is None else problem


def float64_result(model: torch.nn.Module, inputs: tuple, device: str, grad: bool = True) -> object | None:
    """The workload's result computed in float64 (a copy of the model and of its floating inputs),
    as a host copy; None where it cannot be computed. Computed before any contender runs, so no
    contender's peak memory holds the float64 model. `grad`: a training step's backward runs."""
    try:
        exact_model = copy.deepcopy(model).double()
        exact_inputs = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
        with torch.set_grad_enabled(grad):
            return measure.host_copy(exact_model(*exact_inputs))
    except Exception:  # noqa: BLE001 - an op without float64: the direct comparison alone decides
        return None
    finally:
        measure.release(device)


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
    peak = max(rounds, key=lambda r: -1 if r.peak_bytes is None else r.peak_bytes)  # its baseline with it
    errors = [r.error for r in rounds if r.error is not None]
    requested = [r.requested_peak_above for r in rounds if r.requested_peak_above is not None]
    return Result(
        first.workload, first.contender, "ok",
        median_s=statistics.median(times),
        compile_s=statistics.median(compiles) if compiles else None,
        peak_bytes=peak.peak_bytes,
        base_bytes=peak.base_bytes,
        requested_peak_above=max(requested) if requested else None,
        error=max(errors) if errors else None,
        bytes_moved=first.bytes_moved,
        round_times=times,
    )


def contenders_for(workload: Workload, contenders: list[Contender]) -> list[Contender]:
    """The contenders that take part in a workload: for a training step, those that can train."""
    return [c for c in contenders if not workload.training or c.train_build is not None]


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


def _row_line(r: Result) -> str:
    """One finished cell as a line: workload, contender, status, median, cold compile, peak."""
    parts = [f"{r.workload} / {r.contender}: {r.status}"]
    if r.median_s is not None:
        parts.append(f"{r.median_s * 1e3:.3f} ms")
    if r.compile_s is not None:
        parts.append(f"compile {r.compile_s:.1f} s")
    if r.peak_bytes is not None:
        parts.append(f"peak {r.peak_bytes / 2**20:.1f} MiB")
    if r.status != "ok":
        parts.append(r.detail[:300])
    return "  ".join(parts)


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
    checkpoint: Callable[[Report], None] | None = None,
) -> Report:
    """Every workload x contender, in rounds; `checkpoint` gets the report so far after each
    workload (a long run cut short keeps what it measured)."""
    info = machine.collect(device)
    started = time.perf_counter()
    results: list[Result] = []
    cache_root = tempfile.mkdtemp(prefix="wrapgen-bench-")
    runs = sum(len(contenders_for(w, contenders)) for w in chosen) * rounds
    bar = tqdm(total=runs + 2, disable=not progress, unit="run", file=sys.stderr)
    try:
        bar.set_description("warm-up")
        for contender in contenders if warm else ():
            warm_up(contender, device, cache_root)
        bar.update()
        bar.set_description("copy bandwidth")
        bandwidth = measure.copy_bandwidth(device, copy_buffer_bytes, plan)
        bar.update()
        for position, workload in enumerate(chosen):
            active = contenders_for(workload, contenders)
            try:
                model, inputs = workload.build(device, profile)
                with torch.no_grad():
                    reference = measure.host_copy(model(*inputs))
                measure.release(device)  # what eager's reference call left cached is no contender's
            except Exception as error:
                for contender in active:
                    detail = f"building the workload failed: {type(error).__name__}: {error}"
                    results.append(Result(workload.name, contender.name, "error", detail))
                    bar.update(rounds)
                measure.release(device)
                continue
            cells: dict[str, list[Result]] = {c.name: [] for c in active}
            exact = (float64_result(model, inputs, device, grad=workload.training)
                     if workload.training or workload.float64_fallback else None)
            for round_index in range(rounds):
                # Each round starts with the next contender: none always runs first or last (GPU
                # clocks and the allocator's state drift over a run).
                shift = round_index % len(active) if active else 0
                for contender in active[shift:] + active[:shift]:
                    tried = cells[contender.name]
                    if tried and tried[-1].status != "ok":  # failed once: reported, not retried
                        bar.update()
                        continue
                    bar.set_description(f"{workload.name} / {contender.name}"
                                        + (f" (round {round_index + 1}/{rounds})" if rounds > 1 else ""))
                    cells[contender.name].append(
                        bench_one(workload, contender, model, inputs, reference, device, plan, cache_root, exact))
                    torch._dynamo.reset()
                    measure.release(device)
                    bar.update()
            finished = [combine_rounds(cell, rounds) for cell in cells.values()]
            for row in finished:  # a run cut short still shows what it measured
                tqdm.write(_row_line(row), file=sys.stderr)
            results += finished
            if checkpoint is not None:
                done = chosen[:position + 1]
                checkpoint(_report(info, profile, plan, bandwidth, copy_buffer_bytes, done, results, started, rounds))
            del model, inputs, reference
            gc.collect()
            measure.release(device)
    finally:
        bar.close()
        shutil.rmtree(cache_root, ignore_errors=True)
    return _report(info, profile, plan, bandwidth, copy_buffer_bytes, chosen, results, started, rounds)


def _report(info: machine.MachineInfo, profile: str, plan: TimingPlan, bandwidth: float | None,
            copy_buffer_bytes: int, chosen: list[Workload], results: list[Result], started: float,
            rounds: int) -> Report:
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
        results=list(results),
        elapsed_s=time.perf_counter() - started,
        rounds=rounds,
    )
