"""Which names share storage, and when each storage dies: the facts memory planning needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from wrapgen.wrapper_ir.lines import (
    ExternKernel,
    Free,
    MultiOutput,
    Output,
    Reinterpret,
    ReuseBuffer,
    WrapperLine,
)
from wrapgen.wrapper_ir.program import Program


@dataclass
class Storage:
    """One piece of storage: the line that created it and every name that refers to it."""

    root: str
    created_at: int
    names: set[str] = field(default_factory=set)
    last_use: int = -1
    escapes: bool = False  # an output refers to it, or it belongs to the caller

    @property
    def death(self) -> int | None:
        """Index of the last line that touches the storage, or None when it outlives the call."""
        return None if self.escapes else self.last_use


class StorageAnalysis:
    """Groups the program's tensor names by the storage they view.

    Allocations, pooled buffers and library results own storage; Reinterpret, MultiOutput,
    ReuseBuffer and aliasing library results share the storage of their source. Inputs and
    constants belong to the caller and never die inside the program.
    """

    def __init__(self, program: Program) -> None:
        self.root_of: dict[str, str] = {}
        self.storages: dict[str, Storage] = {}
        for name in program.input_names() + [c.name for c in program.constants]:
            self._own(name, -1, escapes=True)
        for index, line in enumerate(program.lines):
            self._visit(index, line)

    def _own(self, name: str, index: int, escapes: bool = False) -> None:
        self.root_of[name] = name
        self.storages[name] = Storage(name, index, {name}, index, escapes)

    def _share(self, name: str, source: str) -> None:
        root = self.root_of[source]
        self.root_of[name] = root
        self.storages[root].names.add(name)

    def _visit(self, index: int, line: WrapperLine) -> None:
        for name in line.uses():
            if name in self.root_of:
                storage = self.storages[self.root_of[name]]
                storage.last_use = max(storage.last_use, index)
        if isinstance(line, (Reinterpret, MultiOutput, ReuseBuffer)):
            self._share(line.name, line.source)
        elif isinstance(line, ExternKernel) and line.name is not None and line.alias_of is not None:
            self._share(line.name, line.alias_of)
        else:  # allocations, pooled buffers, library results: storage of their own
            for name in line.defines():
                self._own(name, index)
        if isinstance(line, Output):
            for name in line.uses():
                self.storages[self.root_of[name]].escapes = True
        if isinstance(line, Free) and line.name in self.root_of:
            storage = self.storages[self.root_of[line.name]]
            storage.last_use = max(storage.last_use, index)

    def storage(self, name: str) -> Storage:
        return self.storages[self.root_of[name]]
