"""Multi-kernel reductions (config.multi_kernel) and the MultiKernelCall line on every target.

A Triton reduction over a dynamic row length gets persistent variants (one per power-of-two
row bucket) beside its looped kernel; each call times the candidates of its bucket once and
keeps the fastest. On CPU the Triton kernels run in Triton's interpreter (python, fx and
interpret targets); the C++ target's choosing (wrapgen/kernel_choice.h) is checked on CPU with
a program whose C++ kernels are each offered twice, and with Triton on the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import wrapgen
from wrapgen.kernels.choice import BENCHMARKS
from wrapgen.kernels.triton import compat
from wrapgen.wrapper_ir import KernelCall, KernelDefinition, MultiKernelCall

interpreter = pytest.mark.skipif(
    not (compat.available() and compat.interpreting()), reason="needs triton in interpreter mode (CPU machines)"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)


def _layer_norm_args(rows: int, n: int, device: str = "cpu") -> tuple:
    return torch.randn(rows, n, device=device), torch.randn(n, device=device), torch.randn(n, device=device)


@interpreter
def test_reduction_over_a_dynamic_row_gets_bucketed_variants():
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True, multi_kernel=True):
        program = wrapgen.lower(softmax, (torch.randn(4, 40),), dynamic=True)
    (choice,) = [line for line in program.lines if isinstance(line, MultiKernelCall)]
    assert choice.purpose == "multi_kernel" and choice.bucketed
    assert choice.serves[0] is None and choice.serves[1:] == tuple(2**k for k in range(4, 15))
    assert "choose multi_kernel mk_triton_fused_softmax" in str(program) and "if bucket==1024" in str(program)
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True):  # off by default: one looped kernel
        program = wrapgen.lower(softmax, (torch.randn(4, 40),), dynamic=True)
    assert not any(isinstance(line, MultiKernelCall) for line in program.lines)


@interpreter
@pytest.mark.parametrize("target", ["python", "fx", "interpret"])
def test_multi_kernel_softmax_and_layer_norm_match_eager(target):
    BENCHMARKS.clear()
    with wrapgen.config.patch(cpu_kernels="triton", kernels=True, multi_kernel=True):
        fn = wrapgen.compile(softmax, (torch.randn(4, 40),), target=target, dynamic=True)
        norm = wrapgen.compile(layer_norm, _layer_norm_args(4, 40), target=target, dynamic=True)
    for n in (40, 8, 20, 33):  # buckets 64, 8, 32, 64 (cached)
        x = torch.randn(3, n)
        torch.testing.assert_close(fn(x), softmax(x))
    for n in (40, 300):
        args = _layer_norm_args(3, n)
        torch.testing.assert_close(norm(*args), layer_norm(*args), atol=1e-4, rtol=1e-4)
    counts = sorted(BENCHMARKS.values())
    assert counts == [2, 3]  # once per bucket


def _offered_twice(program):
    """Each kernel launch becomes a choice between the kernel and a renamed copy of it."""
    lines = []
    for line in program.lines:
        if isinstance(line, KernelDefinition):
            lines += [line, dataclasses.replace(line, name=line.name + "_alt", source=line.source.replace(line.name, line.name + "_alt"))]
        elif isinstance(line, KernelCall):
            plain = dataclasses.replace(line, may_alias=())
            key = tuple(sorted(line.symbols_used(), key=str))
            candidates = (plain, dataclasses.replace(plain, kernel=line.kernel + "_alt"))
            lines.append(MultiKernelCall(f"mk_{line.kernel}", candidates, key, "multi_kernel"))
        else:
            lines.append(line)
    return dataclasses.replace(program, lines=tuple(lines))


def _sum_and_scale(x, y):
    return (x.sin() + y).sum(1), x * 2


@pytest.mark.parametrize("target", ["python", "interpret", "cpp"])
def test_choice_between_cpu_kernels_on_every_target(target):
    BENCHMARKS.clear()
    with wrapgen.config.patch(cpu_kernels="cpp", kernels=True):
        program = _offered_twice(wrapgen.lower(_sum_and_scale, (torch.randn(8, 33), torch.randn(8, 33)), dynamic=True))
        built = wrapgen.build(program, target)
    assert any(isinstance(line, MultiKernelCall) for line in program.lines)
    for n in (33, 33, 50):
        x, y = torch.randn(8, n), torch.randn(8, n)
        torch.testing.assert_close(tuple(built.call([x, y])), _sum_and_scale(x, y))
    if target == "cpp":
        assert "wrapgen::kernel_choice(" in built.source
    else:
        assert sorted(BENCHMARKS.values()) == [2]  # keys (33) and (50)


# -- GPU (H100) ---------------------------------------------------------------------------------------
@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("target", ["python", "fx", "cpp"])
def test_multi_kernel_on_cuda(target):
    with wrapgen.config.patch(multi_kernel=True):
        fn = wrapgen.compile(softmax, (torch.randn(8, 1024, device="cuda"),), target=target, dynamic=True)
        norm = wrapgen.compile(layer_norm, _layer_norm_args(8, 1024, "cuda"), target=target, dynamic=True)
    assert any(isinstance(line, MultiKernelCall) for line in fn.program.lines)
    for n in (64, 1024, 16384, 131072, 1024):
        x = torch.randn(16, n, device="cuda")
        torch.testing.assert_close(fn(x), softmax(x))
        args = _layer_norm_args(16, n, "cuda")
        torch.testing.assert_close(norm(*args), layer_norm(*args), atol=1e-4, rtol=1e-4)
