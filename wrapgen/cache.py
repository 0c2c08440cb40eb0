"""On-disk cache of emitted artifacts, keyed by a hash of their content."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType

from wrapgen import config

_made_roots: set[Path] = set()


def cache_root() -> Path:
    """The cache folder (`config.cache_dir`), made once per process and path: a compile asks
    for it per kernel, and on the H100 host, while the compile workers wrote Triton's cache,
    cProfile put 1.9 s of GPT-2's 15.9 s cold compile in 104 calls of the `mkdir` it did every
    time. Writers make the subfolders they write into."""
    root = Path(config.cache_dir or Path.home() / ".cache" / "wrapgen")
    if root not in _made_roots:
        root.mkdir(parents=True, exist_ok=True)
        _made_roots.add(root)
    return root


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_cached(kind: str, text: str, suffix: str) -> str:
    """Store `text` under its hash (atomically; concurrent writers are safe) and return the path."""
    digest = content_hash(text)
    folder = cache_root() / kind / digest[:2]
    path = folder / f"w{digest[:40]}{suffix}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=suffix)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    return str(path)


def load_python_module(path: str) -> ModuleType:
    """A fresh module object for `path` each time, so two programs never share globals."""
    spec = importlib.util.spec_from_file_location(f"wrapgen_generated.{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load generated module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
