"""Insert a `Free` right after the last line that mentions each name the program owns."""

from __future__ import annotations

from wrapgen.wrapper_ir.lines import Free, Output, Reinterpret, WrapperLine


def remove_unused_views(lines: list[WrapperLine]) -> list[WrapperLine]:
    """Drop Reinterpret lines nobody reads (views of views are taken from the root directly)."""
    used = {name for line in lines for name in line.uses()}
    return [line for line in lines if not (isinstance(line, Reinterpret) and line.name not in used)]


def insert_frees(lines: list[WrapperLine], keep: set[str]) -> list[WrapperLine]:
    """Free every name `lines` mention after its last use, except `keep` and the outputs.

    A view keeps its storage alive on its own, so a base is freed after its own last use
    even if views of it live on.
    """
    returned = {name for line in lines if isinstance(line, Output) for name in line.uses()}
    last_use: dict[str, int] = {}
    order: dict[str, int] = {}
    for index, line in enumerate(lines):
        for name in (*line.defines(), *line.uses()):
            order.setdefault(name, len(order))
            last_use[name] = index
    frees_after: dict[int, list[str]] = {}
    for name, index in last_use.items():
        if name not in keep and name not in returned:
            frees_after.setdefault(index, []).append(name)
    result: list[WrapperLine] = []
    for index, line in enumerate(lines):
        result.append(line)
        for name in sorted(frees_after.get(index, ()), key=order.__getitem__):
            result.append(Free(name))
    return result
