"""Build (once, cached) and import the pybind11 module `wrapgen_runtime` of cpp_runtime/python.

The top-level CMakeLists.txt builds the same module; this path needs only g++ and the
pybind11 package, so `wrapgen.load_package` works from a plain checkout.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from wrapgen.backends.cpp.build import ModelBuildError, _run, runtime_include_dir, torch_include_dirs, torch_library_dir
from wrapgen.cache import cache_root
from wrapgen.kernels.cpp import build as kernel_build

_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-w")


def _source() -> Path:
    return runtime_include_dir().parent / "python" / "wrapgen_runtime.cpp"


@functools.cache
def runtime_module() -> ModuleType:
    """The compiled `wrapgen_runtime` module (built on first use)."""
    try:
        import pybind11
    except ImportError:
        raise ModelBuildError("loading a package needs pybind11 (pip install 'pybind11>=2.12')") from None
    h = hashlib.sha256()
    for path in [_source(), *sorted(runtime_include_dir().rglob("*.h"))]:
        h.update(path.read_bytes())
    h.update(" ".join(_FLAGS).encode() + torch.__version__.encode() + kernel_build.compiler_id().encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    folder = cache_root() / "cpp_runtime" / h.hexdigest()[:32]
    target = folder / f"wrapgen_runtime{suffix}"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=suffix)
        os.close(fd)
        includes = [f"-I{runtime_include_dir()}", f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
        includes += [f"-I{d}" for d in torch_include_dirs()]
        lib_dir = torch_library_dir()
        _run(
            [kernel_build.CXX, *_FLAGS, *includes, str(_source()), "-o", tmp, f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}",
             "-ltorch_cpu", "-lc10", "-ldl"],
            "building the wrapgen_runtime module",
            _source(),
        )
        os.replace(tmp, target)
    spec = importlib.util.spec_from_file_location("wrapgen_runtime", target)
    if spec is None or spec.loader is None:
        raise ModelBuildError(f"cannot import {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
