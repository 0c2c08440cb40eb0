"""Who is told of cuBLAS workspace clears (`wrapgen.kernels.streams`), on the CPU.

CPU builds of torch have no `torch._C._cuda_clearCublasWorkspaces`; these tests put a recorder
in its place to check the wrapper's contract. What the clears do to recorded graphs on a GPU is
tests/test_cuda_graph_workspaces.py.
"""

from __future__ import annotations

import pytest
import torch

from wrapgen.kernels import streams


@pytest.fixture
def clears(monkeypatch) -> list[str]:
    """A stand-in for torch's clear that logs each call; no listeners registered yet."""
    log: list[str] = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: log.append("clear"), raising=False)
    monkeypatch.setattr(streams, "_cleared_listeners", {})
    return log


def test_listeners_are_told_before_and_after_each_clear(clears):
    streams.on_workspaces_cleared("a", lambda: clears.append("a"))
    streams.on_workspaces_cleared("b", lambda: clears.append("b"))
    torch._C._cuda_clearCublasWorkspaces()  # as torch.compile's reduce-overhead calls it
    assert clears == ["a", "b", "clear", "a", "b"]


def test_the_wrapper_is_installed_once_and_a_name_registers_once(clears):
    streams.on_workspaces_cleared("model.so", lambda: clears.append("old"))
    wrapper = torch._C._cuda_clearCublasWorkspaces
    streams.on_workspaces_cleared("model.so", lambda: clears.append("new"))  # the same library loaded again
    assert torch._C._cuda_clearCublasWorkspaces is wrapper
    streams.clear_library_workspaces()
    assert clears == ["new", "clear", "new"]


def test_clearing_without_listeners_or_without_cuda(clears, monkeypatch):
    streams.clear_library_workspaces()
    assert clears == ["clear"]
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces")
    streams.clear_library_workspaces()  # a CPU build: nothing to clear, no error
    streams.on_workspaces_cleared("x", lambda: clears.append("x"))
    assert clears == ["clear"]
