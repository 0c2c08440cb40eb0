"""Benchmark results as files: a markdown table, a PNG chart and a JSON dump of the raw numbers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.machine import MachineInfo

STATUS_TEXT = {"ok": "ok", "wrong": "WRONG (differs from eager)", "error": "ERROR (raised)"}


@dataclass
class Result:
    """One (workload, contender) cell. Numbers are None when not measured."""

    workload: str
    contender: str
    status: str  # "ok" | "wrong" | "error"
    detail: str = ""
    median_s: float | None = None
    compile_s: float | None = None
    peak_bytes: int | None = None
    bytes_moved: int | None = None  # memory-bound workloads: inputs read once + outputs written once
    round_times: list[float] = field(default_factory=list)  # each round's median (median_s: their median)
    base_bytes: int | None = None  # allocated when the contender started: inputs and weights (CUDA)
    requested_peak_above: int | None = None  # peak requested bytes above those at the start (CUDA)
    error: float | None = None  # first output's max |actual - eager| / max |eager|, worst tensor


@dataclass
class Report:
    info: MachineInfo
    profile: str
    plan: dict
    copy_bandwidth: float | None  # bytes/s
    copy_buffer_bytes: int
    workloads: dict[str, str]  # name -> sizes
    results: list[Result]
    elapsed_s: float = 0.0
    rounds: int = 1
    extra: dict = field(default_factory=dict)  # suite-specific settings, written to the JSON (dtype, ...)

    def time_of(self, workload: str, contender: str) -> float | None:
        for r in self.results:
            if r.workload == workload and r.contender == contender and r.status == "ok":
                return r.median_s
        return None

    def eager_time(self, workload: str) -> float | None:
        return self.time_of(workload, "eager")

    def vs_torch_compile(self, r: Result) -> float | None:
        """torch.compile's (default mode) time over this contender's: above 1 is faster."""
        inductor = self.time_of(r.workload, "torch.compile")
        if r.status != "ok" or inductor is None or not r.median_s or r.contender.startswith("torch.compile"):
            return None
        return inductor / r.median_s

    @staticmethod
    def spread(r: Result) -> float | None:
        """Half the range of the per-round medians, relative to their median."""
        if r.status != "ok" or len(r.round_times) < 2 or not r.median_s:
            return None
        return (max(r.round_times) - min(r.round_times)) / 2 / r.median_s

    def speedup(self, r: Result) -> float | None:
        eager = self.eager_time(r.workload)
        if r.status != "ok" or eager is None or not r.median_s:
            return None
        return eager / r.median_s

    def bandwidth_fraction(self, r: Result) -> float | None:
        if r.status != "ok" or not r.bytes_moved or not r.median_s or not self.copy_bandwidth:
            return None
        return r.bytes_moved / r.median_s / self.copy_bandwidth

    def contenders(self) -> list[str]:
        return list(dict.fromkeys(r.contender for r in self.results))


# -- formatting ----------------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_value(value: float | None, spec: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def table_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def ratio_grid(report: Report, contenders: list[str], ratio: Callable[[Result], float | None],
               first: str = "workload") -> list[str]:
    """A workload x contender table of `ratio(result)` (a failed cell shows its status)."""
    lines = [f"| {first} | " + " | ".join(contenders) + " |", "|---|" + "---:|" * len(contenders)]
    for workload in report.workloads:
        cells = []
        for name in contenders:
            r = next((x for x in report.results if x.workload == workload and x.contender == name), None)
            if r is None:
                cells.append("")
            elif r.status != "ok":
                cells.append(r.status)
            else:
                cells.append(fmt_value(ratio(r), ".2f", "x"))
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return lines


def header_lines(report: Report, title: str = "wrapgen benchmarks", settings: dict[str, str] | None = None) -> list[str]:
    """The title and the table of where and with what the run was made (`settings`: extra rows)."""
    info = report.info
    on_cuda = info.device == "cuda"
    lines = [
        f"# {title} — {info.device.upper()} — {info.date}",
        "",
        "| | |",
        "| --- | --- |",
        f"| date | {info.date} {info.time} |",
        f"| machine | {info.hostname} |",
        f"| CPU | {info.cpu} ({info.cores} logical cores; torch threads: {info.torch_threads}) |",
        f"| huge pages | {info.huge_pages} |",
    ]
    if on_cuda:
        lines.append(f"| GPU | {info.gpu} (CUDA {info.cuda}) |")
    lines += [
        f"| python | {info.python} |",
        f"| torch | {info.torch} |",
        f"| triton | {info.triton or 'not installed'} |",
        f"| wrapgen | {info.wrapgen} (commit {info.wrapgen_commit or 'unknown'}) |",
        f"| sizes | `{report.profile}` profile |",
        *(f"| {key} | {value} |" for key, value in (settings or {}).items()),
        f"| copy bandwidth | {fmt_value(report.copy_bandwidth and report.copy_bandwidth / 1e9, '.1f', ' GB/s')}"
        f" (`dst.copy_(src)`, {report.copy_buffer_bytes / 2**20:.0f} MiB buffer, read + write counted) |",
        f"| run took | {f'{report.elapsed_s / 60:.1f} min' if report.elapsed_s else 'not recorded'} |",
        "",
    ]
    if not on_cuda:
        lines += [
            "> CPU numbers from a shared machine are provisional: other processes compete for the",
            "> cores. Peak memory is not measured on CPU (n/a).",
            "",
        ]
    return lines


def markdown(report: Report) -> str:
    on_cuda = report.info.device == "cuda"
    lines = header_lines(report)
    lines += ["## Results", ""]
    header = ["workload", "contender", "status", "median time", "± rounds", "vs eager", "vs torch.compile",
              "cold compile", "peak memory", "% copy BW"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 7) + "|"]
    for r in report.results:
        if r.status != "ok":
            row = [r.workload, r.contender, STATUS_TEXT.get(r.status, r.status)] + ["—"] * 7
        else:
            peak = "n/a" if not on_cuda else fmt_value(None if r.peak_bytes is None else r.peak_bytes / 2**20, ".1f", " MiB")
            fraction = report.bandwidth_fraction(r)
            row = [
                r.workload,
                r.contender,
                "ok",
                fmt_time(r.median_s),
                fmt_value(report.spread(r) and report.spread(r) * 100, ".0f", "%"),
                fmt_value(report.speedup(r), ".2f", "x"),
                fmt_value(report.vs_torch_compile(r), ".2f", "x"),
                "—" if r.compile_s is None else f"{r.compile_s:.2f} s",
                peak,
                fmt_value(fraction and fraction * 100, ".0f", "%"),
            ]
        lines.append("| " + " | ".join(table_cell(c) for c in row) + " |")
    lines.append("")

    contenders = [c for c in report.contenders() if c != "eager"]
    if contenders:
        lines += ["## Speedup over eager", ""]
        lines += ratio_grid(report, contenders, report.speedup)
        lines.append("")

    failures = [r for r in report.results if r.status != "ok"]
    if failures:
        lines += ["## Failures", ""]
        for r in failures:
            lines.append(f"- **{r.workload} / {r.contender}** — {r.status}: `{table_cell(r.detail)[:500]}`")
        lines.append("")

    lines += ["## Workloads (float32)", "", "| workload | sizes |", "|---|---|"]
    lines += [f"| {name} | {sizes} |" for name, sizes in report.workloads.items()]
    lines += ["", "## Method", ""]
    plan = report.plan
    lines += [
        "- Every contender runs under `torch.no_grad()` on the same inputs. Its first output is",
        "  checked against eager's with `torch.testing.assert_close` (per-workload rtol/atol) before",
        "  anything is timed, and again on a warm call; a contender that raises or differs is",
        "  reported as ERROR / WRONG, not timed, and the run goes on.",
        f"- **median time**: {plan['warmup']} warm-up calls, then {plan['repeats']} samples; each sample",
        f"  times as many back-to-back calls as fill {plan['min_sample_s'] * 1e3:.0f} ms (at most"
        f" {plan['max_calls']}), with a device synchronize before and after, and divides by the count.",
        "  The median sample is reported.",
        f"- **rounds**: the whole measurement of a workload (build, check, timing) runs {report.rounds} time(s),",
        "  the contenders taking turns in each round, so slow drifts of the machine reach every",
        "  contender alike. Reported: the median over rounds of each round's median time (**± rounds**:",
        "  half the range of the per-round medians, relative to it), the median cold compile and",
        "  the largest peak memory.",
        "- **vs torch.compile**: torch.compile's (default mode) median time over the contender's.",
        "- **cold compile**: wall time from nothing to the first result: the build (`wrapgen.compile`;",
        "  `torch.compile` itself is lazy) plus the first synchronized call, with fresh caches —",
        "  torch.compile: `torch._dynamo.reset()`, Inductor's in-memory caches cleared,",
        "  `TORCHINDUCTOR_CACHE_DIR` / `TRITON_CACHE_DIR` set to a new empty directory and",
        "  `torch._inductor.config.force_disable_caches=True`; wrapgen: `wrapgen.config.patch(cache_dir=<new",
        "  empty directory>)`.",
        "  Before the workloads, each contender compiles and runs a tiny unrelated model once, so that",
        "  one-time process costs (imports, compile worker pools, device context) are not charged to",
        "  the first workload (not in `--quick` smoke runs).",
        "- **vs eager**: eager's median time over the contender's.",
        "- **peak memory** (CUDA): `torch.cuda.max_memory_allocated()` after",
        "  `torch.cuda.reset_peak_memory_stats()`, over the contender's whole life: build, first call",
        "  (so compile-time benchmarking and CUDA-graph recording count), warm-up and timed calls. It",
        "  includes the inputs and weights, the same for every contender; eager's reference output is",
        "  kept in host memory. Not measured on CPU (n/a).",
        "- **% copy BW** (memory-bound workloads only): bytes of the inputs (weights included) read once",
        "  plus the outputs written once, over the median time, as a fraction of the copy bandwidth",
        "  measured above.",
        "",
    ]
    return "\n".join(lines)


def chart(report: Report, path: Path) -> None:
    """Speedup over eager (bars from 1x) and cold compile time per workload and contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    workloads = list(report.workloads)
    contenders = [c for c in report.contenders() if c != "eager"]
    bar = 0.8 / max(1, len(contenders))
    height = max(3.5, 0.35 * len(workloads) * max(1, len(contenders)) + 1.5)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = []
    for j, name in enumerate(contenders):
        color = colors[(j + 1) % len(colors)]
        handles.append(Patch(color=color, label=name))
        for i, workload in enumerate(workloads):
            y = i + (j - (len(contenders) - 1) / 2) * bar
            r = next((x for x in report.results if x.workload == workload and x.contender == name), None)
            if r is None:
                continue
            if r.status != "ok":
                for axis in (left, right):
                    axis.text(1, y, f" {r.status.upper()}", va="center", fontsize=7, color="red")
                continue
            speedup = report.speedup(r)
            if speedup:
                left.barh(y, speedup - 1, left=1, height=bar, color=color)
                left.text(
                    speedup, y, f" {speedup:.2f}x ", va="center", ha="left" if speedup >= 1 else "right", fontsize=7
                )
            if r.compile_s:
                right.barh(y, r.compile_s, height=bar, color=color)
                right.text(r.compile_s, y, f" {r.compile_s:.2f}s", va="center", fontsize=7)
    left.axvline(1.0, color="black", linewidth=0.8)
    left.set_xscale("log")
    left.margins(x=0.15)
    left.set_xlabel("speedup over eager (eager = 1x; higher is better)")
    right.set_xscale("log")
    right.margins(x=0.15)
    right.set_xlabel("cold compile + first call, seconds (lower is better)")
    for axis, unit in ((left, "x"), (right, "s")):
        axis.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _, unit=unit: f"{value:g}{unit}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
    left.set_yticks(range(len(workloads)))
    left.set_yticklabels(workloads)
    left.set_ylim(len(workloads) - 0.5, -0.5)
    info = report.info
    device = f"{info.gpu} (CUDA)" if info.device == "cuda" else f"CPU: {info.cpu}, {info.torch_threads} threads"
    fig.suptitle(
        f"wrapgen benchmarks {info.date} — {device} — torch {info.torch}, wrapgen {info.wrapgen}"
        f" — {report.profile} sizes",
        fontsize=10,
    )
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: Report, out_dir: Path, stem: str, render: Callable[[Report], str] = markdown) -> list[Path]:
    """Write `<stem>.md` (by `render`), `<stem>.png` and `<stem>.json` into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png, raw = (out_dir / f"{stem}{ext}" for ext in (".md", ".png", ".json"))
    md.write_text(render(report))
    chart(report, png)
    payload = {
        "machine": report.info.as_dict(),
        "profile": report.profile,
        "plan": report.plan,
        "rounds": report.rounds,
        "elapsed_s": report.elapsed_s,
        "copy_bandwidth_bytes_per_s": report.copy_bandwidth,
        "workloads": report.workloads,
        **({"settings": report.extra} if report.extra else {}),
        "results": [
            asdict(r) | {"speedup": report.speedup(r), "vs_torch_compile": report.vs_torch_compile(r),
                         "copy_bw_fraction": report.bandwidth_fraction(r)}
            for r in report.results
        ],
    }
    raw.write_text(json.dumps(payload, indent=2) + "\n")
    return [md, png, raw]
