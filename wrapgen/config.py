"""wrapgen's options: typed module attributes with environment overrides and `patch()`.

    wrapgen.config.target = "cpp"                # set for the process
    with wrapgen.config.patch(target="fx"): ...  # set for a block (also a decorator)

Each option reads its environment variable once, at import.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    name: str
    kind: type
    default: Any
    env: str
    help: str
    optional: bool = False
    choices: tuple[str, ...] = ()

    def parse_env(self) -> Any:
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        if self.kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{self.env}={raw!r} is not a boolean (use 1/0)")
        return self.kind(raw)

    def check(self, value: Any) -> None:
        if value is None and self.optional:
            return
        if not isinstance(value, self.kind) or (self.kind is int and isinstance(value, bool)):
            raise TypeError(f"config option {self.name!r} takes a {self.kind.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"config option {self.name!r} is one of {', '.join(self.choices)}; got {value!r}")


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("target", str, "python", "WRAPGEN_TARGET", "emitter to compile for: python, or a registered name"),
        Option("debug_dir", str, None, "WRAPGEN_DEBUG_DIR", "write each graph's IR and emitted code here", True),
        Option("check_finite", bool, False, "WRAPGEN_CHECK_FINITE", "fail a call whose float outputs hold NaN/Inf"),
        Option("cache_dir", str, None, "WRAPGEN_CACHE_DIR", "where emitted artifacts are cached (~/.cache/wrapgen)", True),
        Option("kernels", bool, True, "WRAPGEN_KERNELS", "generate fused kernels (Triton on GPU, C++ on CPU); off: library calls only"),
        Option(
            "cpu_kernels",
            str,
            "cpp",
            "WRAPGEN_CPU_KERNELS",
            "language of CPU kernels: cpp, or triton (runs on the CPU only under TRITON_INTERPRET=1)",
            choices=("cpp", "triton"),
        ),
        Option(
            "matmul_kernel_limit",
            int,
            32768,
            "WRAPGEN_MATMUL_KERNEL_LIMIT",
            "matrix products (mm, addmm) of static sizes with at most this many multiply-adds and a reduced "
            "length of at most 256 become generated kernels fused with the work around them; 0: always library calls",
        ),
        Option(
            "memory_planning",
            str,
            "reuse",
            "WRAPGEN_MEMORY_PLANNING",
            "none: allocate every buffer; reuse: reuse dead buffers; pooled: one pool per device per call",
            choices=("none", "reuse", "pooled"),
        ),
        Option(
            "sanitize",
            bool,
            False,
            "WRAPGEN_SANITIZE",
            "check every call of programs built for the interpret and python targets: poison freed and reused "
            "storage, catch undeclared writes, views past their storage and stale reads (SanitizerError); slow",
        ),
        Option(
            "overlap_collectives",
            bool,
            True,
            "WRAPGEN_OVERLAP_COLLECTIVES",
            "start each collective (all_reduce, all_gather, reduce_scatter) as early and wait for it as late as its "
            "dependencies allow, so communication overlaps computation; off: start and wait where the graph has them",
        ),
        Option(
            "cpu_huge_pages",
            bool,
            True,
            "WRAPGEN_CPU_HUGE_PAGES",
            "advise Linux to back CPU buffers of 2 MiB or more with transparent huge pages (madvise): "
            "a fresh buffer's first write then faults in 2 MiB at a time, not 4 KiB",
        ),
        Option(
            "triton_compile_workers_min",
            int,
            None,
            "WRAPGEN_TRITON_COMPILE_WORKERS_MIN",
            "compile a program's new Triton kernels in worker processes first when it has at least this many "
            "(unset: 2 once workers run, which a compile for CUDA starts while it traces, else 16; never in "
            "Triton's interpreter, which compiles nothing; 0: never, and no workers are started)",
            True,
        ),
        Option(
            "cuda_graphs",
            bool,
            False,
            "WRAPGEN_CUDA_GRAPHS",
            "record the capturable runs of a CUDA program as CUDA graphs (one per distinct size tuple) and replay "
            "them, so a call costs a few launches instead of one per kernel; CPU programs are unchanged",
        ),
        Option(
            "max_autotune",
            bool,
            False,
            "WRAPGEN_MAX_AUTOTUNE",
            "matrix products (mm, addmm, bmm) of static sizes become GEMM templates (Triton on GPU, C++ on CPU) "
            "with the pointwise work that consumes them fused into their epilogue, each chosen against the "
            "library call by benchmarking at compile time (winners cached on disk)",
        ),
        Option(
            "skinny_gemm_templates",
            bool,
            True,
            "WRAPGEN_SKINNY_GEMM_TEMPLATES",
            "on CUDA, a matrix product of static sizes with at most 16 rows over a weight of 256K+ elements "
            "(batch-1 decoding) is measured against a Triton matrix-vector template at compile time even without "
            "max_autotune, the faster kept (winners cached on disk)",
        ),
        Option(
            "misaligned_gemm_templates",
            bool,
            True,
            "WRAPGEN_MISALIGNED_GEMM_TEMPLATES",
            "on CUDA, a matrix product of static sizes whose operand or output rows are not 16-byte aligned (a "
            "vocabulary of 50257, say: cuBLAS then runs its slow unaligned kernels) is measured against Triton "
            "GEMM templates at compile time even without max_autotune, the faster kept (winners cached on disk)",
        ),
        Option(
            "max_autotune_gemm_backends",
            str,
            "aten,template",
            "WRAPGEN_MAX_AUTOTUNE_GEMM_BACKENDS",
            "candidates max_autotune measures: aten (the library call), template (generated GEMMs), or both",
            choices=("aten,template", "template", "aten"),
        ),
        Option(
            "multi_kernel",
            bool,
            False,
            "WRAPGEN_MULTI_KERNEL",
            "Triton reductions over a dynamic row length get persistent variants (one per power-of-two row "
            "bucket) beside the looped kernel; each call times them once per bucket and keeps the fastest",
        ),
        Option(
            "layout_optimization",
            bool,
            True,
            "WRAPGEN_LAYOUT_OPTIMIZATION",
            "run 2-d convolutions on CUDA in channels-last (input and weights copied per call, the layout "
            "flowing through the ops that follow; outputs keep eager's strides) so cuDNN never transposes",
        ),
        Option(
            "constant_masks",
            bool,
            True,
            "WRAPGEN_CONSTANT_MASKS",
            "attention masks that read no input and no weight are evaluated at compile time: one that masks "
            "nothing is dropped, the square causal mask becomes is_causal=True (off: every mask reaches attention)",
        ),
        Option(
            "bias_in_kernels",
            bool,
            True,
            "WRAPGEN_BIAS_IN_KERNELS",
            "on CUDA with generated kernels, a linear layer's addmm whose result only pointwise ops read runs as "
            "mm, its bias added by the kernel that reads the product (cuBLASLt's bias epilogue picks slower tiles); "
            "so does a convolution's bias where generated kernels read its result (ATen adds it in a pass of its own)",
        ),
        Option(
            "compile_backward_early",
            bool,
            True,
            "WRAPGEN_COMPILE_BACKWARD_EARLY",
            "under torch.compile, aot_autograd's backward graph is compiled with the forward, while only weights "
            "and inputs are live, not at the first backward call, when the forward's activations are (the GEMM "
            "measurements of the backward's compile then add to the training step's peak memory)",
        ),
    )
}

target: str = OPTIONS["target"].parse_env()
debug_dir: str | None = OPTIONS["debug_dir"].parse_env()
check_finite: bool = OPTIONS["check_finite"].parse_env()
cache_dir: str | None = OPTIONS["cache_dir"].parse_env()
kernels: bool = OPTIONS["kernels"].parse_env()
cpu_kernels: str = OPTIONS["cpu_kernels"].parse_env()
matmul_kernel_limit: int = OPTIONS["matmul_kernel_limit"].parse_env()
memory_planning: str = OPTIONS["memory_planning"].parse_env()
sanitize: bool = OPTIONS["sanitize"].parse_env()
overlap_collectives: bool = OPTIONS["overlap_collectives"].parse_env()
cpu_huge_pages: bool = OPTIONS["cpu_huge_pages"].parse_env()
triton_compile_workers_min: int | None = OPTIONS["triton_compile_workers_min"].parse_env()
cuda_graphs: bool = OPTIONS["cuda_graphs"].parse_env()
max_autotune: bool = OPTIONS["max_autotune"].parse_env()
max_autotune_gemm_backends: str = OPTIONS["max_autotune_gemm_backends"].parse_env()
misaligned_gemm_templates: bool = OPTIONS["misaligned_gemm_templates"].parse_env()
skinny_gemm_templates: bool = OPTIONS["skinny_gemm_templates"].parse_env()
multi_kernel: bool = OPTIONS["multi_kernel"].parse_env()
layout_optimization: bool = OPTIONS["layout_optimization"].parse_env()
constant_masks: bool = OPTIONS["constant_masks"].parse_env()
bias_in_kernels: bool = OPTIONS["bias_in_kernels"].parse_env()
compile_backward_early: bool = OPTIONS["compile_backward_early"].parse_env()

_module = sys.modules[__name__]


def validate(changes: dict[str, Any]) -> None:
    """Raise for an unknown option name or a value of the wrong type."""
    for name, value in changes.items():
        option = OPTIONS.get(name)
        if option is None:
            raise ValueError(f"unknown config option {name!r}; options are: {', '.join(OPTIONS)}")
        option.check(value)


def snapshot() -> dict[str, Any]:
    """Current values of all options (validated)."""
    values = {name: getattr(_module, name) for name in OPTIONS}
    validate(values)
    return values


@contextlib.contextmanager
def patch(changes: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[None]:
    """Set options for the duration of a `with` block (or a decorated function)."""
    updates = {**(changes or {}), **kwargs}
    validate(updates)
    saved = {name: getattr(_module, name) for name in updates}
    for name, value in updates.items():
        setattr(_module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_module, name, value)
