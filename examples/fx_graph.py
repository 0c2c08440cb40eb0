"""Print the torch.fx graph the "fx" target builds: `python examples/fx_graph.py [--dynamic]`.

Shows the benchmark's pointwise_chain workload (one fused C++ kernel) and a model with topk
(a library call with two out= buffers), each checked against eager first.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

import wrapgen
from wrapgen.backends import FxEmitter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import PointwiseChain  # noqa: E402

warnings.filterwarnings("ignore")


def topk_then_scale(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(x, 3, dim=-1)
    return values * 2 + 1, indices


def show(title: str, model, inputs: tuple, dynamic: bool) -> None:
    compiled = wrapgen.compile(model, inputs, target="fx", dynamic=dynamic)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    gm = FxEmitter().emit(compiled.program)
    print(f"== {title} ({'dynamic' if dynamic else 'static'} shapes): matches eager ==")
    print(gm.graph)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic shapes")
    args = parser.parse_args()
    torch.manual_seed(0)
    show("pointwise_chain", PointwiseChain().eval(), (torch.randn(4096), torch.randn(4096)), args.dynamic)
    show("topk", topk_then_scale, (torch.randn(8, 16),), args.dynamic)


if __name__ == "__main__":
    main()
