"""How much of each real model wrapgen turns into generated kernels: lowers each model with
`wrapgen.lower` and counts generated kernels, their launches and the library calls
(ExternKernel lines) by op. The team tracks the goal 'leave no pointwise op as a library call'
with it: every `add`, `mul`, `clone`... left in the extern column is a kernel not generated.

    python -m benchmarks.model_lowering [--models all|gpt2,bert] [--dtype fp32|bf16]
                                        [--size auto|full|small] [--device cpu|cuda]
    python -m benchmarks.run --models all --lowering-report      (the same, from the benchmark CLI)
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import wrapgen
from benchmarks import models
from wrapgen.wrapper_ir import ExternKernel, KernelCall, KernelDefinition, Program

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def op_name(qualified: str) -> str:
    """`aten::addmm.out` -> `addmm`; other namespaces keep theirs (`quantized::linear`)."""
    namespace, _, rest = qualified.partition("::")
    name = rest.split(".")[0] if rest else namespace
    return name if namespace == "aten" else f"{namespace}::{name}"


@dataclass
class LoweringCounts:
    """What one lowered program is made of."""

    kernels: int = 0  # KernelDefinition lines: generated kernels
    launches: int = 0  # KernelCall lines
    extern: Counter = field(default_factory=Counter)  # ExternKernel lines by op name

    @property
    def extern_lines(self) -> int:
        return sum(self.extern.values())

    def by_op(self, limit: int | None = None) -> str:
        items = self.extern.most_common(limit)
        text = ", ".join(f"{name} {count}" for name, count in items)
        hidden = len(self.extern) - len(items)
        return text + (f", … ({hidden} more ops)" if hidden > 0 else "")


def count(program: Program) -> LoweringCounts:
    """Generated kernels, launches and library calls by op of a lowered program."""
    counts = LoweringCounts()
    for line in program.lines:
        if isinstance(line, KernelDefinition):
            counts.kernels += 1
        elif isinstance(line, KernelCall):
            counts.launches += 1
        elif isinstance(line, ExternKernel):
            counts.extern[op_name(line.op)] += 1
    return counts


def lower_family(family: models.ModelFamily, device: str, size: str, dtype: torch.dtype,
                 vision_impl: str = "auto") -> LoweringCounts:
    """Build one model (random weights, eval mode) and count its lowered program."""
    model, inputs = family.build(device, size, dtype, vision_impl)
    with torch.no_grad():
        return count(wrapgen.lower(model, inputs))


def report(families: list[models.ModelFamily], device: str, size: str, dtype_name: str,
           vision_impl: str = "auto", limit: int | None = 12) -> str:
    """A markdown table, one row per model (a failure is a row too, naming the error)."""
    dtype = DTYPES[dtype_name]
    lines = [
        f"## wrapgen lowering of the models — {device}, {size} sizes, {dtype_name}, torch {torch.__version__}",
        "",
        "| model | generated kernels | kernel launches | ExternKernel lines | library calls by op | lower time |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for family in families:
        start = time.perf_counter()
        try:
            counts = lower_family(family, device, size, dtype, vision_impl)
        except Exception as error:  # one model failing to lower is a finding, not the end of the report
            text = " ".join(f"{type(error).__name__}: {error}".split())[:300].replace("|", "\\|")
            lines.append(f"| {family.name} | — | — | — | ERROR: `{text}` | — |")
            continue
        seconds = time.perf_counter() - start
        lines.append(f"| {family.name} | {counts.kernels} | {counts.launches} | {counts.extern_lines} "
                     f"| {counts.by_op(limit)} | {seconds:.1f} s |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_lowering", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="all", help=f"'all' or a comma-separated subset of {', '.join(models.FAMILIES)}")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--size", choices=("auto", *models.SIZES), default="auto",
                        help="auto (default): full on cuda, small on cpu")
    parser.add_argument("--vision", choices=models.VISION_IMPLS, default="auto")
    parser.add_argument("--all-ops", action="store_true", help="list every op, not the 12 most frequent")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    try:
        models.select(args.models)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> str:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    families = models.select(args.models)
    models.check_available(families, args.vision)
    size = models.default_size(args.device) if args.size == "auto" else args.size
    text = report(families, args.device, size, args.dtype, args.vision, None if args.all_ops else 12)
    print(text)
    return text


if __name__ == "__main__":
    main()
