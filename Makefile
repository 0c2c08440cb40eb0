# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: setup demo test lint clean bench conformance fuzz

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

demo: $(STAMP)
	$(PY) examples/demo.py

# Two pytest workers: the tests are mostly single-threaded (compiles, small kernels), so on CI's
# two cores the suite takes about 26 minutes instead of 42. Each worker has its own artifact cache.
test: $(STAMP)
	$(PY) -m pytest -q -n 2

lint: $(STAMP)
	$(VENV)/bin/ruff check wrapgen tests examples benchmarks

clean:
	rm -rf $(VENV) build .pytest_cache

# Benchmarks: eager vs torch.compile vs every wrapgen target; writes benchmarks/results/bench-<device>-*.{md,png,json}.
# BENCH_ARGS, e.g. "--device cpu --workloads softmax,mlp --rounds 1" or "--quick" (default: 3 rounds, medians reported).
# Then the real models (GPT-2, Llama-style GQA, BERT, ResNet-50, ViT-B/16; full sizes on CUDA, small on CPU) into
# bench-<device>-*-models[-bf16].*: BENCH_MODELS picks them ("gpt2,bert"; "none" skips), MODEL_BENCH_ARGS e.g.
# "--dtype bf16 --tasks inference --rounds 1"; `python -m benchmarks.model_lowering` counts kernels vs library calls.
BENCH_MODELS ?= all
bench: $(STAMP)
	$(PY) -m benchmarks.run $(BENCH_ARGS)
	test "$(BENCH_MODELS)" = none || $(PY) -m benchmarks.run --models $(BENCH_MODELS) $(MODEL_BENCH_ARGS)

# Conformance: every OpInfo op through every wrapgen target; writes benchmarks/results/conformance-<device>-<target>.md
# (float32 samples; "--dtypes bfloat16 float16" writes conformance-<device>-<target>-<dtype>.md for each).
# CONFORMANCE_ARGS, e.g. "--ops 'add*' 'nn.functional.*'", "--max-samples 0" (every sample), "--jobs 4".
CONFORMANCE_ARGS ?= --max-samples 5
conformance: $(STAMP)
	$(PY) -m tests.conformance.run $(CONFORMANCE_ARGS)

# Differential fuzzing: random programs through every target and memory-planning mode (and the sanitized
# interpreter) against eager; mismatches shrunk into reproducers under build/fuzz/. FUZZ_ARGS, e.g. "--seed 3".
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(PY) -m wrapgen.fuzz --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)
