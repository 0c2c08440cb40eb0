"""The sanitizer (config.sanitize): run-time checks of the Wrapper IR's memory and range rules,
shared by the targets that run programs in Python (interpret, python)."""

from wrapgen.backends.sanitize.checker import CallSanitizer, ProgramSanitizer

__all__ = ["CallSanitizer", "ProgramSanitizer"]
