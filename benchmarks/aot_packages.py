"""wrapgen's AOT packages against AOTInductor's, on the CPU, called from Python: the same models
exported once, each package built and loaded as a user would, every output checked against
eager's, then timed per call with the contenders interleaved by round (medians of rounds).

    python -m benchmarks.aot_packages [--models demo,mlp,gpt2,bert,resnet50] [--rounds 11]
        [--calls 200] [--cpp] [--out-dir DIR]

Contenders: `wrapgen` (`wrapgen.aot_compile` + `wrapgen.load_package`, the handle entry),
`wrapgen[arrayref]` (the same package's array-ref entry, `load_package(..., interface="arrayref")`,
where the program has one) and `AOTInductor` (`torch.export.export` +
`torch._inductor.aoti_compile_and_package` + `torch._inductor.aoti_load_package`). Also per
contender: the build's wall time (export included) and the package's size on disk. `--cpp` also
times the array-ref package's two entries from C++ (examples/arrayref_call.cpp, built here with g++,
the entries interleaved by round), where a call has no Python around it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

import wrapgen
from benchmarks import machine, step_rounds
from benchmarks.arrayref import TINY, build_example, build_model, calls_per_round, time_in_cpp
from benchmarks.interleaved import interleave

MODEL_NAMES = ("demo", "mlp", "gpt2", "bert", "resnet50")
CONTENDERS = ("wrapgen", "wrapgen[arrayref]", "AOTInductor")


@dataclass
class Cell:
    model: str
    contender: str
    status: str = "ok"  # ok | refused | error | wrong
    detail: str = ""
    build_s: float | None = None
    package_bytes: int | None = None
    package: str = ""  # where the package was built (wrapgen's: the C++ example loads it)
    round_us: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float | None:
        return statistics.median(self.round_us) if self.round_us else None


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_contenders(name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], folder: Path,
                     wanted: Sequence[str]) -> tuple[dict[str, Callable[[], Any]], list[Cell]]:
    """Each wanted contender's warm call, checked against eager's outputs; the cells say what
    happened to each."""
    with torch.no_grad():
        expected = _flat(model(*inputs))
    calls: dict[str, Callable[[], Any]] = {}
    cells: list[Cell] = []
    for contender in wanted:
        cell = Cell(name, contender)
        cells.append(cell)
        _progress(f"{name}: building {contender}")
        try:
            started = time.perf_counter()
            call = _build(contender, model, inputs, folder / f"{name}-{contender.replace('[', '-').rstrip(']')}", cell)
            cell.build_s = time.perf_counter() - started
            if call is None:
                continue
            with torch.no_grad():
                for _ in range(3):
                    actual = _flat(call())
            for a, e in zip(actual, expected, strict=True):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * max(1.0, float(e.abs().max())))
        except Exception as error:  # noqa: BLE001 - the cell says what broke; the run goes on
            cell.status, cell.detail = ("wrong" if isinstance(error, AssertionError) else "error"), step_rounds.first_line(error)
            continue
        calls[contender] = call
    return calls, cells


def _build(contender: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], path: Path,
           cell: Cell) -> Callable[[], Any] | None:
    if contender == "AOTInductor":
        with torch.no_grad():
            exported = torch.export.export(model, inputs)
            package = torch._inductor.aoti_compile_and_package(exported, package_path=str(path.with_suffix(".pt2")))
        cell.package_bytes = _size(Path(package))
        runner = torch._inductor.aoti_load_package(package)
        return lambda: runner(*inputs)
    arrayref = contender == "wrapgen[arrayref]"
    try:
        with torch.no_grad():
            package = wrapgen.aot_compile(model, inputs, path.with_suffix(".wgpkg"), arrayref=arrayref)
    except Exception as error:
        from wrapgen.backends.cpp.arrayref import ArrayRefRefused

        if arrayref and isinstance(error, ArrayRefRefused):
            cell.status, cell.detail = "refused", step_rounds.first_line(error)
            return None
        raise
    cell.package_bytes, cell.package = _size(Path(package)), str(package)
    loaded = wrapgen.load_package(package, interface="arrayref" if arrayref else "handle")
    return lambda: loaded(*inputs)


def _calls_per_round(calls: dict[str, Callable[[], Any]], most: int) -> int:
    """At most `most` calls a round, fewer where a call is slow: a round of one contender takes
    about a fifth of a second at most."""
    if not calls:
        return most
    first = next(iter(calls.values()))
    with torch.no_grad():
        started = time.perf_counter()
        first()
        one = time.perf_counter() - started
    return max(5, min(most, int(0.2 / max(one, 1e-6))))


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class CppRow:
    """The array-ref package's two entries timed from C++ (µs per call, medians of rounds)."""

    model: str
    handle_us: float
    arrayref_us: float

    @property
    def ratio(self) -> float:
        return self.arrayref_us / self.handle_us


def time_entries_in_cpp(cell: Cell, call: Callable[[], Any], inputs: tuple[torch.Tensor, ...], folder: Path, binary: Path,
                        rounds: int, tiny_calls: int) -> CppRow:
    """The C++ example on the package of the `wrapgen[arrayref]` contender's `cell` (`call` runs it
    from Python: one call sizes the rounds)."""
    with torch.no_grad():
        started = time.perf_counter()
        call()
    calls = calls_per_round(time.perf_counter() - started, tiny_calls, cell.model in TINY)
    _progress(f"{cell.model}: the C++ example, {rounds} rounds of {calls} calls")
    return CppRow(cell.model, *time_in_cpp(binary, Path(cell.package), inputs, folder, calls, rounds))


def markdown(cells: list[Cell], described: dict[str, str], info: machine.MachineInfo, settings: dict[str, Any],
             command: str, cpp_rows: Sequence[CppRow] = ()) -> str:
    lines = step_rounds.header(info, "wrapgen benchmarks: AOT packages against AOTInductor's", settings, command)
    lines += ["## µs per call, from Python", "",
              "| model | contender | status | µs per call (median) | min - max | vs AOTInductor | build | package |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for name in described:
        row = [c for c in cells if c.model == name]
        aoti = next((c.median_us for c in row if c.contender == "AOTInductor"), None)
        for c in row:
            spread = f"{min(c.round_us):.1f} - {max(c.round_us):.1f}" if c.round_us else "—"
            ratio = f"{aoti / c.median_us:.2f}x" if aoti and c.median_us else "—"
            size = f"{c.package_bytes / 1e6:.2f} MB" if c.package_bytes is not None else "—"
            lines.append(f"| {name} | {c.contender} | {c.status} | {step_rounds.fmt(c.median_us, '.1f')} | {spread} | "
                         f"{ratio} | {step_rounds.fmt(c.build_s, '.1f', ' s')} | {size} |")
    if cpp_rows:
        lines += ["", "## The array-ref package's entries, from C++ (examples/arrayref_call.cpp)", "",
                  "| model | handle entry (µs) | array-ref entry (µs) | array-ref / handle |", "|---|---:|---:|---:|"]
        lines += [f"| {r.model} | {r.handle_us:.2f} | {r.arrayref_us:.2f} | {r.ratio:.2f}x |" for r in cpp_rows]
    problems = [c for c in cells if c.status != "ok"]
    if problems:
        lines += ["", "## Not timed", ""]
        lines += [f"- **{c.model} / {c.contender}** — {c.status}: `{step_rounds.cell(c.detail)[:400]}`" for c in problems]
    lines += ["", "## Models", "", "| model | what |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in described.items()]
    lines += ["", "## Method", "",
              "- Each model is built once (random weights, seed 0, eval mode, float32) and every contender's package",
              "  is built from it in this process (AOTInductor from `torch.export.export` of the model), loaded, and",
              "  called three times; its outputs are compared with eager's (`rtol` 1e-4, `atol` 1e-4 × the output's",
              "  largest magnitude). **vs AOTInductor**: AOTInductor's time over the contender's (above 1: faster).",
              "- Each round times `calls` back-to-back calls of every contender of a model, the order rotating by one",
              "  each round; reported: the median over rounds, and the fastest and slowest round.",
              "- **build**: the wall time from the model to a loadable package (export and compile), with the compile",
              "  caches as found; **package**: its size on disk.",
              "- **From C++** (`--cpp`): the example program loads the `wrapgen[arrayref]` package without Python, checks",
              "  that both entries give the same outputs bit for bit, then times rounds of back-to-back calls of each",
              "  entry in turn (the handle entry given tensor handles, the array-ref entry plain descriptors and output",
              "  memory of the caller's); reported: the median over rounds.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aot_packages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODEL_NAMES), help=f"comma-separated subset of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {', '.join(CONTENDERS)}")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=200,
                        help="calls per round and contender, at most (fewer where a round would pass 0.2 s)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's)")
    parser.add_argument("--cpp", action="store_true", help="also time the array-ref package's two entries from C++")
    parser.add_argument("--cpp-calls", type=int, default=20000, help="C++ calls per round for demo and mlp (others: 0.2 s)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the page and its .json here")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    wanted = [c for c in args.contenders.split(",") if c]
    unknown = [n for n in names if n not in MODEL_NAMES] + [c for c in wanted if c not in CONTENDERS]
    if unknown:
        parser.error(f"unknown model or contender: {', '.join(unknown)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cells: list[Cell] = []
    cpp_rows: list[CppRow] = []
    described: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_example(Path(tmp)) if args.cpp else None
        for name in names:
            model, inputs, described[name] = build_model(name)
            calls, built = build_contenders(name, model, inputs, Path(tmp), wanted)
            cells += built
            per_round = _calls_per_round(calls, args.calls)
            _progress(f"{name}: {args.rounds} rounds of {per_round} calls")
            with torch.no_grad():
                times = interleave(calls, "cpu", args.rounds, per_round)
            for cell in built:
                cell.round_us = [t * 1e6 for t in times.get(cell.contender, [])]
            arrayref = next((c for c in built if c.contender == "wrapgen[arrayref]"), None)
            if binary is not None and arrayref is not None and arrayref.contender in calls:
                cpp_rows.append(time_entries_in_cpp(arrayref, calls[arrayref.contender], inputs, Path(tmp), binary,
                                                    args.rounds, args.cpp_calls))
    info = machine.collect("cpu")
    command = "python -m benchmarks.aot_packages " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = {"rounds × calls": f"{args.rounds} × at most {args.calls} (a round of one contender: 0.2 s at most)", "run took": f"{(time.perf_counter() - started) / 60:.1f} min"}
    text = markdown(cells, described, info, settings, command, cpp_rows)
    print(text.split("## Models")[0])
    if args.out_dir is None:
        return []
    payload = {"machine": info.as_dict(), "settings": settings, "command": command, "models": described,
               "results": [asdict(c) | {"median_us": c.median_us, "package": None} for c in cells],  # no temporary paths
               "cpp": [asdict(r) | {"ratio": r.ratio} for r in cpp_rows]}
    paths = step_rounds.write(args.out_dir, machine.file_stem(info, "aot-packages"), text, payload)
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
