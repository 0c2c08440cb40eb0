"""The benchmark workloads: small float32 models, their inputs, and their sizes per device.

Each workload has three size profiles: `cuda` (the sizes named in the issue), `cpu` (smaller,
so that a full CPU run, torch.compile's cold compiles included, takes a few minutes on two
cores) and `quick` (tiny; a smoke run of the harness itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PROFILES = ("cuda", "cpu", "quick")


# -- models ----------------------------------------------------------------------------------


class PointwiseChain(nn.Module):
    """About a dozen elementwise ops over two inputs, one output: one fused kernel at best."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(a) * b
        y = torch.tanh(b) + a
        z = torch.where(x > y, x, y * 0.5)
        z = torch.exp(-z.abs())
        return torch.relu(z * a + b)


class LayerNormGelu(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(x + r))


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.125, dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MLP(nn.Module):
    """fc2(GELU(fc1(x))) + x."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x))) + x


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)); causal attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        assert dim % heads == 0, (dim, heads)
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyChain(nn.Module):
    """`x = tanh(x @ w_i)` for each of `n` small weights: 2n tiny kernels."""

    def __init__(self, n: int, dim: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim)) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(x @ w)
        return x


# -- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A named model factory. `sizes[profile]` holds the keyword arguments of `make`;
    `make(device, **size)` returns (model, example inputs)."""

    name: str
    description: str
    make: Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]
    sizes: dict[str, dict[str, Any]]
    memory_bound: bool = False
    rtol: float = 1e-4
    atol: float = 1e-4
    atol_scaled: bool = False  # atol is relative to each output tensor's largest magnitude (real models)
    training: bool = False  # the model is a benchmarks.training.TrainingStep: forward + backward
    # A result the direct comparison refuses is judged against the float64 result (always so for
    # training steps): deep fp32 networks differ from eager by cuDNN's TF32 rounding, Inductor's too.
    float64_fallback: bool = False

    def build(self, device: str, profile: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(seed)
        model, inputs = self.make(torch.device(device), **self.sizes[profile])
        return model.to(device).eval(), inputs

    def size_text(self, profile: str) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes[profile].items())


def _randn(device: torch.device, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=torch.float32)


def _pointwise(device, numel):
    return PointwiseChain(), (_randn(device, numel), _randn(device, numel))


def _layernorm_gelu(device, rows, cols):
    return LayerNormGelu(cols), (_randn(device, rows, cols), _randn(device, rows, cols))


def _softmax(device, rows, cols):
    return Softmax(), (_randn(device, rows, cols),)


def _rmsnorm(device, rows, cols):
    return RMSNorm(cols), (_randn(device, rows, cols),)


def _mlp(device, rows, dim, hidden):
    return MLP(dim, hidden), (_randn(device, rows, dim),)


def _block(device, batch, tokens, dim, heads):
    return Block(dim, heads), (_randn(device, batch, tokens, dim),)


def _tiny_chain(device, n, dim):
    return TinyChain(n, dim), (_randn(device, dim, dim),)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "pointwise_chain",
            "sigmoid, tanh, where, exp, relu, mul/add over two inputs",
            _pointwise,
            {"cuda": {"numel": 2**24}, "cpu": {"numel": 2**23}, "quick": {"numel": 2**12}},
            memory_bound=True,
        ),
        Workload(
            "layernorm_gelu",
            "GELU(LayerNorm(x + r))",
            _layernorm_gelu,
            {
                "cuda": {"rows": 8192, "cols": 4096},
                "cpu": {"rows": 2048, "cols": 4096},
                "quick": {"rows": 16, "cols": 64},
            },
            memory_bound=True,
        ),
        Workload(
            "softmax",
            "softmax(x * 0.125, dim=-1)",
            _softmax,
            {
                "cuda": {"rows": 8192, "cols": 4096},
                "cpu": {"rows": 2048, "cols": 4096},
                "quick": {"rows": 16, "cols": 64},
            },
            memory_bound=True,
        ),
        Workload(
            "rmsnorm",
            "x * rsqrt(mean(x^2, -1) + eps) * w",
            _rmsnorm,
            {
                "cuda": {"rows": 8192, "cols": 4096},
                "cpu": {"rows": 2048, "cols": 4096},
                "quick": {"rows": 16, "cols": 64},
            },
            memory_bound=True,
        ),
        Workload(
            "mlp",
            "fc2(GELU(fc1(x))) + x",
            _mlp,
            {
                "cuda": {"rows": 4096, "dim": 1024, "hidden": 4096},
                "cpu": {"rows": 512, "dim": 512, "hidden": 2048},
                "quick": {"rows": 8, "dim": 32, "hidden": 64},
            },
            rtol=1e-3,
            atol=1e-3,
        ),
        Workload(
            "block_b1_t16",
            "pre-norm transformer block, latency bound",
            _block,
            {
                "cuda": {"batch": 1, "tokens": 16, "dim": 256, "heads": 4},
                "cpu": {"batch": 1, "tokens": 16, "dim": 256, "heads": 4},
                "quick": {"batch": 1, "tokens": 4, "dim": 32, "heads": 2},
            },
            rtol=1e-3,
            atol=1e-3,
        ),
        Workload(
            "block_b8_t512",
            "pre-norm transformer block",
            _block,
            {
                "cuda": {"batch": 8, "tokens": 512, "dim": 768, "heads": 12},
                "cpu": {"batch": 2, "tokens": 128, "dim": 384, "heads": 6},
                "quick": {"batch": 2, "tokens": 8, "dim": 32, "heads": 2},
            },
            rtol=1e-3,
            atol=1e-3,
        ),
        Workload(
            "tiny_chain_50",
            "50 x (x = tanh(x @ w_i)) on 8x8: per-launch overhead",
            _tiny_chain,
            {"cuda": {"n": 50, "dim": 8}, "cpu": {"n": 50, "dim": 8}, "quick": {"n": 5, "dim": 8}},
            rtol=1e-3,
            atol=1e-4,
        ),
    )
}


def select(names: str | None) -> list[Workload]:
    """Workloads named in a comma-separated list (all of them for None or "")."""
    if not names:
        return list(WORKLOADS.values())
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; workloads are: {', '.join(WORKLOADS)}")
        chosen.append(WORKLOADS[name])
    return chosen
