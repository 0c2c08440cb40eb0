"""What `benchmarks.distributed` reports: exposed communication from a profiler trace, the printed
table and the markdown page (header and failures from `benchmarks.step_rounds`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks import machine, step_rounds
from benchmarks.report import fmt_time
from benchmarks.step_rounds import Row

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted, disjoint intervals."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def uncovered(intervals: Iterable[Interval], cover: Iterable[Interval]) -> float:
    """The total length of `intervals`' union that no interval of `cover` overlaps."""
    covered = merge(cover)
    total, j = 0.0, 0
    for start, end in merge(intervals):
        while j < len(covered) and covered[j][1] <= start:
            j += 1
        position, k = start, j
        while k < len(covered) and covered[k][0] < end:
            total += max(0.0, covered[k][0] - position)
            position = max(position, covered[k][1])
            k += 1
        total += max(0.0, end - position)
    return total


def exposed_seconds(kernels: Iterable[tuple[str, float, float]]) -> float:
    """Exposed communication in (name, start µs, end µs) device activity: the time during which a
    communication kernel (its name contains "nccl") runs and no other kernel does, in seconds."""
    comm, other = [], []
    for name, start, end in kernels:
        (comm if "nccl" in name.lower() else other).append((start, end))
    return uncovered(comm, other) / 1e6


DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # kineto's activity types of work on the GPU


def exposed_communication(events: Sequence[Any]) -> float:
    """`exposed_seconds` of a torch.profiler trace's device events (`prof.events()`): every kernel,
    copy and fill the GPU ran, on any stream of this process; not the ranges that record_function
    annotations project onto the GPU's timeline, which would hide everything inside them."""
    from torch.autograd import DeviceType

    def work(event: Any) -> bool:
        kind = getattr(event, "activity_type", None)  # older torch: not recorded
        return (event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
                and (kind is None or kind in DEVICE_WORK))

    return exposed_seconds((e.name, e.time_range.start, e.time_range.end) for e in events if work(e))


# -- the report ----------------------------------------------------------------------------------------


def _peak_mib(row: Row) -> float | None:
    peaks = row.extra.get("peak_bytes_per_rank")
    return max(peaks) / 2**20 if peaks else None


def _exposed(row: Row) -> str:
    exposed, step = row.extra.get("exposed_comm_s"), row.extra.get("profiled_step_s")
    if exposed is None:
        return "—"
    share = f" ({exposed / step:.0%})" if step else ""
    return f"{exposed * 1e3:.3f}{share}"


def _ratio(rows: Sequence[Row], row: Row, name: str) -> str:
    other = next((x.median_s for x in rows if x.case == row.case and x.contender == name), None)
    median = row.median_s
    return step_rounds.fmt(other / median if other and median and row.contender != name else None, ".2f", "x")


def markdown_rows(rows: Sequence[Row]) -> list[str]:
    lines = ["| scenario | contender | status | ms/step (median) | min - max | vs eager | vs torch.compile "
             "| exposed comm ms/step | peak MiB (max rank) | first step | graphs | check | max abs diff |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        median = r.median_s
        spread = f"{min(r.round_times) * 1e3:.3f} - {max(r.round_times) * 1e3:.3f}" if median else "—"
        lines.append("| " + " | ".join(step_rounds.cell(c) for c in [
            r.case, r.contender, r.status, step_rounds.fmt(median and median * 1e3, ".3f"), spread,
            _ratio(rows, r, "eager"), _ratio(rows, r, "torch.compile"), _exposed(r),
            step_rounds.fmt(_peak_mib(r), ".1f"), fmt_time(r.first_call_s), step_rounds.fmt(r.graphs, "d"),
            step_rounds.CHECK_TEXT[r.check], step_rounds.fmt(r.extra.get("max_abs_diff"), ".1e"),
        ]) + " |")
    return lines


def table(rows: Sequence[Row]) -> str:
    """The printed summary: the page's table."""
    return "\n".join(markdown_rows(rows))


def markdown(rows: Sequence[Row], info: machine.MachineInfo, settings: dict[str, Any], command: str) -> str:
    lines = step_rounds.header(info, "wrapgen benchmarks: sharded models on several ranks", settings, command)
    lines += ["## Time per step", ""] + markdown_rows(rows) + [""]
    lines += step_rounds.failures(rows)
    lines += [
        "## Method", "",
        "- **tp-block**: the forward of the tensor-parallel block stack (no gradients); **tp-train**, **fsdp2** and",
        "  **fsdp2-gpt2** (transformers' GPT-2, dropout off, FSDP2 on each block and the root):",
        "  a training step: zero the gradients, forward to the loss, backward, AdamW step.",
        "- Every contender has its own copy of the model (and optimizer), from the same seed on every rank. It is",
        "  built and takes its first step (**first step**: the slowest rank's synchronized wall time of both, the",
        "  compile included wherever it happens, with the caches as found), then is checked: tp-block's output",
        "  against eager's on every rank (`torch.testing.assert_close`: float32 defaults; bf16 the model suite's",
        "  inference tolerance, rtol 5e-2 and atol 5e-2 of the output's largest magnitude: eager rounds every",
        "  intermediate to bf16, a fused kernel does not), training the losses of the first `check steps` steps",
        "  (float32 rtol 1e-4, atol 1e-5; bf16 rtol 1.6e-2, atol 1e-3; the loss is float32 either way), the",
        "  optimizer's updates part of them from the second step on. **check**",
        "  is ok when every rank agrees; **max abs diff** is the largest difference on any rank. **graphs**: graphs",
        "  dynamo compiled for the contender (torch.compile entry points).",
        "- Then each round times `steps` back-to-back steps of every contender, the order rotating by one each",
        "  round (the same on every rank), a `dist.barrier()` before each contender, synchronized before and after",
        "  (CUDA events on a GPU, the wall clock on CPU). A round's time per step is the slowest rank's; reported:",
        "  the median over rounds, and the fastest and slowest round.",
        "- CUDA only (else —): **peak MiB**: `torch.cuda.max_memory_allocated()` over two steps, after",
        "  `reset_peak_memory_stats()`, less the memory allocated before them (every contender's model stays",
        "  resident: what the step itself adds), the largest rank's. **exposed comm**: `profile steps` steps",
        "  under `torch.profiler` (device activity only); the time in which an NCCL kernel runs on the rank's GPU",
        "  and no other kernel, copy or fill does, per step, the slowest rank's; in brackets its share of a step",
        "  under the profiler (slower than the timed one). An NCCL kernel that waits for a late rank (host-bound",
        "  launches, rank skew) counts as exposed: the GPU waits on communication either way.",
        "- A contender that raises on any rank is marked ERROR on every rank with the lowest failing rank's",
        "  message, and left out of later rounds; the others go on. (One rank raising in the middle of a step",
        "  whose collectives the others entered cannot be recovered: those wait until the group's timeout.)",
        "",
    ]
    return "\n".join(lines)
