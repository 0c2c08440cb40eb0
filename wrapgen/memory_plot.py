"""The memory-plan picture: buffer lifetimes (x: program line) against byte offsets (y)."""

from __future__ import annotations

import warnings
from pathlib import Path

from wrapgen.wrapper_ir.lines import AllocateFromPool
from wrapgen.wrapper_ir.passes.memory_layout import memory_layout
from wrapgen.wrapper_ir.program import Program


def plot_memory_plan(program: Program, path: str | Path, title: str | None = None) -> Path | None:
    """Write a PNG of the program's memory plan; None (with a warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        warnings.warn("matplotlib is not installed: no memory-plan picture", stacklevel=2)
        return None
    blocks = memory_layout(program)
    fig, ax = plt.subplots(figsize=(10, 5))
    top = 1
    pools = {line.pool for line in program.lines if isinstance(line, AllocateFromPool)}
    for block in blocks:
        width = block.end - block.start + 1
        if block.label in pools:  # the pool itself: an outline around its buffers
            ax.add_patch(Rectangle((block.start, 0), width, block.size, fill=False, ec="tab:blue", lw=1.5, ls="--"))
            top = max(top, block.size)
            continue
        color = "tab:blue" if block.pooled else "tab:orange"
        ax.add_patch(Rectangle((block.start, block.offset), width, block.size, alpha=0.6, fc=color, ec="black"))
        if block.size > 0:
            ax.text(block.start + 0.2, block.offset + block.size / 2, block.label, fontsize=6, va="center")
        top = max(top, block.offset + block.size)
    ax.set_xlim(0, max(len(program.lines), 1))
    ax.set_ylim(0, top * 1.05)
    ax.set_xlabel("program line")
    ax.set_ylabel("byte offset (at the symbols' hints)")
    peak = dict(program.metadata).get("peak memory (bytes)", "?")
    mode = dict(program.metadata).get("memory planning", "?")
    ax.set_title(title or f"{program.name}: memory plan ({mode}), peak {peak} bytes; blue = in a pool (dashed), orange = own storage")
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
