"""Conformance: PyTorch's OpInfo database through `wrapgen.compile`, for every registered target.

    pytest tests/conformance                 # the fast subset (subset.py); part of `make test`
    make conformance                         # every op: python -m tests.conformance.run
    python -m tests.conformance.run --ops 'nn.functional.*' --max-samples 0 --jobs 4
    python -m tests.conformance.run --budget-s 540 --shard 1/2   # stop in time; half the ops
    python -m tests.conformance.run --from-json build/conformance/results.jsonl   # re-judge a run
    python -m tests.conformance.run --from-json a.jsonl b.jsonl  # merge shards into one report
    python -m tests.conformance.run --dtypes bfloat16 float16   # half-precision samples, a report each

harness.py      runs and classifies one sample (pass / fallback / capture failed / wrong /
                crash / skipped)
fallbacks.py    which program lines count as ATen fallbacks (the one place to refine)
precision.py    the sample dtypes (float32, bfloat16, float16), their tolerances, and the float32
                reference a half result may match instead of eager
known_failures.py  the one list of known wrong/crash results, with reasons (strict xfail);
                HALF_FAILURES: those only bf16/fp16 samples show
subset.py       the ops CI runs
run.py          the full run: plan, journal, reports (--budget-s, --shard i/n, --from-json to merge)
supervisor.py   hands ops to worker processes (worker.py), keeps to the wall-clock budget
schedule.py     cheapest ops first (op_costs.json, measured), shards
journal.py      every result as JSON lines, written as it arrives (a killed run keeps them)
report.py       the markdown: counts per class, not-run / cut-off ops, where the time went
"""
