"""Choose a GEMM's implementation by measuring the candidates on the real sizes, once.

Candidates are the library call ("aten") and template instances (C++ tilings on the CPU,
Triton tile/warp/stage configurations on the GPU), as `config.max_autotune_gemm_backends`
allows. Template candidates compile together (the C++ ones as one library, built in
parallel; the Triton ones at once in the compile workers), then each runs on stand-in tensors of exactly
the operands' layouts: a warm-up call, then several timed calls, the median kept (robust
to a noisy, shared machine). The winner is cached on disk under the cache dir
(`autotune/`), keyed by op, sizes, strides, dtypes, the epilogue's code, the device and the
compiler versions: a second compile of the same program measures nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wrapgen import config
from wrapgen.cache import cache_root
from wrapgen.kernels.cpp.codegen import GeneratedKernel
from wrapgen.kernels.streams import clear_library_workspaces
from wrapgen.kernels.templates.problem import GemmProblem
from wrapgen.kernels.timing import seconds_per_call

ATEN = "aten"
stats = {"benchmarked": 0, "cache_hits": 0}


@dataclass(frozen=True)
class Candidate:
    tag: str
    kernel: GeneratedKernel | None  # None: the library call


@dataclass(frozen=True)
class Selection:
    choice: str
    kernel: GeneratedKernel | None  # the winning template instance (None: keep the library call)
    summary: str  # one line: the candidates and their times, the choice marked
    milliseconds: float | None = None  # the choice's measured time (None: not measured)


def select_gemm(problem: GemmProblem, language: str, name: str, backends: str | None = None,
                shortlist: bool = False) -> Selection:
    """The fastest implementation of `problem` (a template instance named `name`, or the library),
    among `backends` (default: `config.max_autotune_gemm_backends`); `shortlist`: only the
    template configurations that won on measured products (cheaper to compile)."""
    backends = backends or config.max_autotune_gemm_backends
    candidates = _candidates(problem, language, name, backends, shortlist)
    if "aten" in backends.split(","):
        candidates.insert(0, Candidate(ATEN, None))
    if not candidates:
        return Selection(ATEN, None, f"autotune {problem.describe()}: no candidates, library call")
    if len(candidates) == 1:
        only = candidates[0]
        return Selection(only.tag, only.kernel, f"autotune {problem.describe()}: {only.tag} (only candidate)")
    key = _cache_key(problem, language, candidates, backends)
    cached = _read_cache(key)
    if cached is not None and cached["choice"] in {c.tag for c in candidates}:
        stats["cache_hits"] += 1
        timings = cached["timings"]
        note = " cached"
    else:
        timings = _measure(problem, language, candidates)
        stats["benchmarked"] += 1
        note = ""
        finite = {t: v for t, v in timings.items() if v is not None}
        cached = {"choice": min(finite, key=finite.get) if finite else ATEN, "timings": timings}
        _write_cache(key, cached)
    choice = cached["choice"]
    parts = [f"{tag} {'failed' if ms is None else f'{ms:.4f}ms'}{'*' if tag == choice else ''}"
             for tag, ms in sorted(timings.items(), key=lambda kv: (kv[1] is None, kv[1] or 0))]
    summary = f"autotune {problem.describe()}{note}: " + ", ".join(parts)
    winner = next(c for c in candidates if c.tag == choice)
    return Selection(choice, winner.kernel, summary, timings.get(choice))


def _candidates(problem: GemmProblem, language: str, name: str, backends: str,
                shortlist: bool = False) -> list[Candidate]:
    if "template" not in backends.split(","):
        return []
    out = []
    if language == "cpp":
        from wrapgen.kernels.templates.cpp_gemm import cpp_configs, cpp_gemm_source

        for i, cfg in enumerate(cpp_configs(problem)):  # one library holds them all: distinct names
            out.append(Candidate(cfg.tag, cpp_gemm_source(problem, cfg, f"{name}_c{i}")))
    elif language == "triton":
        from wrapgen.kernels.templates.triton_gemm import triton_configs, triton_gemm_source
        from wrapgen.kernels.templates.triton_skinny import skinny, skinny_configs, skinny_gemm_source

        # a skinny product's shortlist is the skinny template alone: tensor-core tiles of 16+ rows
        # over one to a few rows lose to it and would only lengthen the compile
        tiles = [] if shortlist and skinny(problem) else triton_configs(problem, shortlist)
        for i, cfg in enumerate(tiles):
            out.append(Candidate(cfg.tag, triton_gemm_source(problem, cfg, f"{name}_c{i}")))
        for i, cfg in enumerate(skinny_configs(problem)):
            out.append(Candidate(cfg.tag, skinny_gemm_source(problem, cfg, f"{name}_s{i}")))
    return out


def precompile(requests: list[tuple[GemmProblem, str]], language: str, backends: str | None = None,
               shortlist: bool = False) -> int:
    """Compile the Triton candidates of a program's products (`(problem, name)` as `select_gemm`
    will get them) in one batch across the compile workers, before they are measured one by
    one: products compiled in turn each wait for a few compiles while most workers idle.
    Products whose winner is cached on disk, and repeats of one product, compile nothing.
    How many kernels it compiled."""
    from wrapgen.kernels.triton import compat

    if language != "triton" or compat.interpreting():
        return 0  # C++ candidates of one product build in parallel already; the interpreter compiles nothing
    backends = backends or config.max_autotune_gemm_backends
    pending: list[tuple[Candidate, GemmProblem]] = []
    seen: set[str] = set()
    for problem, name in requests:
        try:
            candidates = _candidates(problem, language, name, backends, shortlist)
        except NotImplementedError:  # an epilogue the template cannot render: left to select_gemm's caller
            continue
        everyone = ([Candidate(ATEN, None)] if "aten" in backends.split(",") else []) + candidates
        if len(everyone) < 2:
            continue
        key = _cache_key(problem, language, everyone, backends)
        cached = _read_cache(key)
        if key in seen or (cached is not None and cached["choice"] in {c.tag for c in everyone}):
            continue
        seen.add(key)
        pending += [(c, problem) for c in candidates]
    if len(pending) > 1:
        from wrapgen.kernels.templates.runners import precompile_triton

        print(f"wrapgen: compiling {len(pending)} GEMM template candidates of {len(seen)} products", file=sys.stderr)
        precompile_triton(pending)
    return len(pending)


# -- measuring ---------------------------------------------------------------------------------
def _stand_ins(problem: GemmProblem) -> dict[str, torch.Tensor]:
    """Random tensors with exactly the layouts the instance reads and writes (views of a filled
    storage: a broadcast operand's layout overlaps itself); the program's weights are read in
    place."""
    device = torch.device(problem.device)
    tensors = dict(problem.weights)
    for name, (sizes, strides, dtype) in problem.layouts.items():
        if name in tensors:
            continue
        extent = 1 + sum((s - 1) * abs(st) for s, st in zip(sizes, strides)) if all(sizes) else 0
        storage = torch.empty(extent, dtype=dtype, device=device)
        if dtype.is_floating_point:
            storage.normal_()
        else:
            storage.zero_()
        tensors[name] = storage.as_strided(sizes, strides)
    return tensors


def _library_call(problem: GemmProblem, tensors: dict[str, torch.Tensor]) -> Callable[[], None]:
    """The library call the program would make, plus (with an epilogue) one pass over the
    product standing in for the separate epilogue kernel it would still need."""
    a, b, out = tensors[problem.a.name], tensors[problem.b.name], tensors[problem.out.name]
    spare = torch.empty_like(out) if problem.epilogue is not None else None
    if problem.op == "addmm":
        bias = tensors[problem.bias.name]

        def call() -> None:
            torch.addmm(bias, a, b, beta=problem.beta, alpha=problem.alpha, out=out)
    else:
        product = torch.bmm if problem.op == "bmm" else torch.mm

        def call() -> None:
            product(a, b, out=out)
    if spare is None:
        return call

    def with_epilogue() -> None:
        call()
        spare.copy_(out)

    return with_epilogue


def _measure(problem: GemmProblem, language: str, candidates: list[Candidate]) -> dict[str, float | None]:
    """Each candidate's milliseconds per call. A program compiled with CUDA graphs runs its
    products inside graphs, with a cuBLAS workspace of their own: the one the library call
    made on the caller's stream while measured (32 MiB on Hopper) is freed again, not kept
    for nothing."""
    try:
        return _measure_here(problem, language, candidates)
    finally:
        if config.cuda_graphs and torch.device(problem.device).type == "cuda":
            clear_library_workspaces()


def _measure_here(problem: GemmProblem, language: str, candidates: list[Candidate]) -> dict[str, float | None]:
    tensors = _stand_ins(problem)
    runners: dict[str, Callable[[], None] | None] = {}
    templates = [c for c in candidates if c.kernel is not None]
    if language == "cpp":
        from wrapgen.kernels.templates.runners import cpp_runners

        runners.update(cpp_runners(templates, tensors))
    else:
        from wrapgen.kernels.templates.runners import triton_runners

        runners.update(triton_runners(templates, tensors, problem))
    if any(c.tag == ATEN for c in candidates):
        runners[ATEN] = _library_call(problem, tensors)
    cuda = torch.device(problem.device).type == "cuda"
    timings: dict[str, float | None] = {}
    progress = _progress(len(candidates), problem)
    for c in candidates:
        run = runners.get(c.tag)
        timings[c.tag] = None if run is None else _time(run, cuda)
        if progress is not None:
            progress.update()
    if progress is not None:
        progress.close()
    return timings


def _time(run: Callable[[], None], cuda: bool) -> float | None:
    """Median milliseconds per call (None when the candidate fails): on CUDA, batches of about
    1 ms timed with events, seven of them; on the host, batches of about 10 ms, five."""
    try:
        if cuda:
            return seconds_per_call(run, True, 1e-3, rounds=7) * 1e3
        return seconds_per_call(run, False, 1e-2, rounds=5, max_calls=25) * 1e3
    except Exception:  # a candidate that cannot run (resources, a compile or launch error) is not chosen
        return None


def _progress(total: int, problem: GemmProblem):
    print(f"wrapgen: autotuning {problem.describe()} ({total} candidates)", file=sys.stderr)
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="autotune", unit="candidate", file=sys.stderr, leave=False)


# -- the winner cache ------------------------------------------------------------------------------
def _versions(problem: GemmProblem, language: str) -> str:
    parts = [torch.__version__]
    if language == "cpp":
        from wrapgen.kernels.cpp.build import compiler_id

        parts.append(compiler_id())
    else:
        from wrapgen.kernels.triton import compat

        parts.append(str(compat.version()))
        if torch.device(problem.device).type == "cuda":
            parts.append(torch.cuda.get_device_name(torch.device(problem.device)))
    return "|".join(parts)


def _cache_key(problem: GemmProblem, language: str, candidates: list[Candidate], backends: str) -> str:
    """Op, sizes, strides, dtypes, device, compiler versions, and the candidates' code (which
    holds the epilogue): the same problem with another epilogue is measured on its own."""
    h = hashlib.sha256()
    for part in (problem.key(), language, _versions(problem, language), backends):
        h.update(part.encode() + b"\0")
    for c in candidates:
        h.update(c.tag.encode() + b"\0")
        if c.kernel is not None:
            h.update(c.kernel.source.replace(c.kernel.name, "KERNEL").encode() + b"\0")
    return h.hexdigest()[:40]


def _cache_path(key: str):
    folder = cache_root() / "autotune"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"gemm_{key}.json"


def _read_cache(key: str) -> dict | None:
    try:
        return json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return None


def _write_cache(key: str, entry: dict) -> None:
    path = _cache_path(key)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(entry, handle)
    os.replace(tmp, path)
