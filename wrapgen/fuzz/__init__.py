"""Differential fuzzing: random PyTorch programs through every target, memory-planning mode and the
sanitized interpreter, compared with eager; each mismatch shrunk to a reproducer file.

    python -m wrapgen.fuzz --seconds 60 [--seed 0] [--out build/fuzz] [--targets python,interpret]
"""

from wrapgen.fuzz.driver import Finding, FuzzReport, fuzz
from wrapgen.fuzz.generator import FuzzProgram, generate

__all__ = ["Finding", "FuzzProgram", "FuzzReport", "fuzz", "generate"]
