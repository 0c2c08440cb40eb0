"""The array-ref entry against the handle entry of one AOT package: the demo model at batch 1, a
2-layer MLP and the GPT-2 and BERT small configurations, from Python (median per call, the entries
interleaved by round) and from the C++ example (examples/arrayref_call.cpp, built here with g++).

    python -m benchmarks.arrayref [--models demo,mlp,gpt2,bert] [--rounds 11] [--calls 2000]
        [--cpp-calls 20000]

--calls and --cpp-calls are per round for the tiny models; a model whose call takes longer gets as
many as fit in about a fifth of a second a round (at least 5).
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import wrapgen
from benchmarks.interleaved import interleave
from benchmarks.models import FAMILIES
from examples.demo import TinyBlock
from wrapgen.backends.cpp.build import torch_library_dir
from wrapgen.packaging import write_tensor_file

REPO = Path(__file__).resolve().parents[1]


MODEL_NAMES = ("demo", "mlp", "gpt2", "bert")
TINY = {"demo": "demo (batch 1)", "mlp": "2-layer MLP 32-64-10 (batch 1)"}
ROUND_SECONDS = 0.2  # a larger model's calls per round: as many as fit in this


def models() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    return {TINY["demo"]: (TinyBlock().eval(), torch.randn(1, 64)), TINY["mlp"]: (mlp, torch.randn(1, 32))}


def build_model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """The model in eval mode, its example inputs, and a line saying what it is: one of the two tiny
    models, or a model family's small configuration (benchmarks.models)."""
    if name in TINY:
        model, x = models()[TINY[name]]
        return model, (x,), TINY[name]
    torch.manual_seed(0)
    family = FAMILIES[name]
    model, inputs = family.build("cpu", "small", torch.float32)
    sizes = ", ".join(f"{k}={v}" for k, v in family.sizes["small"].items())
    return model.eval(), tuple(inputs), f"{family.description}; small config: {sizes}"


def calls_per_round(seconds_per_call: float, tiny_calls: int, tiny: bool) -> int:
    """`tiny_calls` for the tiny models, else as many as fit in a fifth of a second (at least 5)."""
    return tiny_calls if tiny else max(5, min(tiny_calls, int(ROUND_SECONDS / max(seconds_per_call, 1e-9))))


def build_example(folder: Path) -> Path:
    lib = torch_library_dir()
    binary = folder / "arrayref_call"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO / 'cpp_runtime' / 'include'}", f"-I{Path(lib).parent / 'include'}",
                    str(REPO / "examples" / "arrayref_call.cpp"), f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10", "-ldl",
                    "-o", str(binary)], check=True)
    return binary


def time_in_cpp(binary: Path, package: str | Path, inputs: tuple[torch.Tensor, ...], folder: Path, calls: int,
                rounds: int) -> tuple[float, float]:
    """(handle, array-ref) µs per call of one package, timed by the C++ example (its outputs must
    agree exactly, or it fails)."""
    slug = re.sub(r"\W+", "_", Path(package).name)
    write_tensor_file(folder / f"{slug}.bin", {f"x{i}": x for i, x in enumerate(inputs)})
    done = subprocess.run([str(binary), str(package), str(folder / f"{slug}.bin"), str(calls), str(rounds)],
                          check=True, capture_output=True, text=True)
    cpp = dict(re.findall(r"(handle|array-ref) entry: +([\d.]+) us/call", done.stdout))
    return float(cpp["handle"]), float(cpp["array-ref"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="demo,mlp", help=f"comma-separated, of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cpp-calls", type=int, default=20000)
    args = parser.parse_args(argv)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(MODEL_NAMES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; models are {', '.join(MODEL_NAMES)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        binary = build_example(folder)
        print("| model | handle, Python (µs) | arrayref, Python (µs) | handle, C++ (µs) | arrayref, C++ (µs) | C++ ratio |")
        print("|---|---|---|---|---|---|")
        for key in chosen:
            model, inputs, name = build_model(key)
            slug = re.sub(r"\W+", "_", key)
            with torch.no_grad():
                path = wrapgen.aot_compile(model, inputs, folder / f"{slug}.wgpkg", arrayref=True)
            handle, arrayref = wrapgen.load_package(path), wrapgen.load_package(path, interface="arrayref")
            torch.testing.assert_close(arrayref(*inputs), handle(*inputs), rtol=0, atol=0)
            start = time.perf_counter()
            handle(*inputs)
            per_call = time.perf_counter() - start
            calls = {"handle": functools.partial(handle, *inputs), "arrayref": functools.partial(arrayref, *inputs)}
            times = interleave(calls, "cpu", args.rounds, calls_per_round(per_call, args.calls, key in TINY))
            py = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            h, a = time_in_cpp(binary, path, inputs, folder, calls_per_round(per_call, args.cpp_calls, key in TINY), args.rounds)
            label = name if key in TINY else f"{key} small ({name.split('small config: ')[-1]})"
            print(f"| {label} | {py['handle']:.2f} | {py['arrayref']:.2f} | {h:.2f} | {a:.2f} | {a / h:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
