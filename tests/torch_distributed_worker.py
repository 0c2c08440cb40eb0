"""One rank of tests/test_torch_distributed.py: torch.distributed's own parallelisms, compiled by wrapgen.

    python tests/torch_distributed_worker.py RANK WORLD PORT TARGETS SCENARIOS

Joins a gloo process group over loopback, then for each scenario and target wraps a small MLP
the way a user does, compiles it with torch.compile(backend="wrapgen"), and takes three training
steps (forward, backward, an SGD step), comparing every loss, and the final gradients and
parameters, with the same model trained without distribution in this process on every rank's
data. Prints one JSON line per check; exits non-zero on the first mismatch. Scenarios:

  fsdp2  `fully_shard` on each block, then on the root (FSDP2: parameters are sharded DTensors,
         all-gathered before each block and their gradients reduce-scattered, by its hooks)
  tp     `parallelize_module`, each block's up projection column-parallel and its down projection
         row-parallel (DTensor tensor parallelism; the compiled graphs take the device mesh as an
         opaque input, which wrapgen hands on around the program)
  ddp    `DistributedDataParallel` (gradients all-reduced in buckets by its hooks)
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from collectives_worker import _record_programs, programs  # the other worker, beside this script

D, H, BATCH, STEPS, LR = 16, 32, 4, 3, 0.05


class Block(torch.nn.Module):
    """A transformer MLP block: up, GELU, down, residual."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(D, H), torch.nn.Linear(H, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def parallelize(model: torch.nn.Module, scenario: str, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    if scenario == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if scenario == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {f"{i}.{name}": style() for i in range(2) for name, style in (("up", ColwiseParallel), ("down", RowwiseParallel))}
        return parallelize_module(model, mesh, plan)
    return torch.nn.parallel.DistributedDataParallel(model)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check(scenario: str, target: str, rank: int, world: int) -> dict:
    torch._dynamo.reset()
    before = len(programs)
    model = parallelize(make_model(), scenario, world)
    reference = make_model()
    compiled = torch.compile(model, backend="wrapgen", options={"target": target})
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        data = torch.randn(world, BATCH, D, generator=g)
        mine = data[0] if scenario == "tp" else data[rank]  # tensor parallelism: every rank the same rows
        loss = compiled(mine).square().mean()
        loss.backward()
        shown = loss.detach().clone()
        if scenario != "tp":  # each rank's loss is its shard's: their mean is the full batch's
            dist.all_reduce(shown)
            shown /= world
        expected = (reference(data[0]).square().mean() if scenario == "tp"
                    else sum(reference(data[r]).square().mean() for r in range(world)) / world)
        expected.backward()
        torch.testing.assert_close(shown, expected.detach(), rtol=1e-5, atol=1e-6,
                                   msg=lambda m, s=step: f"{scenario}/{target} step {s} loss: {m}")
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(full(p.grad), q.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, n=name, s=step: f"{scenario}/{target} step {s} grad {n}: {m}")
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(full(p.detach()), q.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"{scenario}/{target} parameter {n}: {m}")
    return {"scenario": scenario, "target": target, "rank": rank, "steps": STEPS, "programs": len(programs) - before}


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    targets, scenarios = sys.argv[4].split(","), sys.argv[5].split(",")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    import wrapgen.dynamo

    wrapgen.dynamo.ensure_registered()
    _record_programs()
    try:
        for scenario in scenarios:
            for target in targets:
                print(json.dumps(check(scenario, target, rank, world)), flush=True)
    finally:
        dist.destroy_process_group()


main()
