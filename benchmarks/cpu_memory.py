"""CPU peak memory of one call, measured the same way for every contender, beside wrapgen's
planned peak: the CPU stand-in for `torch.cuda.max_memory_allocated()` above the inputs.

The measurement listens to the CPU allocator through the profiler (`profile_memory=True`):
every allocation and free of CPU tensor storage is an event, whoever makes it — ATen ops in
eager mode, Inductor's `empty_strided_cpu`, the python target's `torch.empty_strided`, the C++
target's shim calls. The running sum of those events during one (warm) call is the live
storage the call created; its maximum is the peak above everything that existed before the
call (inputs, weights, caches). Memory a library keeps outside the allocator (oneDNN
scratch pads, thread stacks) is not seen by any contender.

    python -m benchmarks.cpu_memory [--models gpt2,bert,resnet50] [--size small|full]
                                    [--dtype fp32|bf16] [--contenders eager,inductor,python,cpp]
"""

from __future__ import annotations

import argparse
import gc
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

import wrapgen
from benchmarks import models

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONTENDERS = ("eager", "inductor", "python", "cpp")
MB = 1e6


@dataclass(frozen=True)
class CallMemory:
    """Peak bytes of CPU storage live during one call above what existed before it; the same
    without the storage the call returns (its temporaries: what a caller keeping the output
    does not see as used); the bytes of that returned storage."""

    peak: int
    temporaries: int
    output: int


def _allocation_events(prof: torch.profiler.profile) -> list[tuple[int, int, int]]:
    """(start time in ns, address, +bytes or -bytes) of every CPU allocator event recorded."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation and event.extra_fields.device.type == torch.device("cpu").type:
            events.append((event.start_time_ns, event.extra_fields.ptr, event.extra_fields.alloc_size))
    return sorted(events, key=lambda e: e[0])


def output_storages(output: object) -> dict[int, int]:
    """Address -> bytes of the distinct storages of the tensors in `output`."""
    seen: dict[int, int] = {}
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            storage = leaf.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return seen


def measure_call(fn: Callable[[], Any], warm: int = 1) -> CallMemory:
    """Peak CPU storage above the start of a call of `fn` (after `warm` unmeasured calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = fn()
    events = _allocation_events(prof)
    returned = output_storages(output)
    # The allocation that made a returned storage: the last one at its address.
    last_at = {ptr: i for i, (_, ptr, delta) in enumerate(events) if delta > 0}
    kept = {last_at[ptr] for ptr in returned if ptr in last_at}
    live = peak = temporaries = peak_temporaries = 0
    for i, (_, _, delta) in enumerate(events):
        live += delta
        peak = max(peak, live)
        if i not in kept:
            temporaries += delta
            peak_temporaries = max(peak_temporaries, temporaries)
    return CallMemory(peak, peak_temporaries, sum(returned.values()))


def build(contender: str, model: torch.nn.Module, inputs: tuple) -> tuple[Callable[[], Any], int | None]:
    """A zero-argument call of `model` by `contender`, and wrapgen's planned peak (None otherwise)."""
    if contender == "eager":
        return (lambda: model(*inputs)), None
    if contender == "inductor":
        torch._dynamo.reset()
        compiled = torch.compile(model)
        return (lambda: compiled(*inputs)), None
    if contender in ("python", "cpp"):
        fn = wrapgen.compile(model, inputs, target=contender)
        planned = dict(fn.program.metadata).get("peak memory (bytes)")
        return (lambda: fn(*inputs)), None if planned is None else int(planned)
    raise ValueError(f"unknown contender {contender!r}; choose from {', '.join(CONTENDERS)}")


def measure_model(family: models.ModelFamily, size: str, dtype: torch.dtype,
                  contenders: Sequence[str] = CONTENDERS) -> dict[str, tuple[CallMemory, int | None]]:
    """Each contender's measured call memory and planned peak on one model."""
    model, inputs = family.build("cpu", size, dtype)
    results = {}
    with torch.no_grad():
        for contender in contenders:
            fn, planned = build(contender, model, inputs)
            results[contender] = (measure_call(fn), planned)
            del fn
            gc.collect()
    return results


def table(rows: dict[str, dict[str, tuple[CallMemory, int | None]]], contenders: Sequence[str]) -> str:
    """Markdown: per model, each contender's measured peak (MB above the inputs) and the output's size."""
    head = ("| model | output MB | " + " | ".join(f"{c} peak MB" for c in contenders) + " | wrapgen planned MB | "
            + " | ".join(f"{c} without output MB" for c in contenders) + " |")
    lines = [head, "|---|" + "---:|" * (2 * len(contenders) + 2)]
    for name, results in rows.items():
        output = next(iter(results.values()))[0].output
        planned = next((p for _, p in results.values() if p is not None), None)
        cells = [f"{results[c][0].peak / MB:.1f}" if c in results else "—" for c in contenders]
        planned_text = "—" if planned is None else f"{planned / MB:.1f}"
        without = [f"{results[c][0].temporaries / MB:.1f}" if c in results else "—" for c in contenders]
        lines.append(f"| {name} | {output / MB:.1f} | " + " | ".join(cells) + f" | {planned_text} | "
                     + " | ".join(without) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,bert,resnet50")
    parser.add_argument("--size", choices=models.SIZES, default="small")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    args = parser.parse_args(argv)
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(CONTENDERS)}")
    warnings.filterwarnings("ignore")
    rows = {}
    for family in models.select(args.models):
        rows[family.name] = measure_model(family, args.size, DTYPES[args.dtype], contenders)
        print(f"{family.name}: done", flush=True)
    text = f"CPU, {args.size} sizes, {args.dtype}, torch {torch.__version__}\n\n" + table(rows, contenders)
    print(text)
    return text


if __name__ == "__main__":
    main()
