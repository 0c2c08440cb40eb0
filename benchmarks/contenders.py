"""The contenders: eager PyTorch, torch.compile (Inductor) and every registered wrapgen target.

A contender builds a callable from (model, example inputs) inside `caches(root)`, a context
that gives it fresh, empty compile caches under `root`, so that its first call is a cold
compile. torch.compile compiles lazily: its build is instant and its first call compiles.
For training steps a contender's `train_build` compiles the loss module instead: through
torch.compile (for wrapgen, `backend="wrapgen"`), since aot_autograd builds the backward.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import wrapgen
import wrapgen.dynamo

Build = Callable[[nn.Module, tuple[torch.Tensor, ...]], Callable[..., Any]]


@contextlib.contextmanager
def no_caches(root: str) -> Iterator[None]:
    yield


@dataclass(frozen=True)
class Contender:
    name: str
    build: Build
    caches: Callable[[str], contextlib.AbstractContextManager] = field(default=no_caches)
    compiles: bool = True  # False for eager: no compile time to report
    train_build: Build | None = None  # compiles a module whose backward is run too; None: no training
    opt_in: bool = False  # measured only when named (--contenders): autotuning makes cold compiles long


# -- eager -------------------------------------------------------------------------------------


def _eager(model: nn.Module, inputs: tuple) -> Callable[..., Any]:
    return model


# -- torch.compile -----------------------------------------------------------------------------


def _clear_inductor_caches() -> None:
    utils = torch._inductor.utils
    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def fresh_inductor_caches(root: str) -> Iterator[None]:
    """A cold torch.compile: dynamo's state reset, in-memory caches cleared, the on-disk caches
    (Inductor's and Triton's) pointed at a new empty directory, and Inductor's cache lookups off."""
    import torch._inductor.config
    import torch._inductor.utils

    torch._dynamo.reset()
    directory = tempfile.mkdtemp(prefix="inductor-", dir=root)
    _clear_inductor_caches()
    with _environment(TORCHINDUCTOR_CACHE_DIR=directory, TRITON_CACHE_DIR=os.path.join(directory, "triton")):
        with torch._inductor.config.patch(force_disable_caches=True):
            yield


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set for the block, restored after it."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _torch_compile(mode: str | None) -> Build:
    def build(model: nn.Module, inputs: tuple) -> Callable[..., Any]:
        return torch.compile(model, mode=mode)

    return build


# -- wrapgen -----------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_wrapgen_cache(root: str) -> Iterator[None]:
    """A cold wrapgen compile: its own cache and Triton's pointed at a new empty directory (as
    for torch.compile), so no contender reuses the Triton kernels another one compiled."""
    directory = tempfile.mkdtemp(prefix="wrapgen-", dir=root)
    with _environment(TRITON_CACHE_DIR=os.path.join(directory, "triton")), wrapgen.config.patch(cache_dir=directory):
        yield


def _wrapgen(target: str, **options: Any) -> Build:
    def build(model: nn.Module, inputs: tuple) -> Callable[..., Any]:
        with wrapgen.config.patch(**options):
            return wrapgen.compile(model, inputs, target=target)

    return build


def _wrapgen_dynamo(target: str, **options: Any) -> Build:
    """wrapgen through torch.compile: what a training step needs (wrapgen.compile is inference-only)."""

    def build(model: nn.Module, inputs: tuple) -> Callable[..., Any]:
        wrapgen.dynamo.ensure_registered()  # run from a checkout, the entry point may be missing
        return torch.compile(model, backend="wrapgen", options={"target": target, **options})

    return build


# -- the list ----------------------------------------------------------------------------------


def default_contenders(device: str) -> list[Contender]:
    """eager, torch.compile (default; reduce-overhead on CUDA) and every registered wrapgen target."""
    contenders = [
        Contender("eager", _eager, compiles=False, train_build=_eager),
        Contender("torch.compile", _torch_compile(None), fresh_inductor_caches, train_build=_torch_compile(None)),
    ]
    if device == "cuda":
        reduce_overhead = _torch_compile("reduce-overhead")
        contenders.append(Contender("torch.compile[reduce-overhead]", reduce_overhead, fresh_inductor_caches,
                                    train_build=reduce_overhead))
    for target in wrapgen.backends.registered_backends():
        contenders.append(Contender(f"wrapgen[{target}]", _wrapgen(target), fresh_wrapgen_cache,
                                    train_build=_wrapgen_dynamo(target)))
    # The default memory plan is buffer reuse; the pooled plan is measured beside it once.
    pooled = {"memory_planning": "pooled"}
    contenders.append(Contender("wrapgen[python+pooled]", _wrapgen("python", **pooled), fresh_wrapgen_cache,
                                train_build=_wrapgen_dynamo("python", **pooled)))
    if device == "cuda":
        # CUDA graphs (issue 19), against torch.compile[reduce-overhead] (Inductor's CUDA graphs).
        graphs = {"cuda_graphs": True}
        for target in ("python", "cpp"):
            contenders.append(Contender(f"wrapgen[{target}+graphs]", _wrapgen(target, **graphs), fresh_wrapgen_cache,
                                        train_build=_wrapgen_dynamo(target, **graphs)))
    if device == "cpu":
        # Large CPU buffers are advised onto huge pages by default; this row shows the kernels
        # and wrapper without that advice, on the 4 KiB pages every other contender gets.
        small_pages = {"cpu_huge_pages": False}
        contenders.append(Contender("wrapgen[python+4k-pages]", _wrapgen("python", **small_pages),
                                    fresh_wrapgen_cache, train_build=_wrapgen_dynamo("python", **small_pages)))
    # Constant attention masks kept as traced: the row beside wrapgen[python] that shows what
    # dropping them (or making them is_causal) is worth. Opt-in: name it in --contenders.
    kept_masks = {"constant_masks": False}
    contenders.append(Contender("wrapgen[python+kept-masks]", _wrapgen("python", **kept_masks), fresh_wrapgen_cache,
                                train_build=_wrapgen_dynamo("python", **kept_masks), opt_in=True))
    # GEMM templates chosen by measurement at compile time, against Inductor's counterpart
    # (CUDA graphs off on both sides). Opt-in: name them in --contenders.
    autotune = {"max_autotune": True}
    contenders.append(Contender("wrapgen[python+max_autotune]", _wrapgen("python", **autotune), fresh_wrapgen_cache,
                                train_build=_wrapgen_dynamo("python", **autotune), opt_in=True))
    inductor_autotune = _torch_compile("max-autotune-no-cudagraphs")
    contenders.append(Contender("torch.compile[max-autotune-no-cudagraphs]", inductor_autotune, fresh_inductor_caches,
                                train_build=inductor_autotune, opt_in=True))
    return contenders


def dynamo_entry_contenders() -> list[Contender]:
    """torch.compile(model, backend="wrapgen") per target, named `wrapgen-dynamo[target]`: the entry
    point most users take, beside `wrapgen[target]` (wrapgen.compile) for the same model."""
    return [Contender(f"wrapgen-dynamo[{target}]", _wrapgen_dynamo(target), fresh_wrapgen_cache,
                      train_build=_wrapgen_dynamo(target)) for target in wrapgen.backends.registered_backends()]


def select(contenders: list[Contender], names: str | None) -> list[Contender]:
    """Contenders named in a comma-separated list; `wrapgen` names every `wrapgen[...]` target,
    `torch.compile` both of its modes. Eager is always kept: it is the reference. Opt-in
    contenders (max_autotune on either side) run only when named exactly."""
    if not names:
        return [c for c in contenders if not c.opt_in]
    tokens = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name for c in contenders}
    for token in tokens:
        if not any(name == token or name.startswith(token + "[") for name in known):
            raise ValueError(f"unknown contender {token!r}; contenders are: {', '.join(sorted(known))}")
    return [
        c for c in contenders
        if c.name == "eager" or any(c.name == t or (not c.opt_in and c.name.startswith(t + "[")) for t in tokens)
    ]
