"""The markdown page of a model-suite run: per-call time, cold compile, peak memory above the
inputs, the distance from eager and the ratio to torch.compile, per model and contender.
(The chart and the JSON dump are report.py's, shared with the micro workloads.)"""

from __future__ import annotations

from benchmarks.report import STATUS_TEXT, Report, Result, fmt_time, fmt_value, header_lines, ratio_grid, table_cell


def peak_above_inputs(r: Result) -> int | None:
    """Peak bytes allocated over the contender's life minus those allocated when it started
    (weights and inputs): what compiling and running it cost on top of the model itself."""
    if r.peak_bytes is None or r.base_bytes is None:
        return None
    return r.peak_bytes - r.base_bytes


def results_table(report: Report) -> list[str]:
    on_cuda = report.info.device == "cuda"
    header = ["model", "contender", "status", "time per call", "± rounds", "vs eager", "vs torch.compile",
              "cold compile", "peak above inputs", "requested at peak", "max error / scale"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 8) + "|"]
    for r in report.results:
        error = fmt_value(r.error, ".1e")
        if r.status != "ok":
            row = [r.workload, r.contender, STATUS_TEXT.get(r.status, r.status)] + ["—"] * 7 + [error]
        else:
            peak = peak_above_inputs(r)
            row = [
                r.workload,
                r.contender,
                "ok",
                fmt_time(r.median_s),
                fmt_value(report.spread(r) and report.spread(r) * 100, ".0f", "%"),
                fmt_value(report.speedup(r), ".2f", "x"),
                fmt_value(report.vs_torch_compile(r), ".2f", "x"),
                "—" if r.compile_s is None else f"{r.compile_s:.2f} s",
                "n/a" if not on_cuda else fmt_value(None if peak is None else peak / 2**20, ".1f", " MiB"),
                "n/a" if not on_cuda else fmt_value(
                    None if r.requested_peak_above is None else r.requested_peak_above / 2**20, ".1f", " MiB"),
                error,
            ]
        lines.append("| " + " | ".join(table_cell(c) for c in row) + " |")
    return lines


def ratio_table(report: Report) -> list[str]:
    """Model x contender: torch.compile's time over the contender's (above 1: faster than it)."""
    contenders = [c for c in report.contenders() if not c.startswith("torch.compile")]
    return ratio_grid(report, contenders, report.vs_torch_compile, first="model")


def markdown(report: Report) -> str:
    settings = report.extra
    dtype = settings.get("dtype", "?")
    rows = {
        "suite": "real models (`python -m benchmarks.run --models ...`)",
        "dtype": f"{dtype} (token ids int64)",
        "tolerance": "; ".join(f"{task}: rtol {rtol:g}, atol {atol:g}" for task, (rtol, atol)
                               in settings.get("tolerances", {}).items()) + " (atol × each output's max magnitude)",
        "vision models": settings.get("vision") or "—",
        "transformers": settings.get("transformers") or "not installed",
        "torchvision": settings.get("torchvision") or "not importable",
    }
    lines = header_lines(report, "wrapgen model benchmarks", rows)
    lines += ["## Results", "", *results_table(report), ""]
    lines += ["## vs torch.compile", "", *ratio_table(report), ""]
    failures = [r for r in report.results if r.status != "ok"]
    if failures:
        lines += ["## Failures", ""]
        for r in failures:
            lines.append(f"- **{r.workload} / {r.contender}** — {r.status}: `{table_cell(r.detail)[:700]}`")
        lines.append("")
    lines += ["## Models (random weights, eval mode)", "", "| model | what, sizes |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in report.workloads.items()]
    plan = report.plan
    lines += [
        "",
        "## Method",
        "",
        "- Models are built from configs with random weights (nothing is downloaded), put in eval",
        "  mode (dropout off) and cast to the dtype. transformers models run without a KV cache and",
        "  return one tensor (logits, or BERT's last hidden state).",
        "- **inference**: under `torch.no_grad()`; wrapgen contenders are `wrapgen.compile(model,",
        "  inputs, target=...)`. **`-train` rows**: one training step, `loss.backward()` of the",
        "  next-token cross entropy (float32 logits) from cleared gradients; the loss module goes",
        "  through `torch.compile(backend='wrapgen', options={'target': ...})` (aot_autograd builds",
        "  the backward), `torch.compile()` or nothing (eager). The step returns the loss and every",
        "  parameter's gradient, and all of them are checked against eager's.",
        "- **correctness**: every output (and gradient) is compared with eager's by",
        "  `torch.testing.assert_close(rtol, atol × max|eager output|)`, on the first call and again",
        "  on a warm call; a contender that differs is WRONG and not timed. The atol is scaled by each",
        "  tensor's largest magnitude because a reordered reduction's rounding error scales with the",
        "  tensor, and model outputs and gradients range over orders of magnitude. fp32: 1e-3 (a",
        "  reordering costs ~1e-6 relative; 1e-3 still catches a wrong op); bf16: 5e-2, gradients",
        "  1e-1 (bf16 keeps 8 bits of mantissa, ~4e-3 per rounding, rounding points differ between a",
        "  fused kernel and eager's op-by-op results, and a backward compounds them: torch.compile's",
        "  own GPT-2 bf16 logits were 1.3e-2 and gradients 3.6e-2 of their scale from eager's on an",
        "  H100; a wrong op is off by O(1)). **max error / scale**: the largest |output - eager| over the",
        "  largest |eager|, worst tensor, on the first call.",
        f"- **time per call**: {plan['warmup']} warm-up calls, then {plan['repeats']} samples of as many",
        f"  back-to-back calls as fill {plan['min_sample_s'] * 1e3:.0f} ms (at most {plan['max_calls']}),",
        "  synchronized; the median sample. **rounds**: the whole measurement runs",
        f"  {report.rounds} time(s), the contenders taking turns each round; reported is the median of the",
        "  rounds' medians (± rounds: half their range, relative).",
        "- **cold compile**: the build plus the first synchronized call (a training step: forward and",
        "  backward compile), with fresh caches (see the micro-benchmark results for how).",
        "- **peak above inputs** (CUDA): `torch.cuda.max_memory_allocated()` over the contender's life",
        "  (build, first call, timed calls) minus `torch.cuda.memory_allocated()` when it started",
        "  (weights and inputs); eager's reference is kept in host memory. Not measured on CPU (n/a).",
        "- **requested at peak** (CUDA): the same, counted in the bytes requested from the caching",
        "  allocator (`requested_bytes.all` of `torch.cuda.memory_stats()`): without its rounding and",
        "  the unsplit remainders of the free blocks it hands out, which depend on what earlier",
        "  allocations left free. Two contenders holding the same tensors at their peak can differ",
        "  in the column before by a fraction of a MiB, and match here.",
        "- **vs torch.compile**: torch.compile's (default mode) time over the contender's: above 1x",
        "  the contender is faster.",
        "",
    ]
    return "\n".join(lines)
