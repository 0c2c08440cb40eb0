"""The suite's transformers models: about thirty architectures, random weights from configs.

Each entry names a transformers model type, the head it is benchmarked with and how its config
is shaped. Two sizes: `full` (base-sized configs at the batch and sequence lengths of PyTorch's
HuggingFace dashboard, scaled to one GPU) and `small` (the same architecture two layers deep
and 64 wide, for a CPU run). Decoders cover learned, rotary and ALiBi positions and sliding
windows; encoders absolute and relative (disentangled) attention; encoder-decoders T5's
relative bias, BART and Whisper; speech and vision transformers, including shifted windows
(Swin) and relative position bias (BEiT).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.models import MissingDependency


@dataclass(frozen=True)
class Shape:
    """The widths one size gives every architecture (each maps them onto its config's names)."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    batch: int
    tokens: int  # text: tokens per sequence; vision: image side; speech: feature frames / samples scale


SHAPES = {
    "small": Shape(layers=2, hidden=64, heads=4, intermediate=128, vocab=1024, batch=2, tokens=32),
    "full": Shape(layers=12, hidden=768, heads=12, intermediate=3072, vocab=32000, batch=8, tokens=512),
}
VISION = {"small": (2, 64), "full": (32, 224)}  # (batch, image side)


class OutputOf(nn.Module):
    """A transformers model called with named tensors, returning one tensor of its output, so that
    every contender returns the same thing (no ModelOutput, no cache)."""

    def __init__(self, model: nn.Module, attr: str, names: tuple[str, ...], **call_kwargs: Any) -> None:
        super().__init__()
        self.model, self.attr, self.names, self.call_kwargs = model, attr, names, call_kwargs

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**dict(zip(self.names, tensors)), **self.call_kwargs), self.attr)


@dataclass(frozen=True)
class HFModel:
    """One architecture: `config(shape)` gives its config's keyword arguments; `head` the class
    family it is built with; `inputs` what it is called with."""

    name: str
    model_type: str
    head: str  # causal-lm | encoder | seq2seq | speech-seq2seq | audio | image-classification | vision-encoder
    config: Callable[[Shape], dict[str, Any]]
    note: str = ""

    @property
    def trainable(self) -> bool:
        return self.head == "causal-lm"  # a next-token loss from the ids alone


def _standard(s: Shape, **extra: Any) -> dict[str, Any]:
    return dict(num_hidden_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
                intermediate_size=s.intermediate, vocab_size=s.vocab, **extra)


def _gqa(s: Shape, **extra: Any) -> dict[str, Any]:
    """Llama-family decoders: grouped-query attention, a quarter of the heads as key/value heads."""
    return _standard(s, num_key_value_heads=max(1, s.heads // 4), max_position_embeddings=2048,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0, **extra)


def _seq2seq(s: Shape, **extra: Any) -> dict[str, Any]:
    return dict(encoder_layers=s.layers, decoder_layers=s.layers, d_model=s.hidden, encoder_attention_heads=s.heads,
                decoder_attention_heads=s.heads, encoder_ffn_dim=s.intermediate, decoder_ffn_dim=s.intermediate,
                vocab_size=s.vocab, decoder_start_token_id=0, pad_token_id=0, bos_token_id=0, eos_token_id=0, **extra)


def _vision(s: Shape, patch: int = 16, **extra: Any) -> dict[str, Any]:
    side = VISION["small" if s.hidden < 256 else "full"][1]
    return dict(num_hidden_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
                intermediate_size=s.intermediate, image_size=side, patch_size=patch, num_labels=1000, **extra)


def _small(s: Shape) -> bool:
    return s.hidden < 256


MODELS: tuple[HFModel, ...] = (
    # decoders
    HFModel("gpt2", "gpt2", "causal-lm",
            lambda s: dict(n_layer=s.layers, n_embd=s.hidden, n_head=s.heads, vocab_size=s.vocab, n_positions=1024,
                           bos_token_id=0, eos_token_id=0), "learned positions"),
    HFModel("gptj", "gptj", "causal-lm",
            lambda s: dict(n_layer=s.layers, n_embd=s.hidden, n_head=s.heads, vocab_size=s.vocab, n_positions=1024,
                           rotary_dim=s.hidden // s.heads // 2, bos_token_id=0, eos_token_id=0),
            "partial rotary, parallel attention and MLP"),
    HFModel("gpt_neox", "gpt_neox", "causal-lm",
            lambda s: _standard(s, max_position_embeddings=2048, bos_token_id=0, eos_token_id=0), "rotary"),
    HFModel("opt", "opt", "causal-lm",
            lambda s: dict(num_hidden_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
                           ffn_dim=s.intermediate, vocab_size=s.vocab, word_embed_proj_dim=s.hidden,
                           max_position_embeddings=2048, pad_token_id=0, bos_token_id=0, eos_token_id=0),
            "learned positions, ReLU"),
    HFModel("bloom", "bloom", "causal-lm",
            lambda s: dict(n_layer=s.layers, hidden_size=s.hidden, n_head=s.heads, vocab_size=s.vocab,
                           bos_token_id=0, eos_token_id=0), "ALiBi"),
    HFModel("mpt", "mpt", "causal-lm",
            lambda s: dict(n_layers=s.layers, d_model=s.hidden, n_heads=s.heads, vocab_size=s.vocab,
                           expansion_ratio=s.intermediate // s.hidden, max_seq_len=2048), "ALiBi"),
    HFModel("falcon", "falcon", "causal-lm",
            lambda s: dict(num_hidden_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads,
                           vocab_size=s.vocab, new_decoder_architecture=False, multi_query=True, alibi=False,
                           bos_token_id=0, eos_token_id=0), "multi-query attention, parallel blocks"),
    HFModel("llama", "llama", "causal-lm", lambda s: _gqa(s), "RMSNorm, rotary, GQA, SwiGLU"),
    HFModel("mistral", "mistral", "causal-lm",
            lambda s: _gqa(s, sliding_window=s.tokens // 2), "sliding-window attention"),
    HFModel("qwen2", "qwen2", "causal-lm", lambda s: _gqa(s), "biased q/k/v projections"),
    HFModel("gemma", "gemma", "causal-lm", lambda s: _gqa(s, head_dim=s.hidden // s.heads), "GeGLU, scaled embeddings"),
    HFModel("phi", "phi", "causal-lm",
            lambda s: _standard(s, max_position_embeddings=2048, bos_token_id=0, eos_token_id=0),
            "partial rotary, parallel blocks"),
    # encoders
    HFModel("bert", "bert", "encoder", lambda s: _standard(s), "absolute positions"),
    # positions start after the padding index: max_position_embeddings is tokens + 2 (514 in RoBERTa-base)
    HFModel("roberta", "roberta", "encoder", lambda s: _standard(s, pad_token_id=1, max_position_embeddings=s.tokens + 2), ""),
    HFModel("distilbert", "distilbert", "encoder",
            lambda s: dict(n_layers=s.layers, dim=s.hidden, n_heads=s.heads, hidden_dim=s.intermediate,
                           vocab_size=s.vocab), ""),
    HFModel("albert", "albert", "encoder", lambda s: _standard(s, embedding_size=s.hidden // 2),
            "shared layers, factorized embeddings"),
    HFModel("electra", "electra", "encoder", lambda s: _standard(s, embedding_size=s.hidden), ""),
    HFModel("deberta_v2", "deberta-v2", "encoder",
            lambda s: _standard(s, relative_attention=True, position_buckets=64 if _small(s) else 256,
                                pos_att_type=["p2c", "c2p"], max_position_embeddings=512),
            "disentangled relative-position attention"),
    # encoder-decoders
    HFModel("t5", "t5", "seq2seq",
            lambda s: dict(num_layers=s.layers, num_decoder_layers=s.layers, d_model=s.hidden, d_kv=s.hidden // s.heads,
                           d_ff=s.intermediate, num_heads=s.heads, vocab_size=s.vocab, decoder_start_token_id=0,
                           pad_token_id=0), "relative position bias"),
    HFModel("bart", "bart", "seq2seq", lambda s: _seq2seq(s, max_position_embeddings=1024), ""),
    HFModel("whisper", "whisper", "speech-seq2seq",
            lambda s: _seq2seq(s, num_mel_bins=80, max_source_positions=64 if _small(s) else 1500,
                               max_target_positions=448), "speech encoder-decoder, convolutional stem"),
    # speech
    HFModel("wav2vec2", "wav2vec2", "audio",
            lambda s: _standard(s, conv_dim=(32, 32, 32) if _small(s) else (512,) * 7,
                                conv_stride=(5, 2, 2) if _small(s) else (5, 2, 2, 2, 2, 2, 2),
                                conv_kernel=(10, 3, 3) if _small(s) else (10, 3, 3, 3, 3, 2, 2),
                                num_conv_pos_embeddings=16 if _small(s) else 128, do_stable_layer_norm=True),
            "convolutional feature encoder, grouped positional convolution"),
    # vision
    HFModel("vit", "vit", "image-classification", lambda s: _vision(s), ""),
    HFModel("deit", "deit", "image-classification",
            lambda s: _vision(s, architectures=["DeiTForImageClassification"]), "distillation token"),
    HFModel("beit", "beit", "image-classification",
            lambda s: _vision(s, use_relative_position_bias=True, use_mean_pooling=True), "relative position bias"),
    HFModel("dinov2", "dinov2", "image-classification", lambda s: _vision(s, patch=8 if _small(s) else 14), "layer scale"),
    HFModel("swin", "swin", "image-classification",
            lambda s: dict(embed_dim=32 if _small(s) else 96, depths=[1, 1] if _small(s) else [2, 2, 6, 2],
                           num_heads=[2, 4] if _small(s) else [3, 6, 12, 24], window_size=4 if _small(s) else 7,
                           image_size=VISION["small" if _small(s) else "full"][1], patch_size=4, num_labels=1000),
            "shifted-window attention (roll, pad, window partition)"),
    HFModel("convnext", "convnext", "image-classification",
            lambda s: dict(hidden_sizes=[32, 64] if _small(s) else [96, 192, 384, 768],
                           depths=[1, 1] if _small(s) else [3, 3, 9, 3], num_stages=2 if _small(s) else 4,
                           num_labels=1000), "depthwise 7x7 convolutions, layer norm"),
    HFModel("resnet", "resnet", "image-classification",
            lambda s: dict(hidden_sizes=[64, 128] if _small(s) else [256, 512, 1024, 2048],
                           depths=[1, 1] if _small(s) else [3, 4, 6, 3], embedding_size=32 if _small(s) else 64,
                           layer_type="bottleneck", num_labels=1000), "bottleneck ResNet"),
    HFModel("clip_vision", "clip_vision_model", "vision-encoder",
            lambda s: {k: v for k, v in _vision(s, patch=16 if _small(s) else 32).items() if k != "num_labels"},
            "quick-GELU"),
)

HEADS = {
    "causal-lm": ("AutoModelForCausalLM", "logits", ("input_ids",), {"use_cache": False}),
    "encoder": ("AutoModel", "last_hidden_state", ("input_ids",), {}),
    "seq2seq": ("AutoModelForSeq2SeqLM", "logits", ("input_ids", "decoder_input_ids"), {"use_cache": False}),
    "speech-seq2seq": ("AutoModelForSpeechSeq2Seq", "logits", ("input_features", "decoder_input_ids"), {"use_cache": False}),
    "audio": ("AutoModel", "last_hidden_state", ("input_values",), {}),
    "image-classification": ("AutoModelForImageClassification", "logits", ("pixel_values",), {}),
    "vision-encoder": ("AutoModel", "last_hidden_state", ("pixel_values",), {}),
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise MissingDependency("the huggingface suite needs transformers: pip install 'wrapgen[models]'") from error
    return transformers


def _inputs(entry: HFModel, config: Any, s: Shape, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    vocab = getattr(config, "vocab_size", s.vocab)
    ids = torch.randint(1, vocab, (s.batch, s.tokens), device=device)
    if entry.head in ("causal-lm", "encoder"):
        return (ids,)
    if entry.head == "seq2seq":
        return ids, torch.randint(1, vocab, (s.batch, s.tokens // 2), device=device)
    if entry.head == "speech-seq2seq":
        frames = 2 * config.max_source_positions
        features = torch.randn(s.batch, config.num_mel_bins, frames, device=device, dtype=dtype)
        return features, torch.randint(1, vocab, (s.batch, 16 if s.hidden < 256 else 64), device=device)
    if entry.head == "audio":
        return (torch.randn(s.batch, 1600 if s.hidden < 256 else 16000, device=device, dtype=dtype),)
    batch, side = VISION["small" if s.hidden < 256 else "full"]
    return (torch.randn(batch, 3, side, side, device=device, dtype=dtype),)


def build(entry: HFModel, device: torch.device, dtype: torch.dtype, size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode, `dtype`, on `device`) and its inputs at `size`."""
    tf = _transformers()
    shape = SHAPES[size]
    auto_name, attr, names, call_kwargs = HEADS[entry.head]
    auto = getattr(tf, auto_name)

    def make(attention: str) -> nn.Module:
        config = tf.AutoConfig.for_model(entry.model_type, **entry.config(shape), attn_implementation=attention)
        return auto.from_config(config)

    try:
        model = make("sdpa")
    except ValueError:  # no SDPA path for this architecture in the installed transformers
        model = make("eager")
    inputs = _inputs(entry, model.config, shape, device, dtype)
    return OutputOf(model, attr, names, **call_kwargs).to(device=device, dtype=dtype).eval(), inputs
