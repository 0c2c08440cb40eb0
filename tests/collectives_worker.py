"""One rank of the distributed tests (tests/test_collectives_distributed.py starts WORLD of these).

    python tests/collectives_worker.py RANK WORLD PORT TARGETS SCENARIOS

Joins a gloo process group over loopback, then for each scenario and target compiles the
model with torch.compile(backend="wrapgen") (aot_autograd: forward and backward graphs), runs
forward and backward and compares outputs and gradients with the same model computed without
distribution in this process (full weights, every rank's data). Prints one JSON line per
check; exits non-zero on the first mismatch. Scenarios:

  tp    tensor-parallel MLP: column- then row-parallel linear, all_reduce of the output (and of
        the input's gradient in the backward)
  fsdp  FSDP-like: weight shards all-gathered in the forward, gradients reduce-scattered in the
        backward
  ddp   DDP-like: replicated weights whose gradients are all-reduced in the compiled backward
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import wrapgen.api

# Model width, hidden width per rank (tp, fsdp: the whole hidden width grows with the ranks, so a
# rank's tp program is the same for 2 and 4 ranks and built once), ddp's hidden width, batch.
D, H_PER_RANK, H_DDP, BATCH = 8, 8, 16, 4
programs: list = []


def _record_programs() -> None:
    start_emit = wrapgen.api._start_emit  # every program emitted goes through it

    def recording(program, target):
        programs.append(program)
        return start_emit(program, target)

    wrapgen.api._start_emit = recording


class CopyToParallel(torch.autograd.Function):
    """Identity forward; the gradient is all-reduced (Megatron's f)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


class ReduceFromParallel(torch.autograd.Function):
    """All-reduce forward; identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx, x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    @staticmethod
    def backward(ctx, grad):
        return grad


def full_weights(hidden: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)  # the same on every rank
    return {
        "w1": torch.randn(hidden, D, generator=generator) / D**0.5,
        "b1": torch.randn(hidden, generator=generator),
        "w2": torch.randn(D, hidden, generator=generator) / hidden**0.5,
        "b2": torch.randn(D, generator=generator),
    }


def rank_input(rank: int) -> torch.Tensor:
    return torch.randn(BATCH, D, generator=torch.Generator().manual_seed(100 + rank))


def reference(weights: dict, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict, list[torch.Tensor]]:
    """Outputs per input, weight gradients summed over inputs, and each input's gradient."""
    leaves = {k: v.clone().requires_grad_() for k, v in weights.items()}
    outputs, input_grads = [], []
    for x in inputs:
        x = x.clone().requires_grad_()
        y = F.linear(F.gelu(F.linear(x, leaves["w1"], leaves["b1"])), leaves["w2"], leaves["b2"])
        y.square().sum().backward()
        outputs.append(y.detach())
        input_grads.append(x.grad)
    return outputs, {k: v.grad for k, v in leaves.items()}, input_grads


def tp_model(x, w1, b1, w2, b2):
    x = CopyToParallel.apply(x)
    h = F.gelu(F.linear(x, w1, b1))  # column-parallel: this rank's rows of w1
    return ReduceFromParallel.apply(F.linear(h, w2)) + b2  # row-parallel: this rank's columns of w2


def fsdp_model(x, w1_shard, b1, w2_shard, b2):
    group = dist.group.WORLD
    w1 = funcol.all_gather_tensor_autograd(w1_shard, 0, group)
    w2 = funcol.all_gather_tensor_autograd(w2_shard, 0, group)
    h = F.gelu(F.linear(x, w1, b1))
    return F.linear(h, w2, b2)


def ddp_model(x, w1, b1, w2, b2):
    w1, b1, w2, b2 = (AllReduceGrad.apply(p) for p in (w1, b1, w2, b2))
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


class AllReduceGrad(torch.autograd.Function):
    """Identity forward; the gradient is summed over the ranks (DDP's gradient all_reduce)."""

    @staticmethod
    def forward(ctx, p):
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


def scenario(name: str, rank: int, world: int):
    """(model, argument tensors, expected output, expected gradients of the arguments)."""
    weights = full_weights(H_DDP if name == "ddp" else H_PER_RANK * world)
    rows = slice(rank * H_PER_RANK, (rank + 1) * H_PER_RANK)
    if name == "tp":
        x = rank_input(0)  # every rank sees the same batch
        (out,), grads, (x_grad,) = reference(weights, [x])
        args = [x, weights["w1"][rows], weights["b1"][rows], weights["w2"][:, rows], weights["b2"]]
        # every rank holds the whole output and loss: x's partial gradients are all-reduced, each
        # rank's shard of w1/b1/w2 gets its slice of the full gradient, and b2 (added after the
        # all_reduce) the full gradient
        expected = [x_grad, grads["w1"][rows], grads["b1"][rows], grads["w2"][:, rows], grads["b2"]]
        return tp_model, args, out, expected
    inputs = [rank_input(r) for r in range(world)]
    outs, grads, _ = reference(weights, inputs)
    if name == "fsdp":
        w2_rows = slice(rank * D // world, (rank + 1) * D // world)
        args = [inputs[rank], weights["w1"][rows], weights["b1"], weights["w2"][w2_rows], weights["b2"]]
        local = reference(weights, [inputs[rank]])[1]
        expected = [None, grads["w1"][rows], local["b1"], grads["w2"][w2_rows], local["b2"]]
        return fsdp_model, args, outs[rank], expected
    if name == "ddp":
        args = [inputs[rank], weights["w1"], weights["b1"], weights["w2"], weights["b2"]]
        return ddp_model, args, outs[rank], [None, grads["w1"], grads["b1"], grads["w2"], grads["b2"]]
    raise ValueError(f"unknown scenario {name}")


def check(name: str, target: str, rank: int, world: int) -> dict:
    model, args, expected_out, expected_grads = scenario(name, rank, world)
    leaves = [a.clone().contiguous().requires_grad_() for a in args]
    torch._dynamo.reset()
    del programs[:]
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    started = time.perf_counter()
    out = compiled(*leaves)
    out.square().sum().backward()
    seconds = time.perf_counter() - started
    torch.testing.assert_close(out.detach(), expected_out, rtol=1e-4, atol=1e-4)
    for index, (leaf, grad) in enumerate(zip(leaves, expected_grads)):
        if grad is not None:
            torch.testing.assert_close(leaf.grad, grad, rtol=1e-4, atol=1e-4, msg=lambda m, i=index: f"grad of argument {i}: {m}")
    starts = [sum("collective_start" in line for line in str(p).splitlines()) for p in programs]
    overlap = [dict(p.metadata).get("collective overlap") for p in programs]
    return {"rank": rank, "scenario": name, "target": target, "graphs": len(programs), "starts": starts,
            "overlap": overlap, "seconds": round(seconds, 2)}


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    targets, scenarios = sys.argv[4].split(","), sys.argv[5].split(",")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    _record_programs()
    try:
        for name in scenarios:
            for target in targets:
                print(json.dumps(check(name, target, rank, world)), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
