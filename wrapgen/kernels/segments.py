"""How a fusion group's members split into passes over the reduced dimensions.

Shared by every kernel language: row-level members run once per row; consecutive inner
and reduction members share one pass ("segment") over the reduced dimensions until a
member needs a reduction result of the open segment, which starts the next pass.
"""

from __future__ import annotations

from wrapgen.loop_ir import FusionGroup, Member, node_loads

Item = tuple[str, list[Member]]  # ("row", [member]) | ("segment", [members...])


def segments(group: FusionGroup) -> list[Item]:
    items: list[Item] = []
    open_segment: list[Member] | None = None
    for m in group.members:
        if m.level == "row":
            open_segment = None
            items.append(("row", [m]))
            continue
        deps = {ld.buffer for ld in node_loads(m.node)}
        if open_segment is not None and not any(p.node.name in deps and p.level == "reduction" for p in open_segment):
            open_segment.append(m)
        else:
            open_segment = [m]
            items.append(("segment", open_segment))
    return items


def in_place_pairs(group: FusionGroup, stored: set[str], dtypes: dict) -> tuple[tuple[str, str], ...]:
    """(output, input) pairs a pointwise kernel may compute in place: the output is the last
    store of the kernel (so every read precedes it) and the input is read only at the very
    element the output is written to, with the same element type."""
    if group.reduced or not group.members:
        return ()
    last = group.members[-1].node
    if last.name not in stored or last.target:  # state written in place has its own storage
        return ()
    indices: dict[str, set] = {}
    for m in group.members:
        for ld in node_loads(m.node):
            indices.setdefault(ld.buffer, set()).add(ld.index)
    produced = {m.node.name for m in group.members}
    return tuple(
        (last.name, buffer)
        for buffer, seen in indices.items()
        if buffer not in produced and seen == {last.store_index} and dtypes.get(buffer) == last.dtype
    )


def read_in_later_segment(items: list[Item], members: dict[str, Member]) -> set[str]:
    """Inner-level results read in a later segment than the one computing them."""
    where = {m.node.name: i for i, (_, ms) in enumerate(items) for m in ms}
    out = set()
    for i, (_, ms) in enumerate(items):
        for m in ms:
            for ld in node_loads(m.node):
                producer = members.get(ld.buffer)
                if producer is not None and producer.level == "inner" and where[ld.buffer] != i:
                    out.add(ld.buffer)
    return out


def part_members(group: FusionGroup) -> list[list[Member]]:
    """The members of each of the group's independent parts (`FusionGroup.parts`), in order."""
    runs, start = [], 0
    for size in group.parts or (len(group.members),):
        runs.append(group.members[start:start + size])
        start += size
    return runs


def parts_read_apart(group: FusionGroup) -> bool:
    """Whether the group has several parts and no two read a common buffer: parts sharing a read
    (a rotary table applied to queries and keys) are better in one block, which loads it once."""
    if len(group.parts) < 2:
        return False
    seen: set[str] = set()
    for members in part_members(group):
        read = {ld.buffer for m in members for ld in node_loads(m.node)}
        if read & seen:
            return False
        seen |= read
    return True
