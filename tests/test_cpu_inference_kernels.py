"""C++ kernels of the transformer ops that ran slower than Inductor on CPU (issue 18): pow by a
small constant, reshapes that split the last dimension (attention heads), transcendentals
broadcast from a small tensor (rotary embeddings), gathers inside LayerNorm (embeddings) and
clamped indices (rotate_half's cat). Each is checked for its generated code and against eager
on every target, in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir.lines import KernelCall, KernelDefinition

TARGETS = ["python", "cpp", "fx", "interpret"]


def cpp_sources(compiled) -> list[str]:
    return [line.source for line in compiled.program.lines if isinstance(line, KernelDefinition) and line.language == "cpp"]


def check(fn, inputs: tuple, target: str, **tolerances) -> wrapgen.compiled.CompiledFunction:
    with torch.no_grad():
        compiled = wrapgen.compile(fn, inputs, target=target)
        fresh = tuple(torch.randn_like(t) if t.is_floating_point() else t.clone() for t in inputs)
        torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tolerances)
    return compiled


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("exponent", [2, 3, 3.0, -1, -2.0, -0.5, 0.5, 4.0])
def test_pow_by_small_constants(target: str, exponent: float) -> None:
    x = torch.randn(16, 33)
    compiled = check(lambda t: torch.pow(t, exponent) * 2, (x,), target, equal_nan=True)
    if target == "cpp" and exponent in (2, 3, -1, -2.0, -0.5):
        # the forms eager's CPU kernel uses too (bit for bit), and no vector powf, which takes
        # a scalar fallback per lane for a negative base
        assert not any("powf(" in s for s in cpp_sources(compiled))
        y = x.abs() + 0.5 if exponent == -0.5 else x
        with torch.no_grad():
            plain = wrapgen.compile(lambda t: torch.pow(t, exponent), (y,), target="cpp")
            assert torch.equal(plain(y), torch.pow(y, exponent))


def test_gelu_tanh_cube_in_bfloat16() -> None:
    def gelu(t: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation
        return 0.5 * t * (1.0 + torch.tanh(0.7978845608028654 * (t + 0.044715 * torch.pow(t, 3.0))))

    x = torch.randn(64, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = wrapgen.compile(gelu, (x,), target="cpp")
        reference = gelu(x.float())
        torch.testing.assert_close(compiled(x).float(), reference, atol=2e-2, rtol=2e-2)
    assert not any("powf(" in s for s in cpp_sources(compiled))


def _split_heads(t: torch.Tensor) -> torch.Tensor:
    b, s, _ = t.shape
    return (t.view(b, s, 4, 16).permute(0, 2, 1, 3) * 3).contiguous()


@pytest.mark.parametrize("target", TARGETS)
def test_reshape_splitting_last_dim_needs_no_division(target: str) -> None:
    x = torch.randn(2, 24, 64)
    compiled = check(_split_heads, (x,), target)
    for source in cpp_sources(compiled):
        assert "wg_floordiv" not in source and "wg_mod" not in source


@pytest.mark.parametrize("shapes", [((6, 4, 10), (3, 2, 40)), ((12, 10), (2, 6, 5, 2)), ((2, 1, 15, 4), (6, 20, 1))])
def test_reshapes_regroup_dims(shapes: tuple) -> None:
    src, dst = shapes
    x = torch.randn(*src)
    check(lambda t: (t * 2).reshape(dst) + 1, (x,), "cpp")


def test_reshape_with_dynamic_sizes() -> None:
    x = torch.randn(3, 24, 64)
    with torch.no_grad():
        compiled = wrapgen.compile(_split_heads, (x,), dynamic=True, target="cpp")
        for batch, seq in ((2, 10), (5, 24)):
            y = torch.randn(batch, seq, 64)
            torch.testing.assert_close(compiled(y), _split_heads(y))


def _rotary(q: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding: cos/sin of [1, seq, dim] broadcast over batch and heads."""
    positions = torch.arange(q.shape[2], dtype=torch.float32)[None, :, None]
    freqs = positions * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    half = q.shape[-1] // 2
    rotated = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
    return q * cos + rotated * sin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_computes_cos_sin_once(target: str, dtype: torch.dtype) -> None:
    q = torch.randn(4, 3, 16, 8, dtype=dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    tolerances = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {}
    with torch.no_grad():
        compiled = wrapgen.compile(_rotary, (q, inv_freq), target=target)
        fresh = torch.randn_like(q)
        torch.testing.assert_close(compiled(fresh, inv_freq).float(), _rotary(fresh.float(), inv_freq), **tolerances)
    if target == "cpp":
        sources = cpp_sources(compiled)
        trig = [s for s in sources if "cosf(" in s or "sinf(" in s]
        # the kernel over the [batch, heads, seq, dim] result loads cos/sin; only the small
        # [1, seq, dim] kernel (the tables the [:, None] views read) calls them
        assert len(trig) == 1 and "x0 < 1;" in trig[0] and "x1 < 16;" in trig[0] and "x2 < 8;" in trig[0]
        # the rotated loads index through clamps the vectorizer can gather with
        assert not any("std::min<int64_t>" in s or "std::max<int64_t>" in s for s in sources)


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_layer_norm_gathers_once_per_row(target: str) -> None:
    emb, pos = torch.nn.Embedding(50, 64), torch.nn.Embedding(40, 64)
    norm = torch.nn.LayerNorm(64)

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return norm(emb(ids) + pos(torch.arange(ids.shape[1]))) * 2

    ids = torch.randint(0, 50, (3, 40))
    with torch.no_grad():
        compiled = wrapgen.compile(embed, (ids,), target=target)
        torch.testing.assert_close(compiled(ids), embed(ids))
        if target != "fx":
            bad = ids.clone()
            bad[2, 39] = 50
            with pytest.raises(IndexError):
                compiled(bad)
            bad[2, 39] = -1
            with pytest.raises(IndexError):
                compiled(bad)
    if target == "cpp":
        (source,) = [s for s in cpp_sources(compiled) if "wg_bad_index" in s]
        assert "__atomic" not in source and "reduction(|:wg_bad_index)" in source
        # the token id's range check sits at row level, before the first reduction loop
        assert source.index("wg_bad_index |=") < source.index("#pragma omp simd")


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_pointwise_gather_out_of_range_still_raises(target: str) -> None:
    weight = torch.randn(30, 48)
    fn = lambda ids: torch.nn.functional.embedding(ids, weight) * 2  # noqa: E731
    ids = torch.randint(0, 30, (8, 100))
    with torch.no_grad():
        compiled = wrapgen.compile(fn, (ids,), target=target)
        torch.testing.assert_close(compiled(ids), fn(ids))
        bad = ids.clone()
        bad[7, 99] = 30
        with pytest.raises(IndexError):
            compiled(bad)


@pytest.mark.skipif(not (compat.available() and compat.interpreting()), reason="needs triton in interpreter mode")
@pytest.mark.parametrize("case", ["pow", "heads", "rotary"])
def test_same_lowerings_in_triton_kernels(case: str) -> None:
    """The lowering changes (pow forms, grouped reshapes, cos/sin computed once) in Triton code."""
    q = torch.randn(2, 3, 8, 8)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    fn, inputs = {
        "pow": (lambda t: torch.pow(t, 3.0) - torch.pow(t.abs() + 1, -0.5), (q,)),
        "heads": (_split_heads, (torch.randn(2, 6, 64),)),
        "rotary": (_rotary, (q, inv_freq)),
    }[case]
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True), torch.no_grad():
        compiled = wrapgen.compile(fn, inputs, target="python")
        assert any(isinstance(line, KernelDefinition) and line.language == "triton" for line in compiled.program.lines)
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' repeat_kv: [b, kv, s, d] -> [b, kv * groups, s, d] for grouped-query attention."""
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)


def _two_gqa_layers(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Two attention layers as a Llama-style model writes them: the rotary tables made once,
    unsqueezed by each layer; keys and values of 2 heads repeated for 4 query heads."""
    b, s = x.shape[0], x.shape[1]
    angles = torch.arange(s, dtype=torch.float32)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    for layer in range(2):
        q = (x * (layer + 1)).view(b, s, 4, 8).transpose(1, 2)
        k = (x[..., :16] - layer).reshape(b, s, 2, 8).transpose(1, 2)
        v = (x[..., 16:] + layer).reshape(b, s, 2, 8).transpose(1, 2)
        c, n = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + torch.cat([-q[..., 4:], q[..., :4]], dim=-1) * n
        k = k * c + torch.cat([-k[..., 4:], k[..., :4]], dim=-1) * n
        attended = torch.nn.functional.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), is_causal=True)
        x = attended.transpose(1, 2).reshape(b, s, 32)
    return x


@pytest.mark.parametrize("target", TARGETS)
def test_layers_share_rotary_tables_and_repeat_keys_and_values_in_one_kernel(target: str) -> None:
    """Every layer's view of the rotary tables reads one buffer computed once (realizing each
    layer's view computed them once per layer), and a layer's key and value repeats are one
    kernel: the key's view for attention, placed between them, no longer keeps them apart."""
    x = torch.randn(2, 12, 32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    compiled = check(_two_gqa_layers, (x, inv_freq), target, atol=1e-5, rtol=1e-5)
    if target != "cpp":
        return
    calls = [line for line in compiled.program.lines if isinstance(line, KernelCall)]
    sources = {line.name: line.source for line in compiled.program.lines if isinstance(line, KernelDefinition)}
    trig = [c for c in calls if "cosf(" in sources[c.kernel] or "sinf(" in sources[c.kernel]]
    assert len(trig) == 1, [c.kernel for c in trig]
    types = compiled.program.value_types()
    repeats = [c for c in calls if len(c.writes) == 2 and all(
        tuple(int(n) for n in types[w].sizes[1:3]) == (2, 2) for w in c.writes)]
    assert len(repeats) == 2, [(c.kernel, c.writes) for c in calls]
