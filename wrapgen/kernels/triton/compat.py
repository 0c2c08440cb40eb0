"""Everything that depends on Triton's version: loading, compiling and launching a kernel.

Triton's compile and launch entry points move between releases; wrapgen touches them only
here. Written against Triton 3.6 (and checked there):

- a kernel is compiled once with `JITFunction.warmup`, from argument *types* (no tensors):
  pointers as `MockTensor`s (16-byte aligned, or deliberately not), integers as example
  values chosen so they are neither 1 nor a multiple of 16 (no value specialization);
- launching calls the compiled kernel's launcher directly:
  `run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata,
  enter_hook, exit_hook, *kernel_args)` — the same call `JITFunction.run` makes after
  binding arguments, without the per-call binding and cache lookup; for a kernel without
  scratch memory, one level lower: `run.launch`, the C function `run` calls, with
  `(function, cooperative=False, pdl=False, None, None)` in front (`launch_parts`);
- the C++ target launches the compiled binary itself (`binary_of`): the cubin, the function
  name, shared memory and warps from the compiled kernel's metadata, and the number of
  trailing scratch-pointer parameters Triton adds to every kernel (3.6: global and profile
  scratch; wrapgen's kernels need no scratch memory, so both are passed as null);
- under `TRITON_INTERPRET=1` (CPU) there is no binary: launches go through
  `kernel[grid](*args)`, which runs the interpreter on CPU tensors.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    import triton

    return triton.__version__


def load_module(path: Path, module_name: str) -> ModuleType:
    """Import a kernel's source file (Triton reads a kernel's source back through inspect)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class _Pointer:
    """Stands in for a tensor argument at compile time: a dtype and an address to judge alignment by."""

    def __init__(self, dtype: torch.dtype, aligned: bool) -> None:
        self.dtype = dtype
        self._address = 0 if aligned else 4

    def data_ptr(self) -> int:
        return self._address


def example_int(wide: bool) -> int:
    """An integer argument value that Triton will not specialize on (not 1, not 16-divisible)."""
    return 2**40 + 3 if wide else 3


def compile_kernel(
    jit_fn,
    arg_kinds: list[tuple[str, object]],
    constexprs: dict[str, int],
    num_warps: int,
    device_index: int = 0,
    num_stages: int = 1,
):
    """Compile `jit_fn` for arguments described by `arg_kinds`: ("ptr", (dtype, aligned)) or
    ("int", wide). Returns the compiled kernel (or the JITFunction itself when interpreting)."""
    if interpreting():
        return jit_fn
    with torch.cuda.device(device_index):
        return _warmup(jit_fn, arg_kinds, constexprs, num_warps, num_stages)


def _warmup(jit_fn, arg_kinds: list[tuple[str, object]], constexprs: dict[str, int], num_warps: int, num_stages: int):
    """`jit_fn` compiled (or found in Triton's cache) for the current device, not launched."""
    ptxas_in_use()  # the key this compile looks up is the one the workers stored it under
    args = [_Pointer(*info) if kind == "ptr" else example_int(info) for kind, info in arg_kinds]
    # no overflow asserts on int32 arithmetic: Triton adds them to every kernel built with
    # debug=True (those that read indices from data); Inductor turns them off too
    return jit_fn.warmup(*args, grid=(1,), num_warps=num_warps, num_stages=num_stages, sanitize_overflow=False,
                         **constexprs)


def bind_launcher(compiled, jit_fn, constexprs: dict[str, int], device_index: int = 0) -> Callable[..., None]:
    """A launcher `launch(grid_x, grid_y, grid_z, stream, *args)` bound once to the compiled kernel."""
    if interpreting():
        def launch_interpreted(gx: int, gy: int, gz: int, stream: object, *args: object) -> None:
            jit_fn[(gx, gy, gz)](*args, **constexprs)

        return launch_interpreted
    native, head, tail = launch_parts(compiled, constexprs, device_index)

    def launch(gx: int, gy: int, gz: int, stream: int, *args: object) -> None:
        native(gx, gy, gz, stream, *head, *args, *tail)

    return launch


def launch_parts(compiled, constexprs: dict[str, int], device_index: int = 0) -> tuple[Callable[..., None], tuple, tuple]:
    """`(native, head, tail)`: a launch is `native(gx, gy, gz, stream, *head, *args, *tail)`.

    Where the kernel needs no scratch memory and no cooperative or PDL launch (wrapgen's own
    kernels), `native` is the C launcher Triton built for the kernel's signature: the Python
    frame of the launcher class (two scratch-allocation closures per launch) is skipped, about
    a microsecond of every launch of the python target. Otherwise it is `compiled.run`."""
    with torch.cuda.device(device_index):
        run = compiled.run  # loads the binary onto the device on first access
    function, packed = compiled.function, compiled.packed_metadata
    tail = tuple(constexprs.values())
    hooks = (packed, None, None, None)  # launch metadata, enter and exit hooks: none
    native = getattr(run, "launch", None)
    plain = (
        version().startswith("3.6.")  # the argument order below is CudaLauncher.__call__'s in 3.6
        and type(run).__name__ == "CudaLauncher"
        and callable(native)
        and not getattr(run, "global_scratch_size", 1)
        and not getattr(run, "profile_scratch_size", 1)
        and getattr(run, "launch_cooperative_grid", None) is False
        and getattr(run, "launch_pdl", None) is False
    )
    if plain:
        # CudaLauncher.__call__ passes (function, cooperative, pdl, global scratch, profile scratch)
        return native, (function, False, False, None, None, *hooks), tail
    return run, (function, *hooks), tail


@dataclass(frozen=True)
class KernelBinary:
    """A compiled GPU kernel as a C++ launcher needs it."""

    function_name: str
    image: bytes  # the cubin
    shared_bytes: int
    num_warps: int
    scratch_params: int  # trailing pointer parameters after the kernel's own arguments


def binary_of(compiled) -> KernelBinary:
    """The launch facts of a kernel compiled by `compile_kernel` (not in the interpreter)."""
    meta = compiled.metadata
    image = compiled.asm.get("cubin")
    if not isinstance(image, bytes):
        raise RuntimeError(f"Triton produced no cubin for {meta.name} (backend {getattr(meta, 'backend_name', '?')})")
    if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False):
        raise RuntimeError(f"{meta.name}: clusters, cooperative and PDL launches are not supported by the C++ launcher")
    scratch = 0
    for field in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(meta, field):
            scratch += 1
            if getattr(meta, field):
                raise RuntimeError(f"{meta.name} needs {field}={getattr(meta, field)} bytes of scratch memory")
    return KernelBinary(meta.name, image, int(meta.shared), int(meta.num_warps), scratch)


def prepare_worker() -> None:
    """Start-up of a compile worker: import what every compile needs once."""
    import triton  # noqa: F401
    import triton.language  # noqa: F401


_keyed_ptxas: str | None = None  # the ptxas this process's kernel keys were last brought in line with


def ptxas_in_use() -> str | None:
    """The ptxas Triton compiles CUDA kernels with now (None: no CUDA backend), with this
    process's kernel cache keys brought in line with it.

    Triton looks the tool up (TRITON_PTXAS_PATH, else its own) on every compile but memoizes
    its version, a part of every kernel's cache key, the first time. torch.compile points
    TRITON_PTXAS_PATH at torch's own ptxas when it first compiles, so a process that compiled
    before then went on keying kernels by the old version while compile workers started since
    keyed them by the new one: none of their compiles was found here, and each compiled again,
    one after another (measured: a max_autotune MLP's cold compile 56 s instead of 18). When
    the tool differs from the one last seen, the memo is dropped and the key follows the tool."""
    global _keyed_ptxas
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler as nvidia_compiler

        path = knobs.nvidia.ptxas.path
    except Exception:  # noqa: BLE001 - no CUDA backend in this Triton, or no ptxas at all
        return None
    if path != _keyed_ptxas:
        memo = getattr(nvidia_compiler, "get_ptxas_version", None)
        if hasattr(memo, "cache_clear"):
            memo.cache_clear()
        _keyed_ptxas = path
    return path


def worker_environment() -> dict[str, str]:
    """The Triton settings a compile worker must share with this process, as environment
    variables: the ptxas its compiles use (the parent's compile that follows must find them
    under the same key) and whether kernels are interpreted (either may have been set in
    code, not in the env). A worker keeps these for life; the cache its compiles land in
    travels with each request instead (`worker_cache_settings`)."""
    env = {"TRITON_INTERPRET": "1" if interpreting() else "0"}
    if not interpreting() and (ptxas := ptxas_in_use()) is not None:
        env["TRITON_PTXAS_PATH"] = ptxas
    return env


def worker_cache_settings() -> dict[str, str]:
    """The Triton cache this process reads now, for a worker to compile into: sent with every
    request, so a cache directory changed between compiles (a benchmark's cold compile, a
    `config.patch(cache_dir=...)`) does not cost a restart of every worker (seconds each)."""
    try:
        from triton import knobs

        return {"TRITON_CACHE_DIR": os.path.abspath(knobs.cache.dir)}
    except (ImportError, AttributeError):
        if "TRITON_CACHE_DIR" in os.environ:
            return {"TRITON_CACHE_DIR": os.path.abspath(os.environ["TRITON_CACHE_DIR"])}
        return {}


def device_capability(device_index: int) -> tuple[int, int] | None:
    """The compute capability of CUDA device `device_index`, for a compile worker to compile
    for (`warm_cache_in_subprocess`); None in the interpreter or without CUDA."""
    if interpreting() or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device_index))  # torch keeps the properties: no query


def answer_device_queries(device_index: int, capability: tuple[int, int]) -> None:
    """In a compile worker: answer what Triton asks its active driver before a compile (the
    current device, its capability, its stream) from the parent's request, not from the GPU.

    Asking the GPU made every worker a CUDA context of its own (about 0.5 GiB of GPU memory
    each), and while those lived, the parent's CUDA graphs replayed about 9% slower (GPT-2,
    batch 1 x 32 tokens on the H100: 506 us a call, 463 once the workers exited); idle
    contexts of other programs did not do that. A compile needs only the target's
    architecture, so a worker touches no GPU at all."""
    from triton.runtime import driver

    active = driver.active
    active.get_current_device = lambda: device_index
    active.get_device_capability = lambda device=None: capability
    active.get_current_stream = lambda device=None: 0


def warm_cache_in_subprocess(source_path: str, name: str, arg_kinds: list, constexprs: dict, num_warps: int,
                             device_index: int = 0, num_stages: int = 1, launcher: bool = False,
                             capability: tuple[int, int] | None = None) -> str:
    """Compile in a worker process so the parent's compile is a Triton cache hit. In the
    interpreter nothing is compiled: this only imports the kernel's source and finds it.
    `launcher`: also build Triton's host launcher for it (what the Python target launches through).
    `capability`: the device's compute capability, as the parent reads it; given, the worker
    compiles for it without touching the GPU (`answer_device_queries`)."""
    jit_fn = getattr(load_module(Path(source_path), f"wrapgen_triton_{Path(source_path).stem}"), name)
    if capability is not None and not interpreting():
        answer_device_queries(device_index, tuple(capability))
        compiled = _warmup(jit_fn, arg_kinds, constexprs, num_warps, num_stages)
    else:
        compiled = compile_kernel(jit_fn, arg_kinds, constexprs, num_warps, device_index, num_stages)
    if launcher and not interpreting():
        build_launcher(compiled)
    return name


def build_launcher(compiled) -> None:
    """Build Triton's host launcher for a compiled kernel: a C extension made with the system
    compiler for each argument signature (about 0.35 s each on the H100 host), kept in Triton's
    cache. Built in the workers, the parent's first launch then only loads it: built there,
    one after another, they were most of a large model's cold compile."""
    from triton.runtime import driver

    launcher_cls = getattr(driver.active, "launcher_cls", None)  # Triton 3.x's CUDA/HIP drivers
    if launcher_cls is not None:
        launcher_cls(compiled.src, compiled.metadata)
