"""Greedy generation with transformers' static KV cache, the model's forward compiled by wrapgen.

`model.generate(..., cache_implementation="static")` compiles the decoding forward with the
generation config's `CompileConfig`; naming wrapgen there is all it takes. The cache tensors are
updated in place by the compiled program (`index_put_` into the cache, no copy of it), and on a
GPU `options={"cuda_graphs": True}` replays each decode step as one CUDA graph.

    python examples/static_cache_generate.py          # a small random Llama on the CPU
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import wrapgen.dynamo

wrapgen.dynamo.ensure_registered()  # backend="wrapgen" also from a source checkout


def small_llama(device: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).to(device).eval()


def generate(model: LlamaForCausalLM, prompt: torch.Tensor, compile_config: CompileConfig | None) -> list[int]:
    model.generation_config.compile_config = compile_config
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, cache_implementation="static",
                             disable_compile=compile_config is None)
    return out[0, prompt.shape[1]:].tolist()


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = small_llama(device)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1)).to(device)
    eager = generate(model, prompt, None)
    with tempfile.TemporaryDirectory() as programs:
        options = {"target": "python", "cuda_graphs": device == "cuda", "debug_dir": programs}
        compile_config = CompileConfig(backend="wrapgen", fullgraph=True, mode=None, options=options)
        compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told (CPU here)
        compiled = generate(model, prompt, compile_config)
        written = sorted(Path(programs).glob("*/program.txt"))
        assert written, "transformers did not compile the forward"
        text = written[-1].read_text()
    print("eager:  ", eager)
    print("wrapgen:", compiled)
    print(f"decode program: {text.count(' call ')} kernel calls, cache updates in place: {'index_put_' in text}")
    assert compiled == eager, "greedy tokens differ from eager's"


if __name__ == "__main__":
    main()
