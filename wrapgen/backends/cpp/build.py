"""Build a C++ model library: the emitted wrapper plus the program's C++ kernels, one `.so`.

Kernels compile to cached objects exactly as for the Python target
(`wrapgen.kernels.cpp.build.compile_object`); the wrapper compiles against torch's headers
and `cpp_runtime/include`, and everything links against libtorch (`-Wl,-z,now`, so a
libtorch that lacks a shim function fails at load time with the symbol's name, not at the
first call). The library is cached under `cache_dir/cpp_model/` by a hash of everything
that goes into it; each wrapper unit's object is cached there too, by its own hash, so that
`start_wrapper_compile` can build it while the program's GPU kernels are still compiling.

A wrapper unit compiles only its own code: the runtime helpers it calls (input checks, the
dispatcher stack, allocation, kernel launch) are declared by the headers under
WRAPGEN_RUNTIME_LINKED and compiled once per cache and flags into `runtime_object`, which
every model links (but a cache's first CPU model, which compiles them inline: HEADER_ONLY); the
template compiles the run function itself at -O0 (host glue).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from wrapgen.cache import cache_root
from wrapgen.kernels.cpp import build as kernel_build

# Host code: -O1 compiles twice as fast as -O2 and the wrapper's time goes to libtorch calls
# (the template compiles the program's run function itself unoptimized). WRAPGEN_RUNTIME_LINKED:
# the runtime helpers are only declared in each wrapper unit; their definitions compile once per
# cache and flags into the runtime object (runtime_object) that models link.
WRAPPER_FLAGS = ("-O1", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-w", "-DWRAPGEN_RUNTIME_LINKED")
_RUNTIME_SOURCE = """// wrapgen's runtime helpers, out of line: compiled once per cache, linked into every model.
#define WG_RT_INLINE
#include "wrapgen/runtime.h"
#include "wrapgen/runtime_impl.h"
#ifdef USE_CUDA
#include "wrapgen/cuda_kernels.h"
#include "wrapgen/cuda_kernels_impl.h"
#endif
"""
_PCH_SOURCE = "#include <algorithm>\n#include <cstdint>\n#include <limits>\n#include <vector>\n#include \"wrapgen/runtime.h\"\n"


class ModelBuildError(RuntimeError):
    """g++ rejected the emitted wrapper or the link failed (the message holds the output)."""


@functools.cache
def runtime_include_dir() -> Path:
    """`cpp_runtime/include` of this checkout (next to the `wrapgen` package)."""
    path = Path(__file__).resolve().parents[3] / "cpp_runtime" / "include"
    if not (path / "wrapgen" / "runtime.h").exists():
        raise ModelBuildError(f"cannot find the C++ runtime headers at {path}")
    return path


def torch_include_dirs() -> list[str]:
    root = Path(torch.__file__).parent / "include"
    return [str(root)]


def torch_library_dir() -> str:
    return str(Path(torch.__file__).parent / "lib")


@functools.cache
def _runtime_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(runtime_include_dir().rglob("*.h")):
        h.update(path.read_bytes())
    return h.hexdigest()


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _run(cmd: list[str], what: str, source: Path | None = None) -> None:
    try:
        kernel_build._run(cmd, what, source)
    except kernel_build.KernelCompileError as e:
        raise ModelBuildError(str(e)) from None


def _includes() -> list[str]:
    return [f"-I{runtime_include_dir()}", *(f"-I{d}" for d in torch_include_dirs())]


_pch_failed: set[Path] = set()  # folders where the compiler could not make the header

# A precompiled runtime header halves each wrapper's compile (0.9 -> 0.45 s on the 2-core CI
# machine) but takes 1.6 s to make: it pays off from the third model a cache builds on, so a
# cache makes one only once it holds this many models.
PCH_AFTER_MODELS = 2


def _pch_paths(flags: tuple[str, ...]) -> tuple[Path, Path]:
    key = _digest(_PCH_SOURCE, _runtime_digest(), " ".join(WRAPPER_FLAGS + flags), kernel_build.compiler_id(), torch.__version__)
    folder = cache_root() / "cpp_pch" / key
    return folder / "wg_pch.h", folder / "wg_pch.h.gch"


def precompiled_header(flags: tuple[str, ...] = ()) -> Path | None:
    """The runtime header precompiled for `flags`, if this cache has made it. Looked up on
    every build, not remembered: the cache directory can change (config.cache_dir) or be
    deleted."""
    header, gch = _pch_paths(flags)
    return header if gch.exists() else None


def make_precompiled_header(flags: tuple[str, ...] = ()) -> Path | None:
    """Make the precompiled runtime header for `flags` (once per cache and flags); None if the
    compiler cannot make one."""
    header, gch = _pch_paths(flags)
    folder = header.parent
    if gch.exists():
        return header
    if folder in _pch_failed:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if not header.exists():
        header.write_text(_PCH_SOURCE)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".gch")
    os.close(fd)
    try:
        _run([kernel_build.CXX, *WRAPPER_FLAGS, *flags, *_includes(), "-x", "c++-header", str(header), "-o", tmp],
             "precompiling the runtime header")
    except ModelBuildError:
        os.remove(tmp)
        _pch_failed.add(folder)
        return None
    os.replace(tmp, gch)
    return header


def runtime_object(flags: tuple[str, ...] = ()) -> Path:
    """The runtime helpers' object for `flags` (cpp_runtime/include/wrapgen/*_impl.h), compiled
    once per cache, compiler, torch and runtime headers; every model built with `flags` links it,
    so no wrapper unit compiles the helpers again."""
    obj = _runtime_path(flags)
    with _runtime_lock:  # a second caller (build_model, the background compile) waits, not repeats
        if not obj.exists():
            obj.parent.mkdir(parents=True, exist_ok=True)
            _compile_runtime(obj, flags)
    return obj


_runtime_lock = threading.Lock()
_runtime_requested: set[Path] = set()  # runtime objects a background compile was started for
# A cache's first model compiles its helpers inline (-U below: the headers define them) rather
# than make the runtime object (~0.7 s of g++) for a single model; every later one links it.
HEADER_ONLY = ("-UWRAPGEN_RUNTIME_LINKED",)


def _runtime_path(flags: tuple[str, ...]) -> Path:
    key = _digest(_RUNTIME_SOURCE, _runtime_digest(), " ".join(WRAPPER_FLAGS + flags), kernel_build.compiler_id(), torch.__version__)
    return cache_root() / "cpp_runtime" / f"runtime_{key}.o"


def _links_runtime(flags: tuple[str, ...], folder: Path) -> bool:
    """Whether a model built now links the runtime object: it exists or is being made, or the
    cache already holds a model (so the object pays off from this one on)."""
    path = _runtime_path(flags)
    return path.exists() or path in _runtime_requested or any(folder.glob("model_*.so"))


def _compile_runtime(obj: Path, flags: tuple[str, ...]) -> None:
    src = _write_source(obj.with_suffix(".cpp"), _RUNTIME_SOURCE)
    fd, tmp = tempfile.mkstemp(dir=obj.parent, suffix=".o")
    os.close(fd)
    try:
        _run([kernel_build.CXX, *WRAPPER_FLAGS, *flags, *_includes(), "-c", str(src), "-o", tmp],
             "compiling the C++ runtime", src)
        os.replace(tmp, obj)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_source(path: Path, text: str) -> Path:
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".cpp")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    return path


def _folder() -> Path:
    folder = cache_root() / "cpp_model"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def unit_object(text: str, compile_flags: tuple[str, ...] = ()) -> Path:
    """Where the cache keeps one wrapper unit's object (built or not): a hash of its text,
    the flags, the compiler, torch and the runtime headers."""
    key = _digest(text, " ".join(WRAPPER_FLAGS + compile_flags), kernel_build.compiler_id(), torch.__version__,
                  _runtime_digest())
    return _folder() / f"model_unit_{key}.o"


# Wrapper units compiling in the background (start_wrapper_compile), by object path; the
# build that needs one waits for it instead of compiling it again.
_started: dict[Path, Future[Path]] = {}
_started_lock = threading.Lock()
_background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="wrapgen-cxx")


def _compile_unit(text: str, compile_flags: tuple[str, ...], obj: Path) -> Path:
    """One wrapper unit -> its cached object (compiled unless the cache holds it)."""
    if obj.exists():
        return obj
    src = _write_source(obj.with_suffix(".cpp"), text)
    includes = _includes()
    pch = precompiled_header(compile_flags)
    if pch is not None:
        includes += ["-include", str(pch), "-Winvalid-pch"]
    fd, tmp = tempfile.mkstemp(dir=obj.parent, suffix=".o")
    os.close(fd)
    try:
        _run([kernel_build.CXX, *WRAPPER_FLAGS, *compile_flags, *includes, "-c", str(src), "-o", tmp],
             "compiling the C++ wrapper", src)
        os.replace(tmp, obj)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return obj


def start_wrapper_compile(source: str, compile_flags: tuple[str, ...] = ()) -> None:
    """Start compiling the wrapper `source` in a background g++, for a model whose other parts
    (its GPU kernels' table) are not known yet: the wrapper then compiles while Triton does,
    and `build_model` finds its object made (or waits for it). Errors surface in build_model.
    Beside it the runtime object and the precompiled runtime header are made (once per cache
    and flags), hidden behind Triton's compile too: the kernel table, compiled after Triton,
    then skips the headers. The wrapper does not wait for the header: with the helpers out of
    line, making the header (~0.9 s) costs more than it saves one wrapper (~0.2 s)."""
    obj = unit_object(source, compile_flags)
    with _started_lock:
        if obj.exists() or obj in _started:
            return
        _started[obj] = _background.submit(_compile_unit, source, compile_flags, obj)
        _runtime_requested.add(_runtime_path(compile_flags))  # so build_model links it too
        _background.submit(_runtime_then_header, compile_flags)


def _runtime_then_header(compile_flags: tuple[str, ...]) -> None:
    try:
        runtime_object(compile_flags)
    except ModelBuildError:
        pass  # build_model compiles it again and reports the error
    make_precompiled_header(compile_flags)  # None (builds go without) where the compiler cannot


def _unit(text: str, compile_flags: tuple[str, ...]) -> Path:
    """The object for one wrapper unit: the background compile's, if one was started, else made here."""
    obj = unit_object(text, compile_flags)
    with _started_lock:
        started = _started.pop(obj, None)
    if started is not None:
        return started.result()
    return _compile_unit(text, compile_flags, obj)


def build_model(
    source: str,
    kernel_sources: list[str],
    *,
    extra_sources: Sequence[str] = (),
    compile_flags: tuple[str, ...] = (),
    link_flags: tuple[str, ...] = (),
) -> Path:
    """The shared library for an emitted wrapper, its C++ kernels and `extra_sources` (more
    translation units compiled like the wrapper, e.g. a GPU kernel table), built once, then
    cached. `compile_flags`/`link_flags` come from the devices the program uses. Kernels and
    wrapper units compile side by side in worker threads (each is one g++ process)."""
    folder = _folder()
    objects = [kernel_build.object_path(text) for text in kernel_sources]
    key = _digest(
        source, *extra_sources, *(o.name for o in objects), " ".join(WRAPPER_FLAGS + compile_flags + link_flags),
        kernel_build.compiler_id(), torch.__version__, _runtime_digest(),
    )
    library = folder / f"model_{key}.so"
    if library.exists():
        return library
    units = [source, *extra_sources]
    # Without a precompiled header yet, this build compiles without one; a cache that has
    # built enough models makes one beside this build's compiles, for the builds after it.
    make_pch = precompiled_header(compile_flags) is None and len(list(folder.glob("model_*.so"))) >= PCH_AFTER_MODELS
    linked = _links_runtime(compile_flags, folder)
    unit_flags = compile_flags if linked else compile_flags + HEADER_ONLY  # no precompiled header either
    jobs = len(kernel_sources) + len(units) + int(make_pch) + int(linked)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, os.cpu_count() or 1))) as pool:
        built: list[Future[Path]] = [pool.submit(_unit, text, unit_flags) for text in units]
        if linked:
            built.append(pool.submit(runtime_object, compile_flags))  # made once per cache
        kernel_build.prepare_prelude(kernel_sources)  # here, while the wrapper compiles
        futures = [pool.submit(kernel_build.compile_object, text) for text in kernel_sources] + built
        if make_pch:
            futures.append(pool.submit(make_precompiled_header, compile_flags))
        futures.append(pool.submit(kernel_build.fast_linker_flags))  # probed once per process
        for future in futures:
            future.result()
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so")
    os.close(fd)
    libs = ["-lmvec"] if kernel_build.use_mvec() else []
    lib_dir = torch_library_dir()
    link = [*(str(f.result()) for f in built), *map(str, objects), "-o", tmp, f"-L{lib_dir}",
            f"-Wl,-rpath,{lib_dir}", "-Wl,-z,now", *link_flags, "-ltorch_cpu", "-lc10", *libs, "-lm"]
    fast = kernel_build.fast_linker_flags()
    try:
        try:
            _run([kernel_build.CXX, "-shared", "-fopenmp", *fast, *link], "linking the C++ model")
        except ModelBuildError:
            if not fast:
                raise
            # The probe's link passed but this one did not: the default linker decides.
            _run([kernel_build.CXX, "-shared", "-fopenmp", *link], "linking the C++ model")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return library
