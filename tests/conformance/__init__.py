"""Conformance: PyTorch's OpInfo database through `wrapgen.compile`, for every registered target.

    pytest tests/conformance                 # the fast subset (subset.py); part of `make test`
    make conformance                         # every op: python -m tests.conformance.run
    python -m tests.conformance.run --ops 'nn.functional.*' --max-samples 0 --jobs 4
    python -m tests.conformance.run --from-json build/conformance/results.jsonl   # re-judge a run

harness.py      runs and classifies one sample (pass / fallback / capture failed / wrong /
                crash / skipped)
fallbacks.py    which program lines count as ATen fallbacks (the one place to refine)
known_failures.py  the one list of known wrong/crash results, with reasons (strict xfail)
subset.py       the ops CI runs
run.py          the full run (worker processes, progress bar), report.py its markdown
"""
