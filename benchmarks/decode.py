"""Greedy decoding with a Llama-style causal LM and a static KV cache: eager, Inductor and wrapgen.

    python -m benchmarks.decode [--device cpu|cuda] [--contenders eager,torch.compile,wrapgen]
        [--rounds N] [--tokens N] [--prompt N] [--small | --no-small] [--dtype fp32|bf16] [--threads N]
        [--out-dir DIR]

The model is transformers' LlamaForCausalLM with random weights (torch.manual_seed): 8 layers,
hidden 1024, 16 heads, 4 KV heads (grouped-query attention), intermediate 2816, vocab 32000, in
bf16 on CUDA; `--small` (the default on CPU): 2 layers, hidden 64, 4 heads, 2 KV heads, vocab 256,
in fp32. Batch 1, a random prompt of `--prompt` tokens and transformers' `StaticCache`.

Every contender runs the same loop: the cache is reset, the prompt is prefilled by the eager model
(not timed: it is the same for all), then `--tokens` decode steps each call the contender's forward
on the last token (input_ids, position_ids, the cache, and cache_position where this transformers
takes it) and take the argmax of its logits. Contenders:

    eager                             model.forward
    torch.compile                     torch.compile(model.forward) (Inductor, default mode)
    torch.compile[reduce-overhead]    mode="reduce-overhead" (CUDA graphs; CUDA only)
    wrapgen[python|cpp]               torch.compile(model.forward, backend="wrapgen", options={"target": t})
    wrapgen[python|cpp+graphs]        the same with "cuda_graphs": True (CUDA only)

One untimed generation per contender compiles it; its tokens must equal eager's (fp32; in bf16 a
difference is reported, since rounding can flip a near-tie), and so must every timed round's.
Each round times the decode steps of one generation of every contender in turn (the order
rotating by one each round); the median over rounds is reported as ms per token and tokens/s.
A contender that raises is reported with the exception's first line, and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import machine, step_rounds
from benchmarks.report import fmt_time
from benchmarks.step_rounds import Row

REFERENCE = "eager"
SEED = 0
CONFIGS = {
    "full": dict(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=32000),
    "small": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=176, vocab_size=256),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise SystemExit("benchmarks.decode needs transformers: pip install 'wrapgen[models]'") from error
    return transformers


def build_model(size: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """LlamaForCausalLM with random weights from SEED, with PyTorch's SDPA attention where this
    transformers has it for Llama (else its eager attention), in eval mode."""
    tf = _transformers()
    torch.manual_seed(SEED)

    def make(attention: str) -> torch.nn.Module:
        config = tf.LlamaConfig(**CONFIGS[size], max_position_embeddings=2048, bos_token_id=0, eos_token_id=0,
                                pad_token_id=0, attn_implementation=attention)
        return tf.LlamaForCausalLM(config)

    try:
        model = make("sdpa")
    except ValueError:
        model = make("eager")
    return model.to(device=device, dtype=dtype).eval()


# -- the cache and the calling convention, across transformers versions ------------------------------


def static_cache(model: torch.nn.Module, max_len: int, device: str, dtype: torch.dtype) -> Any:
    """A `StaticCache` for batch 1 and `max_len` tokens, its tensors allocated now.

    transformers 4.x takes (config, max_batch_size, max_cache_len, device, dtype) and allocates at
    once; 5.x takes (config, max_cache_len) and allocates at the first update, or at
    `early_initialization(batch_size, num_heads, head_dim, dtype, device)`."""
    from transformers import StaticCache

    config = model.config
    params = inspect.signature(StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", 1), ("batch_size", 1), ("device", device), ("dtype", dtype)):
        if name in params:
            kwargs[name] = value
    cache = StaticCache(**kwargs)
    early = getattr(cache, "early_initialization", None)
    if early is not None:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        try:
            early(batch_size=1, num_heads=config.num_key_value_heads, head_dim=head_dim, dtype=dtype,
                  device=torch.device(device))
        except TypeError:
            pass  # another signature: the eager prefill allocates it (before any compiled call)
    return cache


@dataclass(frozen=True)
class Convention:
    """How this transformers' forward takes the cache: `cache=` (5.2x) or `past_key_values=`, and
    whether it takes `cache_position` (removed in later 5.x: the cache counts its own length)."""

    cache_keyword: str
    cache_position: bool

    @staticmethod
    def of(model: torch.nn.Module) -> Convention:
        params = inspect.signature(model.forward).parameters
        return Convention("cache" if "cache" in params else "past_key_values", "cache_position" in params)

    def kwargs(self, ids: torch.Tensor, positions: torch.Tensor, position_ids: torch.Tensor, cache: Any) -> dict:
        out = {"input_ids": ids, "position_ids": position_ids, self.cache_keyword: cache, "use_cache": True}
        if self.cache_position:
            out["cache_position"] = positions
        return out


# -- the decode loop ---------------------------------------------------------------------------------


class Generation:
    """One contender's greedy decode: its forward, its own cache, the prompt and the positions
    (made once: a step allocates nothing but what the forward and the argmax do)."""

    def __init__(self, model: torch.nn.Module, forward: Callable[..., Any], prompt: torch.Tensor, tokens: int,
                 device: str, dtype: torch.dtype, before_step: Callable[[], None] | None = None) -> None:
        self.model, self.forward, self.prompt, self.tokens = model, forward, prompt, tokens
        self.before_step = before_step
        self.convention = Convention.of(model)
        length = prompt.shape[1]
        self.cache = static_cache(model, length + tokens, device, dtype)
        self.prefill_positions = torch.arange(length, device=device)
        self.positions = [torch.tensor([length + i], device=device) for i in range(tokens)]
        self.position_ids = [p.view(1, 1) for p in self.positions]

    def prefill(self) -> torch.Tensor:
        """Reset the cache, run the prompt through the eager model; the first new token, (1, 1)."""
        self.cache.reset()
        kwargs = self.convention.kwargs(self.prompt, self.prefill_positions, self.prefill_positions.view(1, -1),
                                        self.cache)
        return self.model(**kwargs).logits[:, -1:].argmax(-1)

    def step(self, i: int, token: torch.Tensor) -> torch.Tensor:
        if self.before_step is not None:
            self.before_step()
        kwargs = self.convention.kwargs(token, self.positions[i], self.position_ids[i], self.cache)
        return self.forward(**kwargs).logits

    def decode(self, token: torch.Tensor, out: list[torch.Tensor]) -> None:
        for i in range(self.tokens):
            token = self.step(i, token)[:, -1:].argmax(-1)
            out.append(token)


def tokens_of(out: list[torch.Tensor]) -> list[int]:
    return torch.cat(out, dim=1)[0].tolist()


def token_check(tokens: list[int], expected: list[int]) -> str | None:
    """None when equal, else where they first differ."""
    if tokens == expected:
        return None
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), min(len(tokens), len(expected)))
    return f"token {first + 1} of {len(expected)} differs ({tokens[first:first + 3]} vs {expected[first:first + 3]})"


# -- the contenders ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    name: str
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None  # wraps model.forward; None: eager
    cuda_only: bool = False
    mark_steps: bool = False  # torch.compiler.cudagraph_mark_step_begin() before each step (Inductor's graphs)


def _wrapgen(target: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def compile_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
        import wrapgen.dynamo

        wrapgen.dynamo.ensure_registered()  # run from a checkout, the entry point may be missing
        return torch.compile(forward, backend="wrapgen", options={"target": target, **options})

    return compile_forward


CONTENDERS = [
    Contender(REFERENCE, None),
    Contender("torch.compile", torch.compile),
    Contender("torch.compile[reduce-overhead]", lambda f: torch.compile(f, mode="reduce-overhead"), cuda_only=True,
              mark_steps=True),
    Contender("wrapgen[python]", _wrapgen("python")),
    Contender("wrapgen[cpp]", _wrapgen("cpp")),
    Contender("wrapgen[python+graphs]", _wrapgen("python", cuda_graphs=True), cuda_only=True),
    Contender("wrapgen[cpp+graphs]", _wrapgen("cpp", cuda_graphs=True), cuda_only=True),
]


# -- the run -----------------------------------------------------------------------------------------


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(model: torch.nn.Module, prompt: torch.Tensor, args: argparse.Namespace) -> list[Row]:
    device, dtype, exact = args.device, DTYPES[args.dtype], args.dtype == "fp32"
    rows: dict[str, Row] = {}
    generations: dict[str, Generation] = {}
    expected: list[int] | None = None
    expected_logits: torch.Tensor | None = None
    for contender in args.chosen:  # eager first: the reference
        row = rows[contender.name] = Row(args.case, contender.name)
        _progress(f"{contender.name}: one generation (the first decode step compiles)")
        try:
            forward = model.forward if contender.compile is None else contender.compile(model.forward)
            mark = torch.compiler.cudagraph_mark_step_begin if contender.mark_steps else None
            generation = Generation(model, forward, prompt, args.tokens, device, dtype, mark)
            graphs = step_rounds.dynamo_graphs()
            token = generation.prefill()
            logits, row.first_call_s = step_rounds.wall_time(generation.step, device, 0, token)
            logits = logits[:, -1].float()
            first = logits.argmax(-1, keepdim=True)
            out = [first]
            logits = logits.cpu()
            for i in range(1, args.tokens):
                out.append(generation.step(i, out[-1])[:, -1:].argmax(-1))
            tokens = tokens_of(out)
            if contender.compile is not None:
                row.graphs = step_rounds.dynamo_graphs() - graphs
        except Exception as error:  # noqa: BLE001 - the row says what broke; the run goes on
            row.fail("compile and first generation", error)
            continue
        if contender.name == REFERENCE:
            expected, expected_logits, row.check = tokens, logits, "ok"
        elif expected is None or expected_logits is None:
            row.detail = f"not checked: {REFERENCE} failed"
        else:
            scale = float(expected_logits.abs().max()) or 1.0
            row.extra["first_step_logits_rel_diff"] = float((logits - expected_logits).abs().max()) / scale
            reason = token_check(tokens, expected)
            row.check = "ok" if reason is None else ("mismatch" if exact else "differs")
            row.detail = "" if reason is None else f"first generation: {reason}"
        generations[contender.name] = generation

    def measure_of(name: str, generation: Generation) -> Callable[[], float]:
        def measure() -> float:
            out: list[torch.Tensor] = []
            token = generation.prefill()
            seconds = step_rounds.time_block(lambda: generation.decode(token, out), device)
            reason = None if expected is None else token_check(tokens_of(out), expected)
            row = rows[name]
            if reason is not None and row.check == "ok":
                row.check, row.detail = ("mismatch" if exact else "differs"), f"round {len(row.round_times) + 1}: {reason}"
            return seconds / args.tokens

        return measure

    measures = {name: measure_of(name, g) for name, g in generations.items()}
    _progress(f"{args.rounds} rounds of {args.tokens} decode steps per contender")
    step_rounds.run_rounds(rows, measures, args.rounds)
    return list(rows.values())


# -- the report --------------------------------------------------------------------------------------


def markdown(rows: list[Row], info: machine.MachineInfo, settings: dict[str, Any], command: str) -> str:
    lines = step_rounds.header(info, "wrapgen benchmarks: greedy decode", settings, command)
    eager = next((r.median_s for r in rows if r.contender == REFERENCE), None)
    inductor = next((r.median_s for r in rows if r.contender == "torch.compile"), None)
    lines += ["## Decode steps", "",
              "| contender | status | ms/token (median) | tokens/s | min - max ms | vs eager | vs torch.compile "
              "| first decode step | graphs | tokens | first-step logits Δ |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        median = r.median_s
        spread = f"{min(r.round_times) * 1e3:.3f} - {max(r.round_times) * 1e3:.3f}" if median else "—"
        diff = r.extra.get("first_step_logits_rel_diff")
        lines.append("| " + " | ".join(step_rounds.cell(c) for c in [
            r.contender, r.status, step_rounds.fmt(median and median * 1e3, ".3f"),
            step_rounds.fmt(median and 1 / median, ".1f"), spread,
            step_rounds.fmt(eager / median if eager and median else None, ".2f", "x"),
            step_rounds.fmt(inductor / median if inductor and median and r.contender != "torch.compile" else None,
                            ".2f", "x"),
            fmt_time(r.first_call_s), step_rounds.fmt(r.graphs, "d"), step_rounds.CHECK_TEXT[r.check],
            step_rounds.fmt(diff, ".1e"),
        ]) + " |")
    lines.append("")
    lines += step_rounds.failures(rows)
    lines += [
        "## Method", "",
        "- The prompt is prefilled by the eager model into the contender's own `StaticCache` (reset first),",
        "  untimed; then `tokens` decode steps each run the contender's forward on one token and take the argmax",
        "  of its logits on the device (no host sync inside the loop).",
        "- **first decode step**: the synchronized wall time of the contender's first decode call (its compile,",
        "  with the caches as found); **graphs**: graphs dynamo compiled during its first generation.",
        "- **tokens**: the greedy tokens of the first generation and of every timed round against eager's (fp32:",
        "  must be equal; bf16: a difference is reported as such, rounding can flip a near-tie). **first-step",
        "  logits Δ**: max |logits - eager's| / max |eager's| at the first decode step (every contender has the",
        "  same input there).",
        "- Each round times the decode steps of one generation of every contender, the order rotating by one each",
        "  round (CUDA events on a GPU, the wall clock on CPU, synchronized before and after); reported: the median",
        "  over rounds of ms per token (tokens/s: its inverse), and the fastest and slowest round.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated subset of {', '.join(c.name for c in CONTENDERS)}; 'wrapgen' names "
                             f"every wrapgen[...], 'torch.compile' both modes ({REFERENCE} always runs)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7 on CUDA, 5 on CPU)")
    parser.add_argument("--tokens", type=int, default=None, help="decode steps per generation (default 128; 32 on CPU)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=None,
                        help="the small config (default: on CPU; the 8-layer model on CUDA)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                        help="default: bf16 for the full model, fp32 for the small one")
    args = step_rounds.parse_common(parser, argv)
    on_cuda = args.device == "cuda"
    args.size = "small" if args.small else "full"
    args.dtype = args.dtype or ("fp32" if args.small else "bf16")
    args.rounds = args.rounds or (7 if on_cuda else 5)
    args.tokens = args.tokens or (128 if on_cuda else 32)
    for name in ("rounds", "tokens", "prompt"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    available = [c.name for c in CONTENDERS if on_cuda or not c.cuda_only]
    try:
        wanted = step_rounds.select(available, args.contenders, REFERENCE)
    except ValueError as error:
        parser.error(str(error))
    args.chosen = [c for c in CONTENDERS if c.name in wanted]
    args.case = f"llama-{args.size}-{args.dtype}"
    return args


def main(argv: Sequence[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tf = _transformers()
    started = time.perf_counter()
    with torch.no_grad(), step_rounds.raised_recompile_limits():
        model = build_model(args.size, args.device, DTYPES[args.dtype])
        generator = torch.Generator().manual_seed(SEED)
        prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=generator).to(args.device)
        count = sum(p.numel() for p in model.parameters())
        _progress(f"{args.case}: {count / 1e6:.2f}M parameters on {args.device}, transformers {tf.__version__}")
        rows = run(model, prompt, args)
    torch._dynamo.reset()
    gc.collect()
    info = machine.collect(args.device)
    command = "python -m benchmarks.decode " + " ".join(sys.argv[1:] if argv is None else argv)
    config = CONFIGS[args.size]
    settings = {
        "model": f"LlamaForCausalLM (transformers {tf.__version__}, attention "
                 f"`{getattr(model.config, '_attn_implementation', '?')}`): {config['num_hidden_layers']} layers, hidden "
                 f"{config['hidden_size']}, {config['num_attention_heads']} heads, {config['num_key_value_heads']} KV "
                 f"heads, intermediate {config['intermediate_size']}, vocab {config['vocab_size']}; "
                 f"{count:,} parameters, {args.dtype}, random weights (seed {SEED})",
        "decode": f"batch 1, prompt {args.prompt} tokens (eager prefill), {args.tokens} decode steps, StaticCache of "
                  f"{args.prompt + args.tokens} tokens; cache passed as `{Convention.of(model).cache_keyword}=`"
                  + (", with cache_position" if Convention.of(model).cache_position else ""),
        "rounds": str(args.rounds),
        "run took": f"{(time.perf_counter() - started) / 60:.1f} min",
    }
    text = markdown(rows, info, settings, command)
    payload = {"machine": info.as_dict(), "transformers": tf.__version__, "settings": settings | {
        "size": args.size, "dtype": args.dtype, "prompt": args.prompt, "tokens": args.tokens, "rounds": args.rounds,
        "parameters": count}, "command": command, "results": step_rounds.rows_json(rows)}
    suite = f"decode-{args.size}-{args.dtype}" + (f"-threads{args.threads}" if args.threads else "")
    paths = step_rounds.write(args.out_dir, machine.file_stem(info, suite), text, payload)
    print(text.split("## Method")[0].split("## Decode steps")[1].strip())
    for path in paths:
        print(f"wrote {path}")
    return paths


if __name__ == "__main__":
    main()
