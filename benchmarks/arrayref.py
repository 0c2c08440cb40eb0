"""The array-ref entry against the handle entry of one AOT package: the demo model at batch 1 and a
2-layer MLP, from Python (median per call, the entries interleaved by round) and from the C++
example (examples/arrayref_call.cpp, built here with g++).

    python -m benchmarks.arrayref [--rounds 11] [--calls 2000] [--cpp-calls 20000]
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

import wrapgen
from benchmarks.interleaved import interleave
from examples.demo import TinyBlock
from wrapgen.backends.cpp.build import torch_library_dir
from wrapgen.packaging import write_tensor_file

REPO = Path(__file__).resolve().parents[1]


def models() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    return {"demo (batch 1)": (TinyBlock().eval(), torch.randn(1, 64)), "2-layer MLP 32-64-10 (batch 1)": (mlp, torch.randn(1, 32))}


def build_example(folder: Path) -> Path:
    lib = torch_library_dir()
    binary = folder / "arrayref_call"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO / 'cpp_runtime' / 'include'}", f"-I{Path(lib).parent / 'include'}",
                    str(REPO / "examples" / "arrayref_call.cpp"), f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10", "-ldl",
                    "-o", str(binary)], check=True)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cpp-calls", type=int, default=20000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        binary = build_example(folder)
        print("| model | handle, Python (µs) | arrayref, Python (µs) | handle, C++ (µs) | arrayref, C++ (µs) | C++ ratio |")
        print("|---|---|---|---|---|---|")
        for name, (model, x) in models().items():
            slug = re.sub(r"\W+", "_", name)
            with torch.no_grad():
                path = wrapgen.aot_compile(model, (x,), folder / f"{slug}.wgpkg", arrayref=True)
            handle, arrayref = wrapgen.load_package(path), wrapgen.load_package(path, interface="arrayref")
            torch.testing.assert_close(arrayref(x), handle(x), rtol=0, atol=0)
            calls = {"handle": functools.partial(handle, x), "arrayref": functools.partial(arrayref, x)}
            times = interleave(calls, "cpu", args.rounds, args.calls)
            py = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            write_tensor_file(folder / f"{slug}.bin", {"x": x})
            done = subprocess.run([str(binary), path, str(folder / f"{slug}.bin"), str(args.cpp_calls), str(args.rounds)],
                                  check=True, capture_output=True, text=True)
            cpp = dict(re.findall(r"(handle|array-ref) entry: +([\d.]+) us/call", done.stdout))
            h, a = float(cpp["handle"]), float(cpp["array-ref"])
            print(f"| {name} | {py['handle']:.2f} | {py['arrayref']:.2f} | {h:.2f} | {a:.2f} | {a / h:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
