"""Program-to-program transformations. Each returns a new Program and keeps it verifiable."""

from wrapgen.wrapper_ir.passes.finite_checks import add_finite_checks

__all__ = ["add_finite_checks"]
