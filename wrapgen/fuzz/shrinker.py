"""Shrink a failing program: fewer outputs, statements and inputs, static sizes, small sizes, as
long as it still fails the same way (same variant, same kind of failure). Greedy: take the first
smaller candidate that still fails, start over, stop when none does or the time is up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from wrapgen.fuzz.generator import FuzzProgram, Statement


def prune(program: FuzzProgram) -> FuzzProgram:
    """Drop statements nothing returned depends on (in-place updates stay: they may change a
    view of what is returned) and inputs no statement reads."""
    needed = set(program.outputs)
    kept: list[Statement] = []
    for statement in reversed(program.statements):
        if statement.result is None or statement.result in needed:
            kept.append(statement)
            needed.update(statement.operands)
    inputs = tuple(i for i in program.inputs if i.name in needed)
    return replace(program, statements=tuple(reversed(kept)), inputs=inputs or program.inputs[:1])


def drop(program: FuzzProgram, index: int, substitute: str | None) -> FuzzProgram:
    """Remove statement `index`; later uses of its value read `substitute` instead."""
    removed = program.statements[index]
    rename = {removed.result: substitute} if removed.result is not None and substitute is not None else {}
    later = tuple(
        replace(s, operands=tuple(rename.get(o, o) for o in s.operands)) for s in program.statements[index + 1 :]
    )
    outputs = tuple(dict.fromkeys(rename.get(o, o) for o in program.outputs))
    return prune(replace(program, statements=program.statements[:index] + later, outputs=outputs))


def candidates(program: FuzzProgram) -> Iterator[FuzzProgram]:
    """Smaller programs, most promising first."""
    if program.dynamic:
        yield replace(program, dynamic=False)
    if len(program.outputs) > 1:
        for output in program.outputs:
            yield prune(replace(program, outputs=tuple(o for o in program.outputs if o != output)))
    for index in reversed(range(len(program.statements))):
        statement = program.statements[index]
        if statement.result is None:
            yield drop(program, index, None)
            continue
        for operand in dict.fromkeys(statement.operands):
            yield drop(program, index, operand)
    for which, sizes in enumerate(program.sizes):
        for position, (dim, size) in enumerate(sizes):
            for smaller in (2, 3):
                others = [s for d, s in sizes if d != dim]
                if smaller < size and smaller not in others:
                    new = list(sizes)
                    new[position] = (dim, smaller)
                    sets = list(program.sizes)
                    sets[which] = tuple(new)
                    if sets[0] != sets[1]:
                        yield replace(program, sizes=tuple(sets))
                        break


def shrink(program: FuzzProgram, fails: Callable[[FuzzProgram], bool], seconds: float = 30.0) -> FuzzProgram:
    """The smallest program found within `seconds` for which `fails` holds (`program` itself if none)."""
    deadline = time.monotonic() + seconds
    best = program
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for candidate in candidates(best):
            if time.monotonic() >= deadline:
                break
            if candidate != best and fails(candidate):
                best, progress = candidate, True
                break
    return best
