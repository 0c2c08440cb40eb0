"""The suite's page: per suite the pass rate and the geometric mean against torch.compile of each
contender, the models below 1.0x, then per model every contender's time, cold compile and peak,
wrapgen's lowered program (kernels, launches, library calls by op) and every failure's reason."""

from __future__ import annotations

import math
from collections import defaultdict

from benchmarks.model_report import ratio_table, results_table
from benchmarks.report import Report, header_lines, table_cell
from benchmarks.suite import catalog

INDUCTOR = "torch.compile"


def _suite_of(report: Report, workload: str) -> str:
    """The row's suite (`huggingface (bf16)`); a training step's rows make their own group
    (`huggingface training (bf16)`): a step's speedup is not an inference speedup."""
    name, tag, dtype = workload.partition(" @")
    model = name.removesuffix(catalog.TRAINING_SUFFIX)
    suite = report.extra.get("suites", {}).get(model + tag + dtype, model.split("/")[0])
    if model == name:
        return suite
    plain, paren, rest = suite.partition(" (")
    return f"{plain} training{paren}{rest}"


def _note(workload: str) -> str:
    """The catalog's note on a model (what its architecture shows), by its row name."""
    key = workload.split(" @")[0].removesuffix("-train")
    return next((e.note for e in catalog.entries() if e.key == key), "")


def _contenders(report: Report) -> list[str]:
    return [c for c in report.contenders() if c != "eager"]


def summary_table(report: Report) -> list[str]:
    """Suite x contender: models passing (equal to eager's within tolerance) of those built, and the
    geometric mean of torch.compile's time over the contender's where both passed."""
    contenders = _contenders(report)
    by_suite: dict[str, list[str]] = defaultdict(list)
    for workload in report.workloads:
        by_suite[_suite_of(report, workload)].append(workload)
    lines = ["| suite | models | " + " | ".join(f"{c}: passed, geomean vs {INDUCTOR}" for c in contenders) + " |",
             "|---|---:|" + "---|" * len(contenders)]
    for suite, workloads in by_suite.items():
        cells = []
        for contender in contenders:
            results = [r for r in report.results if r.contender == contender and r.workload in workloads]
            passed = sum(r.status == "ok" for r in results)
            ratios = [x for r in results if r.status == "ok" and (x := report.vs_torch_compile(r))]
            mean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios and contender != INDUCTOR else None
            cells.append(f"{passed}/{len(results)}" + (f", {mean:.2f}x" if mean else ""))
        lines.append(f"| {suite} | {len(workloads)} | " + " | ".join(cells) + " |")
    return lines


def below_inductor(report: Report) -> list[str]:
    """Every (model, contender) that passed but ran slower than torch.compile."""
    slow = [(r.workload, r.contender, x) for r in report.results
            if r.status == "ok" and r.contender.startswith("wrapgen") and (x := report.vs_torch_compile(r)) and x < 1.0]
    return [f"- {w} / {c}: {x:.2f}x" for w, c, x in sorted(slow, key=lambda t: t[2])] or ["- none"]


def _program_cells(counts: dict | str) -> list[str]:
    if isinstance(counts, str):
        return ["—", "—", "—", f"did not lower: `{table_cell(counts)}`"]
    ops = sorted(counts["library_calls"].items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{op} {n}" for op, n in ops)
    return [str(counts["kernels"]), str(counts["launches"]), str(sum(counts["library_calls"].values())),
            table_cell(text) or "—"]


def _normalized(counts: dict | str) -> dict | str:
    """Counts with aot_autograd's backend-specific attention ops (`_scaled_dot_product_flash_attention_for_cpu`,
    `..._cudnn_attention`) named as the op they implement: both entries call the same kernel."""
    if isinstance(counts, str):
        return counts
    calls: dict[str, int] = defaultdict(int)
    for op, n in counts["library_calls"].items():
        calls["scaled_dot_product_attention" if op.startswith("_scaled_dot_product_") else op] += n
    return {**counts, "library_calls": dict(calls)}


def lowering_table(report: Report) -> list[str]:
    """Per model, wrapgen.compile's program (kernels, launches, library calls by op), and whether
    torch.compile(backend="wrapgen") handed wrapgen graphs that became the same program."""
    lowering = report.extra.get("lowering") or {}
    if not lowering:
        return []
    lines = ["| model | generated kernels | launches | library calls | library calls by op | through torch.compile |",
             "|---|---:|---:|---:|---|---|"]
    for name, entries in lowering.items():
        compiled, dynamo = entries.get("compile", "—"), entries.get("dynamo", "—")
        if isinstance(dynamo, str):
            other = f"did not lower: `{table_cell(dynamo)}`"
        elif _normalized(dynamo) == _normalized(compiled):
            other = "the same" if dynamo == compiled else "the same (attention as the backend's SDPA kernel)"
        else:
            cells = _program_cells(dynamo)
            other = f"{cells[0]} kernels, {cells[1]} launches, library: {cells[3]}"
        lines.append(f"| {name} | " + " | ".join(_program_cells(compiled)) + f" | {other} |")
    return lines


def markdown(report: Report) -> str:
    settings = report.extra
    rows = {
        "suite": f"`{settings.get('command', 'python -m benchmarks.suite')}`",
        "dtype, size": f"{settings.get('dtype')}, {settings.get('size')} (token ids int64)",
        "tolerance": "; ".join(f"{task}: rtol {rtol:g}, atol {atol:g}" for task, (rtol, atol)
                               in settings.get("tolerances", {}).items()) + " (atol × each output's max magnitude)",
        "transformers": settings.get("transformers") or "not installed",
        "torchvision": settings.get("torchvision") or "not importable",
    }
    if settings.get("partial"):
        rows["cut short"] = f"**a partial page**: {settings['partial']} (the run stopped before its end)"
    lines = header_lines(report, "wrapgen model suite", rows)
    lines += ["## Per suite", "", *summary_table(report), "",
              "Below 1.0x torch.compile (passed, slower):", "", *below_inductor(report), ""]
    not_built = settings.get("not_built") or {}
    if not_built:
        reasons = defaultdict(list)
        for name, why in not_built.items():
            reasons[why].append(name)
        lines += ["Not built here:", ""] + [f"- {', '.join(names)}: {why}" for why, names in reasons.items()] + [""]
    lines += ["## vs torch.compile", "", *ratio_table(report), ""]
    lines += ["## Results", "", *results_table(report), ""]
    failures = [r for r in report.results if r.status != "ok"]
    if failures:
        lines += ["## Failures", ""]
        lines += [f"- **{r.workload} / {r.contender}** — {r.status}: `{table_cell(r.detail)[:500]}`" for r in failures]
        lines.append("")
    if settings.get("lowering"):
        lines += ["## wrapgen's programs", "", *lowering_table(report), ""]
    code = settings.get("code") or {}
    if code:
        lines += ["## Code per model", "", "Rows of this page ran on different code (a commit, `+dirty` with",
                  "the hash of a modified tree):", ""]
        by_code = defaultdict(list)
        for name, commit in code.items():
            by_code[commit].append(name)
        lines += [f"- `{commit}`: {', '.join(names)}" for commit, names in by_code.items()] + [""]
    lines += ["## Models (random weights, eval mode)", "", "| model | what |", "|---|---|"]
    lines += [f"| {name} | {table_cell(text or _note(name))} |" for name, text in report.workloads.items()]
    lines += ["", "## Method", "",
              "- Models are built from configs (transformers) or constructors (timm, torchvision) with random",
              "  weights, in eval mode, cast to the dtype; transformers models run without a KV cache and return",
              "  one tensor. Each contender is built with empty compile caches (its first call is its cold",
              "  compile), checked against eager's output (`torch.testing.assert_close`-style, the tolerance",
              "  above), then timed; rounds rotate the contenders' order; the median over rounds is reported.",
              "- A training step compiles through torch.compile for every compiler; wrapgen's, through",
              "  `backend=\"wrapgen\"`, is timed once, in the `wrapgen[t]` column (`wrapgen-dynamo[t]` would run",
              "  the same compiled step).",
              "- A result that fails that comparison is checked against the same model (or step) run in float64",
              "  (PyTorch's benchmark runner's criterion: each output's root-mean-square error from float64's at",
              "  most 2x eager's in fp32, 3x in bf16/fp16, plus a tenth of 1e-3 / 1e-2), which decides for",
              "  gradients that are zero in exact arithmetic and hold only rounding noise, and for deep fp32",
              "  convolution networks on CUDA, where cuDNN's TF32 rounding moves eager's output and every",
              "  compiler's (Inductor's included) beyond the direct tolerance.",
              f"- Plan: {report.plan.get('repeats')} samples per measurement, {report.rounds} round(s)."]
    return "\n".join(lines).rstrip() + "\n"
