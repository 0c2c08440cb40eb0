"""The models of `benchmarks.distributed`: a hand-written tensor-parallel Llama-style block (its
collectives are functional all_reduces in the model's own code), a small Llama-style decoder
that torch.distributed parallelizes (DTensor tensor parallelism, FSDP2), and transformers' GPT-2
(FSDP2).

Weights come from fixed seeds on the CPU, so every rank, and every contender's copy, starts from
the same numbers whatever the device; each rank then keeps its own shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

SEED = 0


@dataclass(frozen=True)
class Size:
    """The shapes of one `--size`: the tensor-parallel block stack and the training decoder."""

    batch: int  # tp-block: sequences per forward (the same on every rank)
    seq: int
    hidden: int
    heads: int  # head dim = hidden // heads
    intermediate: int  # the MLP's width before the split over ranks
    blocks: int  # tp-block: blocks in the stack
    layers: int  # tp-train, fsdp2: decoder layers
    vocab: int
    train_batch: int  # tp-train: the batch of every rank; fsdp2: each rank's own batch
    train_seq: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        return (f"tp-block: {self.blocks} blocks, {self.batch}×{self.seq} tokens, hidden {self.hidden} ({self.heads} "
                f"heads × {self.head_dim}), intermediate {self.intermediate}; decoder (tp-train, fsdp2): "
                f"{self.layers} layers of the same widths, vocab {self.vocab}, {self.train_batch}×{self.train_seq} "
                f"tokens (tp-train: on every rank; fsdp2: per rank)")


SIZES = {
    "full": Size(batch=8, seq=512, hidden=1024, heads=16, intermediate=2816, blocks=4, layers=8, vocab=32000,
                 train_batch=8, train_seq=256),
    "tiny": Size(batch=2, seq=8, hidden=32, heads=4, intermediate=64, blocks=4, layers=2, vocab=64,
                 train_batch=2, train_seq=8),
}


def check_divisible(size: Size, world: int) -> str | None:
    """Why `size` cannot be split over `world` ranks (heads and the MLP's width), or None."""
    for what, count in (("heads", size.heads), ("intermediate", size.intermediate), ("hidden", size.hidden)):
        if count % world:
            return f"{what} ({count}) is not divisible by the {world} ranks"
    return None


class RMSNorm(nn.Module):
    """Llama's RMSNorm, computed in float32 whatever the model's dtype."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(batch, seq, heads * dim) from (batch, heads, seq, dim) q, k, v: rotary-free causal attention."""
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).flatten(2)


# -- tp-block: tensor parallelism written by hand ----------------------------------------------------


class TPBlock(nn.Module):
    """One Llama-style block, this rank's shard: column-parallel qkv and gate/up projections (this
    rank's heads, this rank's slice of the MLP's width), row-parallel o and down projections whose
    partial products are summed over the ranks by a functional all_reduce (Megatron-style)."""

    def __init__(self, size: Size, rank: int, world: int, generator: torch.Generator) -> None:
        super().__init__()
        hidden, inner, heads = size.hidden, size.intermediate, size.heads // world

        def draw(rows: int, cols: int) -> torch.Tensor:  # the full weight, the same on every rank
            return torch.randn(rows, cols, generator=generator) * cols**-0.5

        q, k, v, o = (draw(hidden, hidden) for _ in range(4))
        gate, up, down = draw(inner, hidden), draw(inner, hidden), draw(hidden, inner)
        heads_rows = slice(rank * heads * size.head_dim, (rank + 1) * heads * size.head_dim)
        inner_rows = slice(rank * inner // world, (rank + 1) * inner // world)
        self.heads, self.head_dim = heads, size.head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Parameter(torch.cat([q[heads_rows], k[heads_rows], v[heads_rows]]))
        self.o = nn.Parameter(o[:, heads_rows].contiguous())
        self.gate_up = nn.Parameter(torch.cat([gate[inner_rows], up[inner_rows]]))
        self.down = nn.Parameter(down[:, inner_rows].contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = F.linear(self.attn_norm(x), self.qkv).view(b, s, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        x = x + funcol.all_reduce(F.linear(causal_attention(q, k, v), self.o), "sum", dist.group.WORLD)
        gate, up = F.linear(self.mlp_norm(x), self.gate_up).chunk(2, dim=-1)
        return x + funcol.all_reduce(F.linear(F.silu(gate) * up, self.down), "sum", dist.group.WORLD)


class TPStack(nn.Module):
    """`size.blocks` tensor-parallel blocks, forward only."""

    def __init__(self, size: Size, rank: int, world: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(SEED)
        self.blocks = nn.ModuleList(TPBlock(size, rank, world, generator) for _ in range(size.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def tp_stack(size: Size, rank: int, world: int, device: str, dtype: torch.dtype) -> TPStack:
    return TPStack(size, rank, world).to(device=device, dtype=dtype)


def tp_block_input(size: Size, device: str, dtype: torch.dtype) -> torch.Tensor:
    """The activations every rank feeds the stack (tensor parallelism: the same on every rank)."""
    generator = torch.Generator().manual_seed(SEED + 1)
    return torch.randn(size.batch, size.seq, size.hidden, generator=generator).to(device=device, dtype=dtype)


# -- tp-train and fsdp2: a decoder that torch.distributed parallelizes --------------------------------


class Attention(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.head_dim = size.head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(size.hidden, size.hidden, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism the projections hold this rank's heads only
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        return self.o(causal_attention(q, k, v))


class MLP(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.gate = nn.Linear(size.hidden, size.intermediate, bias=False)
        self.up = nn.Linear(size.hidden, size.intermediate, bias=False)
        self.down = nn.Linear(size.intermediate, size.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(size.hidden), Attention(size)
        self.mlp_norm, self.mlp = RMSNorm(size.hidden), MLP(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """A Llama-style causal LM whose forward returns the next-token loss (float32)."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.embed = nn.Embedding(size.vocab, size.hidden)
        self.layers = nn.ModuleList(Layer(size) for _ in range(size.layers))
        self.norm = RMSNorm(size.hidden)
        self.head = nn.Linear(size.hidden, size.vocab, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def decoder(size: Size, device: str, dtype: torch.dtype) -> Decoder:
    """The decoder from SEED (made on the CPU: the same on every rank and device)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Decoder(size)
    return model.to(device=device, dtype=dtype)


def tensor_parallel(model: Decoder, mesh: object) -> Decoder:
    """DTensor tensor parallelism as a user writes it: column-parallel q, k, v, gate and up,
    row-parallel o and down; embedding, norms and head replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {}
    for i in range(len(model.layers)):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.down"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def fully_sharded(model: Decoder, mesh: object) -> Decoder:
    """FSDP2 as a user writes it: `fully_shard` on each decoder layer, then on the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def token_batch(size: Size, seed: int, device: str, vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (below `vocab`, by default the size's) and next-token targets, from `seed` (made on
    the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab or size.vocab, (size.train_batch, size.train_seq + 1), generator=generator)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


# -- fsdp2-gpt2: transformers' GPT-2 under FSDP2 ----------------------------------------------------


@dataclass(frozen=True)
class GPT2Shape:
    layers: int
    hidden: int
    heads: int
    vocab: int


GPT2_SHAPES = {"full": GPT2Shape(layers=12, hidden=768, heads=12, vocab=50257),  # GPT-2 small
               "tiny": GPT2Shape(layers=2, hidden=32, heads=4, vocab=64)}


class GPT2Loss(nn.Module):
    """transformers' GPT-2 language model whose forward returns the next-token loss (float32), as
    the decoder's does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def gpt2(size_name: str, size: Size, device: str, dtype: torch.dtype) -> GPT2Loss:
    """GPT-2 of `GPT2_SHAPES[size_name]` from SEED (made on the CPU), without dropout, so every
    contender's step computes the same function; positions up to the size's sequence length."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as error:  # an optional extra, like the model suite's
        raise RuntimeError(f"fsdp2-gpt2 needs transformers ({error})") from error
    shape = GPT2_SHAPES[size_name]
    last = shape.vocab - 1  # GPT-2's end-of-text token is its vocabulary's last
    config = GPT2Config(n_layer=shape.layers, n_embd=shape.hidden, n_head=shape.heads, vocab_size=shape.vocab,
                        n_positions=max(size.train_seq, 8), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        use_cache=False, bos_token_id=last, eos_token_id=last, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = GPT2LMHeadModel(config)
    return GPT2Loss(model).to(device=device, dtype=dtype)


def fully_sharded_gpt2(model: GPT2Loss, mesh: object) -> GPT2Loss:
    """FSDP2 as a user writes it for GPT-2: `fully_shard` on each transformer block, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.model.transformer.h:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)
