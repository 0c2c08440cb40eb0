"""`make demo`: compile an example model with every wrapgen target, check it against eager,
show the Wrapper IR, an excerpt of the emitted code, and a timing table."""

from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.nn as nn

import wrapgen

warnings.filterwarnings("ignore")


class TinyBlock(nn.Module):
    """A pre-norm MLP block with a residual and a sigmoid gate: a little of everything."""

    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.gate = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return x + h * torch.sigmoid(self.gate(x))


def median_us(fn, x: torch.Tensor, rounds: int = 7, calls: int = 50) -> float:
    for _ in range(5):
        fn(x)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    torch.manual_seed(0)
    model = TinyBlock().eval()
    example = torch.randn(8, 64)
    fresh = torch.randn(8, 64)
    with torch.no_grad():
        expected = model(fresh)

    print("== Wrapper IR ==")
    print(wrapgen.lower(model, (example,)))

    timings: list[tuple[str, float, float]] = []
    with torch.no_grad():
        timings.append(("eager", 0.0, median_us(model, fresh)))
        for target in wrapgen.backends.registered_backends():
            start = time.perf_counter()
            compiled = wrapgen.compile(model, (example,), target=target)
            compile_s = time.perf_counter() - start
            torch.testing.assert_close(compiled(fresh), expected)
            print(f"== target {target!r}: matches eager; emitted code (excerpt) ==")
            source = compiled.source.splitlines()
            start_line = next((i for i, line in enumerate(source) if line.startswith("def call")), 0)
            print("\n".join(source[start_line : start_line + 24]))
            print("    ...\n")
            timings.append((f"wrapgen[{target}]", compile_s, median_us(compiled, fresh)))
        print("compiling with torch.compile (Inductor) for comparison ...", flush=True)
        inductor = torch.compile(model)
        start = time.perf_counter()
        torch.testing.assert_close(inductor(fresh), expected)
        timings.append(("torch.compile", time.perf_counter() - start, median_us(inductor, fresh)))

    eager_us = timings[0][2]
    print("== timing (batch 8, dim 64, CPU; median of 7 rounds) ==")
    print(f"{'contender':<20} {'compile s':>10} {'us/call':>10} {'vs eager':>9}")
    for name, compile_s, us in timings:
        print(f"{name:<20} {compile_s:>10.2f} {us:>10.1f} {eager_us / us:>8.2f}x")


if __name__ == "__main__":
    main()
