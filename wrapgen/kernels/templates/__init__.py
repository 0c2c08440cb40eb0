"""GEMM templates for `config.max_autotune` (and, on CUDA, for misaligned and skinny products): matrix
products generated with their epilogue fused (C++ on the CPU, Triton on the GPU), chosen
against the library call by measurement."""

from __future__ import annotations

from wrapgen.kernels.templates.autotune import Selection, precompile, select_gemm
from wrapgen.kernels.templates.problem import Epilogue, GemmProblem, Operand

__all__ = ["Epilogue", "GemmProblem", "Operand", "Selection", "precompile", "select_gemm"]
