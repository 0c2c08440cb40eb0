"""Compile template candidates together and bind each to stand-in tensors, for the tuner.

C++ candidates build as one shared library (their objects compile in parallel and land in
the kernel cache, so the winner's object is reused when the program is built); Triton
candidates compile at once in the compile worker processes (`worker_pool`), which fill
Triton's cache for the in-process compile that binds each launcher.
A candidate that fails to build is left out (None), never chosen.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import sympy
import torch

from wrapgen.kernels.templates.problem import GemmProblem


def cpp_runners(candidates: list, tensors: dict[str, torch.Tensor]) -> dict[str, Callable[[], None] | None]:
    from wrapgen.kernels.cpp.build import KernelCompileError, load_library

    if not candidates:
        return {}
    try:
        library = load_library([c.kernel.source for c in candidates])
    except KernelCompileError:
        return {c.tag: None for c in candidates}
    runners: dict[str, Callable[[], None] | None] = {}
    for c in candidates:
        fn = getattr(library, c.kernel.name)
        fn.argtypes = [ctypes.c_void_p] * len(c.kernel.tensors)
        fn.restype = None
        pointers = [tensors[t].data_ptr() for t in c.kernel.tensors]
        runners[c.tag] = (lambda f=fn, p=pointers: f(*p))
    return runners


def triton_runners(candidates: list, tensors: dict[str, torch.Tensor],
                   problem: GemmProblem) -> dict[str, Callable[[], None] | None]:
    from wrapgen.kernels.triton import compat
    from wrapgen.kernels.triton.runtime import TritonKernels

    metadata = {c.tag: _metadata(c, problem) for c in candidates}
    if not compat.interpreting() and len(candidates) > 1:
        # compile every candidate at once in the worker processes: the compiles below then hit
        # Triton's cache (a candidate a worker failed on fails again below and is left out)
        precompile_triton([(c, problem) for c in candidates])

    def build(c) -> Callable[[], None] | None:
        try:
            kernels = TritonKernels([(c.kernel.name, c.kernel.source, metadata[c.tag])])
        except Exception:  # out of shared memory, an unsupported variant on this GPU: not a candidate
            return None
        launch = kernels.launcher(c.kernel.name)
        grid = [int(sympy.sympify(g)) for g in c.kernel.grid] + [1, 1, 1]
        args = [tensors[t] for t in c.kernel.tensors]
        stream = torch.cuda.current_stream().cuda_stream if torch.device(problem.device).type == "cuda" else None
        return lambda: launch(grid[0], grid[1], grid[2], stream, *args)

    return {c.tag: build(c) for c in candidates}


def _metadata(candidate, problem: GemmProblem) -> tuple:
    return (("device", problem.device), *candidate.kernel.metadata)


def precompile_triton(candidates: list[tuple]) -> None:
    """Build `(candidate, problem)` pairs' Triton kernels and launchers into Triton's cache in one
    batch across the compile workers; those built before are skipped (a candidate that fails to
    compile is left for its runner to refuse)."""
    from wrapgen.kernels.triton.runtime import KernelSpec, warm_in_workers

    warm_in_workers([KernelSpec(c.kernel.name, c.kernel.source, _metadata(c, problem)) for c, problem in candidates],
                    launchers=True, warn=False)
