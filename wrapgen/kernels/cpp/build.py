"""Build a program's C++ kernels into one shared library, cached on disk, loaded once.

Each kernel compiles to its own object file (in parallel: one g++ process per kernel,
driven from a thread pool) cached under `cache_dir/cpp/` by a hash of its source, the
prelude, the compiler's version and the flags; the objects link into one `.so` cached by
the hash of its objects. A second compile of the same model hits both caches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from wrapgen.cache import cache_root
from wrapgen.kernels.cpp.prelude import PRELUDE

CXX = os.environ.get("CXX", "g++")
# -march=native: the library is built on the machine that runs it (the cache key holds the CPU).
# -fno-trapping-math lets gcc if-convert `c ? a : f(b)` (where) so such loops vectorize; results
# and NaN handling are unchanged (no -ffast-math).
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-std=c++17", "-w")

stats = {"compiled": 0, "cache_hits": 0, "linked": 0}
_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class KernelCompileError(RuntimeError):
    """g++ rejected a generated kernel; the message holds the compiler output and the source path."""


@functools.cache
def _cpu_flags_line() -> str:
    """The host CPU's feature flags as /proc/cpuinfo lists them ("" where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


@functools.cache
def compiler_id() -> str:
    """Compiler version and the host CPU's feature flags (what -march=native resolves to)."""
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return f"{version}|{platform.machine()}|{hashlib.sha256(_cpu_flags_line().encode()).hexdigest()[:16]}"


def has_avx512() -> bool:
    return "avx512f" in _cpu_flags_line().split()


@functools.cache
def use_mvec() -> bool:
    """glibc's vector math library: lets loops that call exp/tanh/erf/... vectorize."""
    return platform.machine() == "x86_64" and ctypes.util.find_library("mvec") is not None


def compile_flags() -> tuple[str, ...]:
    # On AVX-512 CPUs gcc's -march=native still prefers 256-bit vectors; 512-bit ones (what
    # Inductor's at::vec uses there) measured faster on the H100 host's Xeon (pointwise_chain
    # 7.2 -> 5.6 ms, layernorm_gelu 5.6 -> 5.4 ms, 16 threads).
    wide = ("-mprefer-vector-width=512",) if has_avx512() else ()
    return BASE_FLAGS + wide + (("-DWG_MVEC",) if use_mvec() else ())


def _folder() -> Path:
    folder = cache_root() / "cpp"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _run(cmd: list[str], what: str, source_path: Path | None = None) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        where = f" (source: {source_path})" if source_path else ""
        raise KernelCompileError(f"{what} failed{where}:\n{' '.join(cmd)}\n{result.stderr[-4000:]}")


def _kernel_text(source: str) -> str:
    return PRELUDE + "\n" + source


def object_path(source: str) -> Path:
    """Where the cache keeps one kernel's object file (built or not): a hash of its text, the
    compiler and the flags."""
    return _folder() / f"k{_digest(_kernel_text(source), compiler_id(), ' '.join(compile_flags()))}.o"


def compile_object(source: str) -> Path:
    """One kernel → object file, unless the cache holds it already."""
    obj = object_path(source)
    if obj.exists():
        with _lock:
            stats["cache_hits"] += 1
        return obj
    header = prelude_header()
    # With the prelude precompiled the kernel includes it (g++ reads the .gch; the machine code
    # is the same), else it carries the prelude's text; two names, so neither goes stale.
    if header is None:
        src = obj.with_suffix(".cpp")
        _atomic_write(src, _kernel_text(source))
    else:
        src = obj.with_name(f"{obj.stem}_pch.cpp")
        _atomic_write(src, f'#include "{header}"\n{source}', replace=True)  # the header's path of now
    fd, tmp = tempfile.mkstemp(dir=obj.parent, suffix=".o")
    os.close(fd)
    _run([CXX, *compile_flags(), "-c", str(src), "-o", tmp], "compiling a kernel", src)
    os.replace(tmp, obj)
    with _lock:
        stats["compiled"] += 1
    return obj


# The prelude is most of a small kernel's compile (12 kernels of a small Llama: 1.43 s of CPU
# time, 0.62 s with it precompiled); precompiling it costs ~0.3 s, one process. A build makes
# it once it compiles this many new kernels per core (it then pays off at once); once made,
# every later build in the cache uses it.
PCH_MIN_KERNELS_PER_CORE = 4
_prelude_failed: set[Path] = set()


def _prelude_paths() -> tuple[Path, Path]:
    key = _digest(PRELUDE, compiler_id(), " ".join(compile_flags()))
    folder = cache_root() / "cpp_pch" / f"prelude_{key}"
    return folder / "wg_prelude.h", folder / "wg_prelude.h.gch"


def prelude_header(make: bool = False) -> Path | None:
    """The kernel prelude's header if this cache holds it precompiled (for these flags, this
    compiler, this prelude); with `make`, precompile it first. None where g++ cannot."""
    header, gch = _prelude_paths()
    if any(c in str(header) for c in '"\\\n'):  # cannot be named in an #include line
        return None
    if gch.exists():
        return header
    if not make or header.parent in _prelude_failed:
        return None
    header.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(header, PRELUDE)
    fd, tmp = tempfile.mkstemp(dir=header.parent, suffix=".gch")
    os.close(fd)
    try:
        _run([CXX, *compile_flags(), "-x", "c++-header", str(header), "-o", tmp], "precompiling the kernel prelude")
    except KernelCompileError:
        os.remove(tmp)
        _prelude_failed.add(header.parent)
        return None
    os.replace(tmp, gch)
    return header


def prepare_prelude(sources: list[str]) -> None:
    """Precompile the prelude before a build of `sources` when enough of them are new."""
    new = sum(1 for source in sources if not object_path(source).exists())
    if new and new >= PCH_MIN_KERNELS_PER_CORE * (os.cpu_count() or 1):
        prelude_header(make=True)


@functools.cache
def fast_linker_flags() -> tuple[str, ...]:
    """`-fuse-ld=` for the fastest linker that links a shared library here (mold, lld, gold),
    else (). Linking against libtorch with GNU ld takes ~0.4 s; gold takes a third of that.
    The probe is a real link: a linker can be installed yet unable to read the compiler's
    own libraries (a newer g++ beside the system's gold)."""
    with tempfile.TemporaryDirectory(prefix="wrapgen-ld-") as folder:
        src = Path(folder) / "probe.cpp"
        src.write_text("extern \"C\" int wg_linker_probe() { return 0; }\n")
        for linker in ("mold", "lld", "gold"):
            flag = f"-fuse-ld={linker}"
            cmd = [CXX, flag, "-shared", "-fPIC", "-fopenmp", str(src), "-o", str(Path(folder) / f"{linker}.so"), "-lm"]
            try:
                probe = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                return ()
            if probe.returncode == 0:
                return (flag,)
    return ()


def build_library(sources: list[str]) -> Path:
    """All kernels of one program → one shared library (compiled in parallel, cached)."""
    workers = max(1, min(len(sources), os.cpu_count() or 1))
    prepare_prelude(sources)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        objects = list(pool.map(compile_object, sources))
    key = _digest(*(o.name for o in objects), "link", " ".join(compile_flags()))
    library = _folder() / f"lib{key}.so"
    if not library.exists():
        fd, tmp = tempfile.mkstemp(dir=library.parent, suffix=".so")
        os.close(fd)
        libs = ["-lmvec"] if use_mvec() else []
        _run([CXX, "-shared", "-fopenmp", *map(str, objects), "-o", tmp, *libs, "-lm"], "linking kernels")
        os.replace(tmp, library)
        with _lock:
            stats["linked"] += 1
    return library


def load_library(sources: list[str]) -> ctypes.CDLL:
    """Build (or find) and load the library for `sources`; each library is loaded once per process."""
    path = str(build_library(sources))
    with _lock:
        if path not in _loaded:
            _loaded[path] = ctypes.CDLL(path)
        return _loaded[path]


def _atomic_write(path: Path, text: str, replace: bool = False) -> None:
    if path.exists() and not replace:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
