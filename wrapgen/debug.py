"""The debug switch: write each compiled graph's IR text and emitted code to a folder."""

from __future__ import annotations

import itertools
from pathlib import Path

from wrapgen import config
from wrapgen.backends.emitter import CompiledArtifact
from wrapgen.memory_plot import plot_memory_plan
from wrapgen.wrapper_ir.program import Program

_counter = itertools.count()

_SUFFIXES = {"python": ".py", "cpp": ".cpp", "fx": ".fx.py"}


def dump_folder(program: Program, target: str) -> Path | None:
    """The folder `dump` will write `program` to (numbered in compile order), or None without
    config.debug_dir: taken when the program is emitted, though written when it is runnable."""
    if not config.debug_dir:
        return None
    return Path(config.debug_dir) / f"{next(_counter):03d}_{program.name}_{target}"


def dump(program: Program, target: str, artifact: CompiledArtifact, folder: Path | None = None) -> Path | None:
    """Write `program.txt` and the emitted code under config.debug_dir (in `folder`, if taken
    before); return the folder."""
    folder = folder or dump_folder(program, target)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "program.txt").write_text(str(program))
    (folder / f"code{_SUFFIXES.get(target, '.txt')}").write_text(artifact.source)
    plot_memory_plan(program, folder / "memory.png")
    return folder
