"""Versions of the state a program writes in place, so that no pass can reorder its accesses.

An input or constant that some line writes (a parameter an optimizer step updates, a KV cache, a
running mean) is state: version 0 as the call begins, one more after each line that writes it.
`annotate_state_versions` records on each kernel and library call the version of each state
storage it reads or writes, in the order lowering placed them (the source program's order); the
verifier then refuses any program where a call would see another version (`StateVersions`), so
a pass that moves a read past a write of the same storage, or a write past a read, fails naming
the line. Views of state are state: a `Reinterpret` line maps a view to the storage it views.
"""

from __future__ import annotations

import dataclasses

from wrapgen.wrapper_ir.lines import ExternKernel, KernelCall, Reinterpret, WrapperLine

_ANNOTATED = (KernelCall, ExternKernel)


class StateVersions:
    """The current version of each state storage along a walk of the lines."""

    def __init__(self, storages: set[str]) -> None:
        self.storages = storages
        self.root: dict[str, str] = {}
        self.version = dict.fromkeys(storages, 0)

    def of(self, name: str) -> str:
        return self.root.get(name, name)

    def seen(self, line: WrapperLine) -> tuple[tuple[str, int], ...]:
        """The (storage, version) pairs `line` reads or writes, at the current versions."""
        touched = {self.of(n) for n in line.uses()} & self.storages
        return tuple((s, self.version[s]) for s in sorted(touched))

    def check(self, line: WrapperLine) -> None:
        """ValueError if `line` declares a version other than the current one."""
        for storage, expected in getattr(line, "state", ()):
            current = self.version.get(storage)
            if current is None:
                raise ValueError(f"declares a version of {storage}, which is not state this program writes")
            if current != expected:
                moved = "after" if current > expected else "before"
                raise ValueError(f"must see {storage} at version {expected} but runs {moved} the write that makes "
                                 f"version {current}: a read or write of state was moved past a write of it")

    def apply(self, line: WrapperLine) -> None:
        if isinstance(line, Reinterpret):
            self.root[line.name] = self.of(line.source)
        for storage in {self.of(w) for w in getattr(line, "writes", ())} & self.storages:
            self.version[storage] += 1


def state_storages(inputs: set[str], lines: list[WrapperLine]) -> set[str]:
    """The inputs and constants (`inputs`) some line writes, directly or through a view."""
    root: dict[str, str] = {}
    written: set[str] = set()
    for line in lines:
        if isinstance(line, Reinterpret):
            root[line.name] = root.get(line.source, line.source)
        written.update(root.get(w, w) for w in getattr(line, "writes", ()))
    return written & inputs


def annotate_state_versions(lines: list[WrapperLine], inputs: set[str]) -> list[WrapperLine]:
    """`lines` with each kernel and library call declaring the state versions it sees."""
    versions = StateVersions(state_storages(inputs, lines))
    if not versions.storages:
        return lines
    out = []
    for line in lines:
        if isinstance(line, _ANNOTATED):
            seen = versions.seen(line)
            if seen:
                line = dataclasses.replace(line, state=seen)
        versions.apply(line)
        out.append(line)
    return out
