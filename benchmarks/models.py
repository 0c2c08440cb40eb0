"""Real models for the benchmark suite: GPT-2, a Llama-style decoder with grouped-query attention,
BERT-base, ResNet-50 and ViT-B/16, with random weights built from configs (the GPU host has no
network, so nothing is downloaded), in eval mode.

Each family has two sizes: `full` (the sizes the issue names, for CUDA) and `small` (the same
architecture, a few layers and narrow widths, so that a CPU run with torch.compile's cold
compiles takes minutes). The vision models come from torchvision where it imports (its PyPI
wheels need a matching torch build) and from transformers otherwise; the implementation used
is part of the workload's description.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SIZES = ("full", "small", "b1x32")  # b1x32: full-size decoders at batch 1 x 32 tokens (launch bound)
VISION_IMPLS = ("auto", "torchvision", "transformers")
Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class MissingDependency(RuntimeError):
    """A model family needs a package that is not installed."""


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise MissingDependency(
            "the model benchmarks need transformers: pip install 'wrapgen[models]' (or transformers>=4.40)"
        ) from error
    return transformers


@functools.cache
def torchvision_available() -> bool:
    """True when torchvision imports and its models build (a wheel for another torch fails here)."""
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # ImportError, or RuntimeError from a torchvision built against another torch
        return False
    return True


def resolve_vision(impl: str) -> str:
    """The vision implementation to use: `auto` is torchvision where it imports, else transformers."""
    if impl not in VISION_IMPLS:
        raise ValueError(f"unknown vision implementation {impl!r}; choose one of {', '.join(VISION_IMPLS)}")
    if impl == "auto":
        return "torchvision" if torchvision_available() else "transformers"
    if impl == "torchvision" and not torchvision_available():
        raise MissingDependency("torchvision does not import here (not installed, or built for another torch)")
    return impl


# -- wrappers: one tensor in, one tensor out -------------------------------------------------------


class LogitsOf(nn.Module):
    """A transformers model called the way a benchmark calls it: no KV cache, returning one tensor
    (`attr` of its output) rather than a ModelOutput, so every contender returns the same thing."""

    def __init__(self, model: nn.Module, attr: str, **call_kwargs: Any) -> None:
        super().__init__()
        self.model = model
        self.attr = attr
        self.call_kwargs = call_kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x, **self.call_kwargs), self.attr)


class LanguageModelLoss(nn.Module):
    """Next-token cross entropy of a causal LM (logits in float32): what a training step differentiates."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(ids)
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _with_sdpa(make: Callable[[str], nn.Module]) -> nn.Module:
    """Build with PyTorch's scaled_dot_product_attention; transformers versions that lack it for
    a model refuse with ValueError, and then the model's own (eager) attention is used."""
    try:
        return make("sdpa")
    except ValueError:
        return make("eager")


# -- the families ------------------------------------------------------------------------------------


def _tokens(device: torch.device, vocab: int, batch: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, tokens), device=device)


def _images(device: torch.device, dtype: torch.dtype, batch: int, image: int) -> torch.Tensor:
    return torch.randn(batch, 3, image, image, device=device, dtype=dtype)


def _gpt2(device: torch.device, dtype: torch.dtype, layers: int, hidden: int, heads: int, vocab: int,
          batch: int, tokens: int) -> Built:
    tf = _transformers()

    def make(attention: str) -> nn.Module:
        config = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=1024,
                               bos_token_id=0, eos_token_id=0, attn_implementation=attention)
        return tf.GPT2LMHeadModel(config)

    return LogitsOf(_with_sdpa(make), "logits", use_cache=False).to(dtype), (_tokens(device, vocab, batch, tokens),)


def _llama(device: torch.device, dtype: torch.dtype, layers: int, hidden: int, heads: int, kv_heads: int,
           intermediate: int, vocab: int, batch: int, tokens: int) -> Built:
    tf = _transformers()

    def make(attention: str) -> nn.Module:
        config = tf.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                                max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                attn_implementation=attention)
        return tf.LlamaForCausalLM(config)

    return LogitsOf(_with_sdpa(make), "logits", use_cache=False).to(dtype), (_tokens(device, vocab, batch, tokens),)


def _bert(device: torch.device, dtype: torch.dtype, layers: int, hidden: int, heads: int, intermediate: int,
          vocab: int, batch: int, tokens: int) -> Built:
    tf = _transformers()

    def make(attention: str) -> nn.Module:
        config = tf.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=intermediate, vocab_size=vocab, attn_implementation=attention)
        return tf.BertModel(config, add_pooling_layer=False)

    return LogitsOf(_with_sdpa(make), "last_hidden_state").to(dtype), (_tokens(device, vocab, batch, tokens),)


def _resnet(device: torch.device, dtype: torch.dtype, impl: str, depths: list[int], batch: int,
            image: int) -> Built:
    if impl == "torchvision":
        from torchvision.models.resnet import Bottleneck, ResNet

        model: nn.Module = ResNet(Bottleneck, depths, num_classes=1000)
    else:
        tf = _transformers()
        config = tf.ResNetConfig(depths=depths, layer_type="bottleneck", num_labels=1000)
        model = LogitsOf(tf.ResNetForImageClassification(config), "logits")
    return model.to(dtype), (_images(device, dtype, batch, image),)


def _vit(device: torch.device, dtype: torch.dtype, impl: str, layers: int, hidden: int, heads: int, mlp: int,
         patch: int, batch: int, image: int) -> Built:
    if impl == "torchvision":
        from torchvision.models.vision_transformer import VisionTransformer

        model: nn.Module = VisionTransformer(image_size=image, patch_size=patch, num_layers=layers, num_heads=heads,
                                             hidden_dim=hidden, mlp_dim=mlp, num_classes=1000)
    else:
        tf = _transformers()

        def make(attention: str) -> nn.Module:
            config = tf.ViTConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                  intermediate_size=mlp, image_size=image, patch_size=patch, num_labels=1000,
                                  attn_implementation=attention)
            return tf.ViTForImageClassification(config)

        model = LogitsOf(_with_sdpa(make), "logits")
    return model.to(dtype), (_images(device, dtype, batch, image),)


@dataclass(frozen=True)
class ModelFamily:
    """A model family: `make(device, dtype, [impl,] **sizes[size])` returns (model, inputs);
    `trainable`: it has a language-model loss, so a training step is benchmarked too."""

    name: str
    description: str
    make: Callable[..., Built]
    sizes: dict[str, dict[str, Any]]
    vision: bool = False
    trainable: bool = False

    def build(self, device: str | torch.device, size: str, dtype: torch.dtype = torch.float32,
              vision_impl: str = "auto", seed: int = 0) -> Built:
        """The model (eval mode, on `device`, in `dtype`) and its example inputs at `size`, reproducibly."""
        torch.manual_seed(seed)
        return self.instantiate(device, dtype, vision_impl, **self.sizes[size])

    def instantiate(self, device: str | torch.device, dtype: torch.dtype, vision_impl: str = "auto",
                    **size: Any) -> Built:
        """The model at the given sizes (keyword arguments of `make`), in eval mode on `device`."""
        device = torch.device(device)
        args: tuple = (resolve_vision(vision_impl),) if self.vision else ()
        with device:  # weights are initialized where they live: no multi-GB host copy on CUDA
            model, inputs = self.make(device, dtype, *args, **size)
        return model.to(device).eval(), inputs

    def size_text(self, size: str) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes[size].items())


FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily(
            "gpt2", "GPT2LMHeadModel (transformers), logits", _gpt2,
            {"full": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "batch": 8, "tokens": 256},
             "small": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 4096, "batch": 8, "tokens": 128},
             "b1x32": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "batch": 1, "tokens": 32}},
            trainable=True,
        ),
        ModelFamily(
            "llama", "LlamaForCausalLM (transformers), grouped-query attention, logits", _llama,
            {"full": {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "intermediate": 2816,
                      "vocab": 32000, "batch": 8, "tokens": 256},
             "small": {"layers": 2, "hidden": 256, "heads": 8, "kv_heads": 2, "intermediate": 688,
                       "vocab": 4096, "batch": 8, "tokens": 128},
             "b1x32": {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "intermediate": 2816,
                       "vocab": 32000, "batch": 1, "tokens": 32}},
            trainable=True,
        ),
        ModelFamily(
            "bert", "BertModel (transformers), last hidden state", _bert,
            {"full": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 30522,
                      "batch": 16, "tokens": 128},
             "small": {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 512, "vocab": 4096,
                       "batch": 8, "tokens": 128}},
        ),
        ModelFamily(
            "resnet50", "ResNet-50 (bottleneck blocks), logits", _resnet,
            {"full": {"depths": [3, 4, 6, 3], "batch": 32, "image": 224},
             "small": {"depths": [1, 1, 1, 1], "batch": 8, "image": 64}},
            vision=True,
        ),
        ModelFamily(
            "vit_b16", "ViT-B/16, logits", _vit,
            {"full": {"layers": 12, "hidden": 768, "heads": 12, "mlp": 3072, "patch": 16, "batch": 16, "image": 224},
             "small": {"layers": 2, "hidden": 128, "heads": 4, "mlp": 512, "patch": 16, "batch": 8, "image": 64}},
            vision=True,
        ),
    )
}


def select(names: str | None) -> list[ModelFamily]:
    """Families named in a comma-separated list (all of them for None, "" or "all")."""
    if not names or names.strip() == "all":
        return list(FAMILIES.values())
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in FAMILIES:
            raise ValueError(f"unknown model {name!r}; models are: {', '.join(FAMILIES)} (or all)")
        chosen.append(FAMILIES[name])
    return chosen


def default_size(device: str) -> str:
    """Full sizes on CUDA, small ones on CPU."""
    return "full" if device == "cuda" else "small"


def check_available(families: list[ModelFamily], vision_impl: str = "auto") -> None:
    """Raise MissingDependency, saying what to install, when a chosen family cannot be built here."""
    if any(not f.vision or resolve_vision(vision_impl) == "transformers" for f in families):
        _transformers()


def library_versions() -> dict[str, str | None]:
    """Versions of the model libraries (None: not importable), for the result files."""
    versions: dict[str, str | None] = {"transformers": None, "torchvision": None}
    try:
        versions["transformers"] = _transformers().__version__
    except MissingDependency:
        pass
    if torchvision_available():
        import torchvision

        versions["torchvision"] = torchvision.__version__
    return versions
