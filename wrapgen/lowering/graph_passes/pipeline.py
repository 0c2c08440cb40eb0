"""The one loop that runs a list of graph passes, and the debug dumps of what each changed.

A pass is a function from a graph (a `CapturedGraph`, or dynamo's `fx.GraphModule`) to the
graph after its rewrite: the object it was given when it changed nothing (or rewrote it in
place), else a new one. Its options are read when the list runs, so `config.patch` around a
compile holds.

With `config.debug_dir` set, each pass that changed the graph writes it, in fx's readable
form with sizes, strides and devices, to `<debug_dir>/graph_passes/<NNN>_<name>/<NN>-<pass>.txt`
(NNN counts the graphs run through a list in this process, NN is the pass's place in its
list), after `00-input.txt`, the graph as the first pass was given it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch.fx

from wrapgen import config

Graph = TypeVar("Graph")

_counter = itertools.count()


@dataclass(frozen=True)
class GraphPass:
    """One rewrite of the graph: its name (the dump's file name), the config options that must
    all be on for it to run (none: it always runs), and the function."""

    name: str
    options: tuple[str, ...]
    run: Callable

    def enabled(self) -> bool:
        return all(getattr(config, option) for option in self.options)


def run_passes(passes: Sequence[GraphPass], graph: Graph, name: str) -> Graph:
    """`graph` after each enabled pass of `passes`, in order; `name` names its debug dumps."""
    dumps = _Dumps(name) if config.debug_dir else None
    for number, graph_pass in enumerate(passes, 1):
        if not graph_pass.enabled():
            continue
        if dumps is not None and dumps.text is None:
            dumps.text = readable(graph)  # before the pass, which may rewrite the graph in place
        graph = graph_pass.run(graph)
        if dumps is not None:
            dumps.after(number, graph_pass, graph)
    return graph


def readable(graph: object) -> str:
    """The graph's readable form: fx's Python code with each value's dtype, sizes, strides and
    device."""
    module = getattr(graph, "graph_module", graph)
    assert isinstance(module, torch.fx.GraphModule), type(graph)
    return module.print_readable(print_output=False, include_stride=True, include_device=True)


class _Dumps:
    """Writes a graph after each pass that changed it (when debug_dir is set)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.folder: Path | None = None
        self.text: str | None = None  # the graph's readable form before the next pass

    def after(self, number: int, graph_pass: GraphPass, graph: object) -> None:
        text = readable(graph)
        if text == self.text:
            return
        if self.folder is None:
            self.folder = Path(config.debug_dir) / "graph_passes" / f"{next(_counter):03d}_{self.name}"
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "00-input.txt").write_text(self.text)
        options = ", ".join(graph_pass.options) or "always on"
        header = f"# after pass {number}, {graph_pass.name} ({options})\n"
        (self.folder / f"{number:02d}-{graph_pass.name}.txt").write_text(header + text)
        self.text = text
