"""What generated modules call to get their Triton kernels: write each kernel's source to
the cache, import it, compile it once (warmed first in parallel worker processes when a
program has many new kernels: `worker_pool.py`), and bind a launcher per kernel once, at import.

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
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path

import torch

from wrapgen import config
from wrapgen.cache import cache_root
from wrapgen.kernels.triton import compat
from wrapgen.kernels.triton.worker_pool import Outcome, compile_pool

# Compile in worker processes when a program brings at least this many kernels not yet built
# (config.triton_compile_workers_min overrides it). Starting workers (import torch and Triton)
# costs seconds: on the H100 a per-program pool of 16 workers put a transformer block's cold
# compile at ~11 s, against ~1 s for the same program once its kernels were in Triton's cache.
# So a cold pool is started only for large programs. A compile for CUDA starts the pool while
# it traces (`start_workers_early`), and from then on any two new kernels go to the workers:
# one after another here, each also builds Triton's C launcher for its signature (~0.35 s).
PARALLEL_MIN = 16
STARTED_MIN = 2
PROGRESS_MIN = 8

_lock = threading.Lock()
_prefetch_lock = threading.Lock()
_prefetched: dict[Path, Future] = {}  # kernels lowering sent to the workers, by marker, until a target waits

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
        tmp.write_text(source, encoding="utf-8")  # user kernels may hold any text
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
        self.num_stages = int(meta.get("num_stages", 1))  # software pipelining depth (GEMM templates)
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

    def pointer_positions(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.arg_types) if kind.startswith("ptr:"))


class TritonKernels:
    """The Triton kernels of one program, compiled and bound."""

    def __init__(self, kernels: list[tuple[str, str, tuple]]) -> None:
        self.specs = {name: KernelSpec(name, source, metadata) for name, source, metadata in kernels}
        self.functions = {name: jit_function(spec.source, name) for name, spec in self.specs.items()}
        warm_in_workers(list(self.specs.values()), launchers=True)
        self.launchers: dict[str, Callable[..., None]] = {}
        names = list(self.specs)
        for name in _progress(names, "compiling Triton kernels"):
            self.launchers[name] = self._launcher(self.specs[name])

    def launcher(self, name: str) -> Callable[..., None]:
        return self.launchers[name]

    def _compile(self, spec: KernelSpec, assume_aligned: bool):
        with _lock:
            return compat.compile_kernel(self.functions[spec.name], spec.arg_kinds(assume_aligned), spec.constexprs,
                                         spec.num_warps, spec.device_index, spec.num_stages)

    def _launcher(self, spec: KernelSpec) -> Callable[..., None]:
        fn = self.functions[spec.name]
        if compat.interpreting():
            return compat.bind_launcher(self._compile(spec, True), fn, spec.constexprs, spec.device_index)
        # One Python frame per launch: the addresses, the alignment check and the native call in
        # one closure. Triton's launcher takes a pointer argument as an address: given a tensor
        # it calls data_ptr() and asks the driver about the pointer, about half a microsecond per
        # argument (a compiled optimizer step passes 444). The program's input checks and its own
        # allocations already place every tensor on the kernel's device.
        native, head, tail = compat.launch_parts(self._compile(spec, True), spec.constexprs, spec.device_index)
        unaligned = spec.maybe_unaligned_positions()
        pointers = spec.pointer_positions()
        every_argument = pointers == tuple(range(len(spec.arg_types)))
        slow: list[Callable[..., None]] = []

        def unaligned_launch(gx: int, gy: int, gz: int, stream: int, args: tuple) -> None:
            if not slow:
                slow.append(compat.bind_launcher(self._compile(spec, False), fn, spec.constexprs, spec.device_index))
            slow[0](gx, gy, gz, stream, *args)

        def launch(gx: int, gy: int, gz: int, stream: int, *args: torch.Tensor | int | float | None) -> None:
            try:
                if every_argument:
                    values = [a.data_ptr() for a in args]
                else:
                    values = list(args)
                    for i in pointers:
                        values[i] = values[i].data_ptr()
            except AttributeError:  # a pointer given as an address already, or None (null)
                values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
            for i in unaligned:
                if (values[i] or 0) & 15:
                    unaligned_launch(gx, gy, gz, stream, args)
                    return
            native(gx, gy, gz, stream, *head, *values, *tail)

        return launch


def kernel_binaries(kernels: list[tuple[str, str, tuple]], unaligned_too: bool = True,
                    ) -> dict[str, tuple[compat.KernelBinary, compat.KernelBinary | None]]:
    """Each kernel's binary for a launcher outside Python (the C++ target): the variant compiled
    for 16-byte-aligned pointers and, for a kernel with maybe-unaligned inputs and `unaligned_too`,
    the variant without that assumption (None otherwise)."""
    if compat.interpreting():
        raise RuntimeError("Triton's interpreter (TRITON_INTERPRET=1) builds no kernel binaries")
    specs = [KernelSpec(name, source, metadata) for name, source, metadata in kernels]
    # Both variants are built now where a package embeds them, so both warm in the workers:
    # compiled one after another here, the unaligned ones doubled a CUDA model's cold build.
    warm_in_workers(specs, unaligned_too=unaligned_too)
    binaries = {}
    for spec in _progress(specs, "compiling Triton kernels"):
        fn = jit_function(spec.source, spec.name)
        variants = [True, False] if unaligned_too and spec.maybe_unaligned_positions() else [True]
        built = []
        for assume_aligned in variants:
            with _lock:
                compiled = compat.compile_kernel(fn, spec.arg_kinds(assume_aligned), spec.constexprs, spec.num_warps,
                                                 spec.device_index, spec.num_stages)
            built.append(compat.binary_of(compiled))
        binaries[spec.name] = (built[0], built[1] if len(built) > 1 else None)
    return binaries


def unaligned_binary(name: str, source: str, metadata: tuple) -> compat.KernelBinary:
    """The variant of a kernel without the 16-byte alignment assumption, compiled here (a C++
    model built in this process asks for it on the first launch with an unaligned pointer)."""
    spec = KernelSpec(name, source, metadata)
    with _lock:
        compiled = compat.compile_kernel(jit_function(spec.source, spec.name), spec.arg_kinds(False), spec.constexprs,
                                         spec.num_warps, spec.device_index, spec.num_stages)
    return compat.binary_of(compiled)


def warm_in_workers(specs: list[KernelSpec], unaligned_too: bool = False, launchers: bool = False,
                    warn: bool = True) -> None:
    """Compile new kernels in worker processes; the compiles that follow then hit Triton's cache.
    A kernel a worker could not compile is compiled here, where its error (if any) is raised.
    `unaligned_too`: also the variant without the 16-byte alignment assumption, for kernels
    with maybe-unaligned pointers (the C++ target builds both up front). `launchers`: also
    Triton's host launchers (the Python target launches through them; the C++ target has its own).
    Kernels `prefetch` sent to the workers during lowering are waited for, not sent again.
    `warn=False`: failures are expected (GEMM template candidates beyond the GPU's resources)."""
    wanted = [(spec, True) for spec in specs]
    if unaligned_too:
        wanted += [(spec, False) for spec in specs if spec.maybe_unaligned_positions()]
    todo = [(spec, aligned) for spec, aligned in wanted if not _built(spec, aligned, launchers)]
    futures = [_take_prefetched(spec, aligned) for spec, aligned in todo]
    in_flight = [(spec, aligned, future) for (spec, aligned), future in zip(todo, futures) if future is not None]
    rest = [item for item, future in zip(todo, futures) if future is None]
    threshold = workers_min()
    if threshold == 0 or len(todo) < threshold:
        rest = []  # a few new kernels: those not already in the workers compile here
    if not rest and not in_flight:
        return
    bar = _bar(len(rest) + len(in_flight), "compiling Triton kernels (workers)")
    requests = [(f"{spec.name}|{aligned}", worker_request(spec, aligned, launchers)) for spec, aligned in rest]
    outcomes: list[Outcome] = compile_pool().run(requests, None if bar is None else lambda _: bar.update()) if rest else []
    done = [(_marker(spec, aligned, launchers), outcome) for (spec, aligned), outcome in zip(rest, outcomes)]
    for spec, aligned, future in in_flight:
        done.append((_marker(spec, aligned, True), future.result()))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    for marker, outcome in done:
        if outcome.error is None:
            marker.touch()
    failed = [outcome for _, outcome in done if outcome.error is not None]
    if failed and warn:
        first = failed[0]
        warnings.warn(f"{len(failed)} Triton kernel(s) were not compiled in a worker, so they compile in this process; "
                      f"the first, {first.key}: {(first.error or '').strip().splitlines()[-1]}", RuntimeWarning,
                      stacklevel=2)


def prefetch(name: str, source: str, metadata: tuple) -> None:
    """Send a kernel to the compile workers the moment lowering has generated it (its aligned
    variant and Triton's launcher for it), so compiles overlap the rest of the lowering; the
    target's `warm_in_workers` later waits for it. Only once workers run (a CUDA compile starts
    them while it traces) and never in the interpreter."""
    if config.triton_compile_workers_min == 0 or compat.interpreting():
        return
    pool = compile_pool()
    if not pool.started():
        return
    spec = KernelSpec(name, source, metadata)
    marker = _marker(spec, True, True)
    with _prefetch_lock:
        if marker in _prefetched or marker.exists():
            return
        future = pool.submit(f"{name}|True|prefetched", worker_request(spec, True, True))
        _prefetched[marker] = future
    future.add_done_callback(lambda done: _prefetch_finished(marker, done))


def _prefetch_finished(marker: Path, future: Future) -> None:
    """A prefetch answered: mark the kernel built (when it was) and stop tracking it, so a kernel
    no target ever waits for (a program lowered, not built) is not held. A failure is retried by
    the target's warm-up, which reports it."""
    if future.result().error is None:
        marker.touch()
    with _prefetch_lock:
        if _prefetched.get(marker) is future:
            del _prefetched[marker]


def _take_prefetched(spec: KernelSpec, aligned: bool) -> Future | None:
    """The in-flight prefetch that builds this kernel variant, if any (it is then no longer tracked)."""
    if not aligned:
        return None
    with _prefetch_lock:
        return _prefetched.pop(_marker(spec, True, True), None)


def worker_request(spec: KernelSpec, aligned: bool, launcher: bool) -> tuple:
    """A worker request's arguments (compat.warm_cache_in_subprocess's parameters)."""
    return (str(source_path(spec.source).resolve()), spec.name, spec.arg_kinds(aligned), spec.constexprs,
            spec.num_warps, spec.device_index, spec.num_stages, launcher, compat.device_capability(spec.device_index))


def _built(spec: KernelSpec, aligned: bool, launcher: bool) -> bool:
    """Whether a worker built this variant (with its launcher when `launcher`) into Triton's cache."""
    return _marker(spec, aligned, launcher).exists() or (not launcher and _marker(spec, aligned, True).exists())


def workers_min() -> int:
    """How many new kernels a program needs to use compile workers (0: never)."""
    if config.triton_compile_workers_min is not None:
        return config.triton_compile_workers_min
    if compat.interpreting():
        return 0
    return STARTED_MIN if compile_pool().started() else PARALLEL_MIN


def start_workers_early(values: Iterable[object]) -> None:
    """Start the compile workers now, in the background, when `values` (a program's example
    inputs and parameters) hold a CUDA tensor: their start-up, seconds of importing torch and
    Triton, then overlaps tracing and lowering instead of delaying the kernel compiles. A no-op
    when workers are off (`triton_compile_workers_min=0`) or Triton interprets."""
    if config.triton_compile_workers_min == 0 or compat.interpreting():
        return
    if any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values):
        compile_pool().start()


def _marker(spec: KernelSpec, aligned: bool = True, launcher: bool = False) -> Path:
    """The file that says a worker built this kernel (and its launcher) into Triton's cache."""
    key = f"{spec.source}|{spec.arg_types}|{spec.constexprs}|{spec.num_warps}|{spec.num_stages}|{compat.version()}"
    key += "" if aligned else "|unaligned"
    key += "|launcher" if launcher else ""
    return cache_root() / "triton" / f"built_{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def _progress(items: list, description: str):
    """`items`, with a progress bar on stderr when there are many kernels."""
    if len(items) < PROGRESS_MIN:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=description, unit="kernel", file=sys.stderr, leave=False)


def _bar(total: int, description: str):
    """A progress bar on stderr for `total` kernels, or None when they are few (or tqdm is missing)."""
    if total < PROGRESS_MIN:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit="kernel", file=sys.stderr, leave=False)
