"""On-disk cache of emitted artifacts, keyed by a hash of their content."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType

from wrapgen import config


def cache_root() -> Path:
    root = Path(config.cache_dir or Path.home() / ".cache" / "wrapgen")
    root.mkdir(parents=True, exist_ok=True)
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
