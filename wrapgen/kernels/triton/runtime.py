"""What generated modules call to get their Triton kernels: write each kernel's source to
the cache, import it, compile it once (in parallel worker processes when a program has
several new kernels), and bind a launcher per kernel once, at import.

A kernel reads pointers that are 16-byte aligned (fresh allocations) or maybe not
(program inputs and their views). It is compiled assuming alignment, which lets Triton
vectorize; a launch whose maybe-unaligned argument is not aligned switches to a variant
compiled without that assumption (built the first time it is needed).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from wrapgen.cache import cache_root
from wrapgen.kernels.triton import compat

# Compile in worker processes when a program brings at least this many kernels not yet built.
# Starting workers (spawn, import torch and Triton) costs seconds: on the H100 a per-program
# pool of 16 workers put a transformer block's cold compile at ~11 s, against ~1 s for the
# same program once its kernels were in Triton's cache. So only large programs use the
# (then kept) pool; a few kernels compile one after another in this process.
PARALLEL_MIN = 16
PROGRESS_MIN = 8

_lock = threading.Lock()

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool,
)}


def source_path(source: str) -> Path:
    """Where a kernel's source lives: keyed by its hash (Triton reads the source back from it)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    directory = cache_root() / "triton"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"k_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    return path


def jit_function(source: str, name: str):
    """The `triton.JITFunction` named `name` defined by `source` (imported once per source)."""
    path = source_path(source)
    module_name = f"wrapgen_triton_{path.stem}"
    module = sys.modules.get(module_name) or compat.load_module(path, module_name)
    return getattr(module, name)


class KernelSpec:
    """A kernel's launch facts, read from its KernelDefinition metadata."""

    def __init__(self, name: str, source: str, metadata: tuple) -> None:
        meta = dict(metadata)
        self.name, self.source = name, source
        self.arg_names: tuple[str, ...] = tuple(meta["arg_names"])
        self.arg_types: tuple[str, ...] = tuple(meta["arg_types"])
        self.constexprs: dict[str, int] = dict(meta.get("constexprs", ()))
        self.num_warps = int(meta.get("num_warps", 4))
        self.unaligned = set(meta.get("unaligned", ()))
        self.device_index = torch.device(meta.get("device", "cuda")).index or 0

    def arg_kinds(self, assume_aligned: bool) -> list[tuple[str, object]]:
        kinds: list[tuple[str, object]] = []
        for name, kind in zip(self.arg_names, self.arg_types):
            if kind.startswith("ptr:"):
                aligned = assume_aligned or name not in self.unaligned
                kinds.append(("ptr", (_DTYPES[kind[4:]], aligned)))
            else:
                kinds.append(("int", kind == "int64"))
        return kinds

    def maybe_unaligned_positions(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.arg_names) if n in self.unaligned)


class TritonKernels:
    """The Triton kernels of one program, compiled and bound."""

    def __init__(self, kernels: list[tuple[str, str, tuple]]) -> None:
        self.specs = {name: KernelSpec(name, source, metadata) for name, source, metadata in kernels}
        self.functions = {name: jit_function(spec.source, name) for name, spec in self.specs.items()}
        warm_in_workers(list(self.specs.values()))
        self.launchers: dict[str, Callable[..., None]] = {}
        names = list(self.specs)
        for name in _progress(names, "compiling Triton kernels"):
            self.launchers[name] = self._launcher(self.specs[name])

    def launcher(self, name: str) -> Callable[..., None]:
        return self.launchers[name]

    def _compile(self, spec: KernelSpec, assume_aligned: bool):
        with _lock:
            return compat.compile_kernel(self.functions[spec.name], spec.arg_kinds(assume_aligned), spec.constexprs,
                                         spec.num_warps, spec.device_index)

    def _launcher(self, spec: KernelSpec) -> Callable[..., None]:
        fn = self.functions[spec.name]
        fast = compat.bind_launcher(self._compile(spec, True), fn, spec.constexprs, spec.device_index)
        positions = spec.maybe_unaligned_positions()
        if compat.interpreting() or not positions:
            return fast
        slow: list[Callable[..., None]] = []

        def launch(gx: int, gy: int, gz: int, stream: int, *args: torch.Tensor) -> None:
            for i in positions:
                if args[i].data_ptr() & 15:
                    if not slow:
                        slow.append(compat.bind_launcher(self._compile(spec, False), fn, spec.constexprs, spec.device_index))
                    slow[0](gx, gy, gz, stream, *args)
                    return
            fast(gx, gy, gz, stream, *args)

        return launch


def kernel_binaries(kernels: list[tuple[str, str, tuple]]) -> dict[str, tuple[compat.KernelBinary, compat.KernelBinary | None]]:
    """Each kernel's binary for a launcher outside Python (the C++ target): the variant compiled
    for 16-byte-aligned pointers and, for a kernel with maybe-unaligned inputs, the variant
    without that assumption (None otherwise)."""
    if compat.interpreting():
        raise RuntimeError("Triton's interpreter (TRITON_INTERPRET=1) builds no kernel binaries")
    specs = [KernelSpec(name, source, metadata) for name, source, metadata in kernels]
    warm_in_workers(specs)
    binaries = {}
    for spec in _progress(specs, "compiling Triton kernels"):
        fn = jit_function(spec.source, spec.name)
        variants = [True, False] if spec.maybe_unaligned_positions() else [True]
        built = []
        for assume_aligned in variants:
            with _lock:
                compiled = compat.compile_kernel(fn, spec.arg_kinds(assume_aligned), spec.constexprs, spec.num_warps,
                                                 spec.device_index)
            built.append(compat.binary_of(compiled))
        binaries[spec.name] = (built[0], built[1] if len(built) > 1 else None)
    return binaries


def warm_in_workers(specs: list[KernelSpec]) -> None:
    """Compile new kernels in worker processes; the compiles that follow then hit Triton's cache."""
    if compat.interpreting():
        return
    todo = [spec for spec in specs if not _marker(spec).exists()]
    if len(todo) < PARALLEL_MIN:
        return
    pool = compile_pool()
    futures = [
        pool.submit(compat.warm_cache_in_subprocess, str(source_path(s.source)), s.name, s.arg_kinds(True),
                    s.constexprs, s.num_warps)
        for s in todo
    ]
    for future in _progress(futures, "compiling Triton kernels (workers)"):
        future.result()
    for spec in todo:
        _marker(spec).touch()


_pool: ProcessPoolExecutor | None = None


def compile_pool() -> ProcessPoolExecutor:
    """One pool of compile workers per process, kept for later programs."""
    global _pool
    with _lock:
        if _pool is None:
            import multiprocessing

            workers = max(1, min(os.cpu_count() or 1, 16))
            _pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=compat.prepare_worker)
        return _pool


def _marker(spec: KernelSpec) -> Path:
    key = f"{spec.source}|{spec.arg_types}|{spec.constexprs}|{spec.num_warps}|{compat.version()}"
    return cache_root() / "triton" / f"built_{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def _progress(items: list, description: str):
    """A progress bar on stderr when there are many kernels."""
    if len(items) < PROGRESS_MIN:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=description, unit="kernel", file=sys.stderr, leave=False)
