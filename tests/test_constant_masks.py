"""Attention masks that are compile-time constants: dropped (all True) or `is_causal` (causal)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import wrapgen
from wrapgen.lowering.capture import capture
from wrapgen.lowering.graph_passes.constant_masks import drop_constant_masks, mask_kind
from wrapgen.wrapper_ir import ExternKernel

TARGETS = ("python", "cpp", "fx")


def _positions(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions as a column, key positions as a row."""
    return torch.arange(q.shape[-2], device=q.device)[:, None], torch.arange(k.shape[-2], device=q.device)[None, :]


def causal_bool(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A decoder as transformers traces it: a causal mask built from aranges, shared by two layers."""
    rows, cols = _positions(q, k)
    mask = (cols <= rows)[None, None].expand(q.shape[0], 1, -1, -1)
    first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(first, k, v, attn_mask=mask)


def causal_additive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rows, cols = _positions(q, k)
    bias = torch.zeros(rows.shape[0], cols.shape[1], dtype=q.dtype, device=q.device).masked_fill(cols > rows, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def causal_from_methods(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The causal mask built through operator methods (`a.__le__(b)`), which dynamo records as
    call_method nodes (transformers' masks on CUDA hold an `__eq__`)."""
    rows, cols = _positions(q, k)
    mask = cols.__le__(rows).__and__(cols.__sub__(rows).__eq__(1).__invert__())
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])


def causal_from_eye(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The causal mask from `eye` and `cumsum`: dynamo's graph pass does not know `eye`, so only
    the ATen pass (on whichever attention op torch picked for the device) sees it constant."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.eye(q.shape[-2], device=q.device).cumsum(0).bool())


def all_true(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An encoder traced without a padding mask: `positions >= 0` everywhere."""
    _, cols = _positions(q, k)
    mask = (cols >= 0)[None, None].expand(q.shape[0], 1, q.shape[-2], k.shape[-2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def shifted_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal with one more position visible: constant, but not what is_causal computes."""
    rows, cols = _positions(q, k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows + 1)


def padding_from_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    _, cols = _positions(q, k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(cols < lengths[:, None])[:, None, None, :])


def random_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = torch.rand(q.shape[-2], k.shape[-2], device=q.device) >= 0  # all True, but drawn at run time
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def qkv(dtype: torch.dtype = torch.float32, queries: int = 16, keys: int = 16) -> list[torch.Tensor]:
    return [torch.randn(2, 3, queries, 8, dtype=dtype), torch.randn(2, 3, keys, 8, dtype=dtype),
            torch.randn(2, 3, keys, 8, dtype=dtype)]


def attention_lines(program) -> list[ExternKernel]:
    return [line for line in program.lines if isinstance(line, ExternKernel) and "scaled_dot_product" in line.op]


@pytest.mark.parametrize("fn", [causal_bool, causal_additive], ids=["bool", "additive"])
def test_a_constant_causal_mask_becomes_is_causal(fn):
    program = wrapgen.lower(fn, qkv())
    attention = attention_lines(program)
    assert attention and all(line.args[3] is None and dict(line.kwargs).get("is_causal") is True for line in attention)
    # nothing builds the mask any more: no kernel, no buffer of its size
    assert not [line for line in program.lines if type(line).__name__ == "KernelDefinition"]
    assert "is_causal=True" in str(program)


def test_an_all_true_mask_is_dropped():
    attention = attention_lines(wrapgen.lower(all_true, qkv()))
    assert attention[0].args[3] is None and not dict(attention[0].kwargs).get("is_causal")


@pytest.mark.parametrize("fn, args", [
    (shifted_causal, qkv()),
    (causal_bool, qkv(queries=8, keys=16)),  # not square: is_causal would align it differently
    (random_mask, qkv()),
    (padding_from_input, [*qkv(), torch.tensor([16, 9])]),
], ids=["shifted", "not-square", "random", "from-input"])
def test_other_masks_stay(fn, args):
    attention = attention_lines(wrapgen.lower(fn, args))
    assert attention and all(line.args[3] is not None for line in attention)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [causal_bool, causal_additive, all_true, shifted_causal])
def test_results_match_eager(target, fn):
    compiled = wrapgen.compile(fn, qkv(), target=target)
    for _ in range(2):
        args = qkv()
        torch.testing.assert_close(compiled(*args), fn(*args))


def test_bf16_causal_matches_eager():
    compiled = wrapgen.compile(causal_bool, qkv(torch.bfloat16))
    args = qkv(torch.bfloat16)
    torch.testing.assert_close(compiled(*args), causal_bool(*args), atol=2e-2, rtol=2e-2)


def test_the_callers_graph_is_not_changed():
    captured = capture(causal_bool, qkv(), False)
    before = str(captured.graph_module.graph)
    rewritten = drop_constant_masks(captured)
    assert rewritten.graph_module is not captured.graph_module
    assert str(captured.graph_module.graph) == before
    assert "is_causal: True" in str(rewritten.graph_module.graph) and "arange" not in str(rewritten.graph_module.graph)


def test_dynamic_sizes_keep_the_mask():
    compiled = wrapgen.compile(causal_bool, qkv(), dynamic=True)
    for n in (16, 24):
        args = qkv(queries=n, keys=n)
        torch.testing.assert_close(compiled(*args), causal_bool(*args))


def test_training_keeps_the_mask_for_its_backward():
    """aot_autograd's forward keeps the log-sum-exp for the backward, which still reads the mask:
    such a call is left alone, and the gradients equal eager's."""
    compiled = torch.compile(causal_bool, backend="wrapgen")
    args = [t.requires_grad_() for t in qkv()]
    reference = [t.detach().clone().requires_grad_() for t in args]
    compiled(*args).sum().backward()
    causal_bool(*reference).sum().backward()
    for got, expected in zip(args, reference):
        torch.testing.assert_close(got.grad, expected.grad)


def test_mask_kind():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert mask_kind(causal, 4, 4) == "causal"
    assert mask_kind(causal[None, None].expand(2, 3, 4, 4), 4, 4) == "causal"
    assert mask_kind(torch.zeros(4, 4).masked_fill(~causal, float("-inf")), 4, 4) == "causal"
    assert mask_kind(torch.ones(1, 4, dtype=torch.bool), 4, 4) == "none"
    assert mask_kind(torch.zeros(4, 4), 4, 4) == "none"
    assert mask_kind(torch.full((4, 4), -1.0), 4, 4) is None  # a real bias
    assert mask_kind(causal.T.contiguous(), 4, 4) is None
    assert mask_kind(torch.ones(4, 6, dtype=torch.bool).tril(), 4, 6) is None
    assert mask_kind(torch.ones(4, 4, dtype=torch.int64), 4, 4) is None


def test_torch_compile_inference_drops_the_mask(tmp_path):
    """Under torch.compile the graph holds the CPU flash attention op: its mask is dropped too."""
    torch._dynamo.reset()
    with wrapgen.config.patch(debug_dir=str(tmp_path)), torch.no_grad():
        compiled = torch.compile(causal_bool, backend="wrapgen")
        args = qkv()
        torch.testing.assert_close(compiled(*args), causal_bool(*args))
    calls = [line for p in tmp_path.glob("*/program.txt") for line in p.read_text().splitlines() if "scaled_dot" in line]
    assert len(calls) == 2 and all("attn_mask" not in line and line.endswith(("0.0, True)", "is_causal=True)")) for line in calls)


def _mask_arguments(line: ExternKernel) -> list[object]:
    """The mask (attn_mask or attn_bias) a library attention call passes, and its is_causal flag."""
    name, overload = line.op.split("::", 1)[1].split(".", 1)
    schema = getattr(getattr(torch.ops.aten, name), overload)._schema
    given = {a.name: (line.args[i] if i < len(line.args) else a.default_value)
             for i, a in enumerate(schema.arguments) if not a.kwarg_only}
    given.update({a.name: a.default_value for a in schema.arguments if a.kwarg_only})
    given.update(dict(line.kwargs))
    return [given.get("attn_mask", given.get("attn_bias")), given.get("is_causal")]


def compiled_attention(fn, args: list[torch.Tensor]) -> list[list[object]]:
    """torch.compile(fn, backend="wrapgen")'s attention calls, as (mask, is_causal), checked against eager."""
    import wrapgen.api

    programs, start_emit = [], wrapgen.api._start_emit

    def recording(program, target):
        programs.append(program)
        return start_emit(program, target)

    torch._dynamo.reset()
    wrapgen.api._start_emit = recording
    try:
        with torch.no_grad():
            got = torch.compile(fn, backend="wrapgen")(*args)
    finally:
        wrapgen.api._start_emit = start_emit
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if args[0].dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, fn(*args), **tolerance)
    return [_mask_arguments(line) for p in programs for line in attention_lines(p)]


@pytest.mark.parametrize("fn", [causal_from_methods, causal_from_eye])
def test_torch_compile_inference_drops_a_mask_built_by_methods_or_eye(fn):
    calls = compiled_attention(fn, qkv())
    assert calls and all(mask is None and causal for mask, causal in calls), calls


def test_option_off_keeps_every_mask(monkeypatch):
    with wrapgen.config.patch(constant_masks=False):
        program = wrapgen.lower(causal_bool, qkv())
        compiled = wrapgen.compile(causal_bool, qkv())
    assert all(line.args[3] is not None for line in attention_lines(program))
    args = qkv()
    torch.testing.assert_close(compiled(*args), causal_bool(*args))
    monkeypatch.setenv("WRAPGEN_CONSTANT_MASKS", "0")
    assert wrapgen.config.OPTIONS["constant_masks"].parse_env() is False


@pytest.mark.cuda
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [causal_bool, all_true])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda(target, fn, dtype):
    """On CUDA the masks go too (half precision then takes flash attention), on every target."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = [t.cuda() for t in qkv(dtype, 64, 64)]
    attention = attention_lines(wrapgen.lower(fn, args))
    assert attention and all(line.args[3] is None for line in attention)
    compiled = wrapgen.compile(fn, args, target=target)
    tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for _ in range(2):
        fresh = [t.cuda() for t in qkv(dtype, 64, 64)]
        torch.testing.assert_close(compiled(*fresh), fn(*fresh), **tolerance)


# -- training: the rewrite on dynamo's graph, before aot_autograd ---------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [causal_bool, all_true, shifted_causal, causal_from_methods])
def test_training_gradients_match_eager(target, fn, tmp_path):
    """A constant mask is dropped (or made is_causal) before aot_autograd, so the forward and the
    backward both run without it; gradients equal eager's. A mask that is not causal stays."""
    with wrapgen.config.patch(debug_dir=str(tmp_path)):
        compiled = torch.compile(fn, backend="wrapgen", options={"target": target})
        args = [t.requires_grad_() for t in qkv()]
        reference = [t.detach().clone().requires_grad_() for t in args]
        out = compiled(*args)
        out.sum().backward()
    expected = fn(*reference)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(args, reference):
        torch.testing.assert_close(got.grad, want.grad)
    programs = "\n".join(p.read_text() for p in tmp_path.glob("*/program.txt"))
    assert "backward" in programs
    assert ("attn_mask=buf" in programs or "attn_mask=arg" in programs) == (fn is shifted_causal)


def test_traced_masks_option_off_keeps_the_mask(tmp_path):
    with wrapgen.config.patch(debug_dir=str(tmp_path)):
        compiled = torch.compile(causal_bool, backend="wrapgen", options={"constant_masks": False})
        args = [t.requires_grad_() for t in qkv()]
        compiled(*args).sum().backward()
    programs = "\n".join(p.read_text() for p in tmp_path.glob("*/program.txt"))
    assert "backward" in programs and programs.count("attn_mask=") >= 4  # two forward, two backward calls


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_training(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    compiled = torch.compile(causal_bool, backend="wrapgen")
    args = [t.cuda().requires_grad_() for t in qkv(dtype, 64, 64)]
    reference = [t.detach().clone().requires_grad_() for t in args]
    compiled(*args).sum().backward()
    causal_bool(*reference).sum().backward()
    tolerance = {} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    for got, want in zip(args, reference):
        torch.testing.assert_close(got.grad, want.grad, **tolerance)


@pytest.mark.cuda
@pytest.mark.parametrize("fn", [causal_bool, causal_from_methods])
def test_cuda_torch_compile_inference_drops_the_mask(fn):
    """Under torch.compile on CUDA, torch picks the attention op while tracing (cuDNN's or the
    efficient one take the mask as a bias): the mask goes, in bf16. (`causal_from_eye`, which only
    the ATen pass could drop, keeps its mask on CUDA: there the bool mask reaches the attention op
    as an additive bias made by constant folding, which that pass does not evaluate.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    calls = compiled_attention(fn, [t.cuda() for t in qkv(torch.bfloat16, 64, 64)])
    assert calls and all(mask is None and causal for mask, causal in calls), calls
