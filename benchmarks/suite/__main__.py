"""`python -m benchmarks.suite`: see benchmarks/suite/run.py."""

import sys

from benchmarks.suite.run import main

main(sys.argv[1:])
