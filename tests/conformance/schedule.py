"""Which ops a run takes on, in which order: cheap ops first, split into shards.

Under a wall-clock budget the order decides what gets done: ops run cheapest first (by the
seconds each took in a measured run, `op_costs.json`), so a run cut short has covered as
many ops as it could, and the ops it did not reach are the slow ones, listed by name.
`--shard i/n` takes every n-th op of that order, so each shard gets a like mix of cheap
and slow ops and the shards of one run take about the same time.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

COSTS_PATH = Path(__file__).with_name("op_costs.json")


def parse_shard(text: str) -> tuple[int, int]:
    """`"2/5"` -> (2, 5); shards count from 1."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"--shard takes i/n (e.g. 1/3), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: i must be between 1 and n")
    return index, count


def load_costs(path: Path | None = COSTS_PATH) -> dict[str, float]:
    """Seconds per op from a measured run ({} when there is none)."""
    if path is None or not path.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def write_costs(path: Path, seconds: Mapping[str, float], source: str) -> None:
    path.write_text(json.dumps({"source": source, "seconds": dict(sorted(seconds.items()))}, indent=0) + "\n")


def order(keys: Sequence[str], costs: Mapping[str, float]) -> list[str]:
    """Cheapest first; an op without a measured cost counts as a typical (median) one; ties by name."""
    typical = statistics.median(costs.values()) if costs else 0.0
    return sorted(keys, key=lambda k: (costs.get(k, typical), k))


def take_shard(items: Sequence, index: int, count: int) -> list:
    """Every `count`-th item starting at `index` (1-based)."""
    return list(items[index - 1 :: count])
