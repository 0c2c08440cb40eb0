"""Shared fixtures: a private artifact cache, a fresh dynamo state per test, a fixed seed."""

from __future__ import annotations

import os

import pytest
import torch

# Without a GPU, Triton kernels run on CPU tensors in Triton's interpreter: CI covers Triton
# codegen this way (tests/test_kernels_triton.py). It changes nothing else: CPU kernels stay C++
# unless a test asks for Triton (config.cpu_kernels).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import wrapgen
import wrapgen.dynamo
from wrapgen.kernels.triton import compat

# `backend="wrapgen"` without the entry point (the GPU host runs the suite from the checkout)
wrapgen.dynamo.ensure_registered()


@pytest.fixture(scope="session", autouse=True)
def wrapgen_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Emitted artifacts go to a temporary directory, never to ~/.cache/wrapgen (session-wide,
    so module-scoped fixtures that compile use it too)."""
    cache = tmp_path_factory.mktemp("wrapgen_cache")
    with wrapgen.config.patch(cache_dir=str(cache)):
        yield cache


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """torch.compile state (compiled frames, guards, counters) does not leak between tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


# CPU kernel languages a test of generated kernels runs in: C++, and Triton where its interpreter runs
KERNEL_LANGUAGES = ["cpp"] + (["triton"] if compat.available() and compat.interpreting() else [])


@pytest.fixture(params=KERNEL_LANGUAGES)
def kernels(request):
    """Generated kernels on, in each CPU kernel language (the C++ target launches no interpreted
    Triton kernels: that pair is skipped)."""
    target = request.node.callspec.params.get("target")
    if request.param == "triton" and target == "cpp":
        pytest.skip("the C++ target launches no interpreted Triton kernels")
    with wrapgen.config.patch(cpu_kernels=request.param, kernels=True):
        yield request.param
