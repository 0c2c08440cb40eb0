"""`python -m wrapgen.fuzz --seconds N [--seed S]`: progress on stderr, reproducers under --out,
and `N programs, K mismatches` as the last line on stdout (exit status 1 when K > 0)."""

from __future__ import annotations

import argparse
import sys

from wrapgen.backends.registry import registered_backends
from wrapgen.fuzz.driver import fuzz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wrapgen.fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="start no new program after this long")
    parser.add_argument("--seed", type=int, default=0, help="the program stream (deterministic per seed)")
    parser.add_argument("--out", default="build/fuzz", help="where reproducers of mismatches go")
    parser.add_argument("--targets", default=None, help="comma-separated targets (default: every registered one)")
    parser.add_argument("--programs", type=int, default=None, help="stop after this many programs")
    parser.add_argument("--shrink-seconds", type=float, default=30.0, help="time to shrink each mismatch")
    args = parser.parse_args(argv)
    targets = args.targets.split(",") if args.targets else None
    unknown = sorted(set(targets or ()) - set(registered_backends()))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; registered: {', '.join(registered_backends())}")
    report = fuzz(args.seconds, args.seed, args.out, targets, args.programs, args.shrink_seconds)
    for finding in report.findings:
        labels = ", ".join(o.variant.label for o in finding.outcomes)
        print(f"mismatch: {finding.program.name} in {labels}: {finding.reproducer}")
    if report.skipped or report.not_captured or report.refused:
        print(f"skipped {report.skipped} programs eager refuses, {report.not_captured} torch.export cannot capture; "
              f"{report.refused} documented refusals by a target")
    print(report.summary)
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
