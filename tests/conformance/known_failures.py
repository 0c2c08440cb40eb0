"""Known *wrong* and *crash* results of the conformance suite: the one list, a reason each.

A known failure is reported as such (pytest: a strict xfail; the full run: "known"); an entry
whose op no longer fails is flagged (XPASS, "stale") so the list stays honest — delete it then.
Keys are OpInfo keys (`name` or `name.variant_test_name`, as `harness.op_key` prints them).
An entry covers every sample dtype (float32, bfloat16, float16) unless its `dtypes` names some;
HALF_FAILURES holds the ones only half precision shows (for bf16/fp16 its entry replaces the
op's entry here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ALL_MODES = ("static", "dynamic", "inplace-static", "inplace-dynamic")
STATIC = ("static", "inplace-static")
DYNAMIC = ("dynamic", "inplace-dynamic")
OP = ("static", "dynamic")
HALF = ("bfloat16", "float16")


@dataclass(frozen=True)
class Known:
    """Why an op fails, in which modes, and how (`kinds`: the failing classes it shows)."""

    reason: str
    kinds: tuple[str, ...] = ("crash",)
    modes: tuple[str, ...] = ALL_MODES
    targets: tuple[str, ...] | None = None  # None: every target
    devices: tuple[str, ...] | None = None  # None: every device
    samples: tuple[int, ...] | None = None  # sample indices that fail; None: any may
    dtypes: tuple[str, ...] | None = None  # sample dtypes ("float32", "bfloat16", "float16"); None: every one


KNOWN_FAILURES: dict[str, Known] = {
    "broadcast_shapes": Known(
        "returns a plain tuple where eager returns torch.Size (values are right): CompiledFunction rebuilds "
        "outputs with torch's pytree, whose torch.Size node unflattens to a tuple (wrapgen/compiled.py)",
        kinds=("wrong",),
        modes=OP,
    ),
    "masked_select": Known(
        "torch's bug, not ours: when the mask broadcasts the input, torch.export bounds the result size u0 by "
        "the input's numel (u0 <= 10 for 49 selected) and its graph asserts that; torch.export's own "
        "ep.module() fails the same way ('Runtime assertion failed for expression u0 <= 10')",
        modes=("static",),
        samples=(2, 3),
    ),
    "sparse.sampled_addmm": Known(
        "sparse CSR inputs: the lowering gives every input a strided TensorType (GraphLowering.tensor_type "
        "calls .stride()), so sparse layouts raise 'Sparse CSR tensors do not have strides'",
        modes=OP,
    ),
    "sparse.mm.reduce": Known(
        "sparse CSR inputs: the lowering gives every input a strided TensorType (GraphLowering.tensor_type "
        "calls .stride()), so sparse layouts raise 'Sparse CSR tensors do not have strides' (dynamic: "
        "torch.export cannot capture it; on CUDA eager has no kernel for it, so it is skipped there)",
        modes=("static",),
        devices=("cpu",),
    ),
    **{
        f"_segment_reduce.{variant}": Known(
            "C++ target only: reduce='mean' with a Scalar `initial` has no route through the stable C shim "
            "(StableIValues carry no Scalar, the op has no Tensor overload or generated shim, and unlike "
            "max/min/prod/sum the mean is no elementwise combine of the reduction without `initial`); the "
            "emitter refuses the line with UnsupportedLineError naming it",
            modes=OP,
            targets=("cpp",),
            samples=tuple(i for i in range(100) if i % 10 in (2, 3)),  # the mean samples with an initial
        )
        for variant in ("lengths", "offsets")
    },
}

# Failures only bf16/fp16 samples show. For those dtypes an entry here replaces the op's entry
# in KNOWN_FAILURES (repeat what still applies).
HALF_FAILURES: dict[str, Known] = {}


def known_failure(
    key: str, mode: str, target: str, device: str, samples: Iterable[int] | None = None, dtype: str = "float32"
) -> Known | None:
    """The entry for `key` that covers this mode, target, device and sample dtype (and, when the
    entry names sample indices and `samples` says which ran, one of those), if any."""
    entry = HALF_FAILURES.get(key) if dtype in HALF else None
    if entry is None or (entry.dtypes is not None and dtype not in entry.dtypes):
        entry = KNOWN_FAILURES.get(key)
    if entry is None or mode not in entry.modes:
        return None
    if entry.dtypes is not None and dtype not in entry.dtypes:
        return None
    if entry.targets is not None and target not in entry.targets:
        return None
    if entry.devices is not None and device not in entry.devices:
        return None
    if entry.samples is not None and samples is not None and not set(entry.samples) & set(samples):
        return None
    return entry


def verdict(
    key: str, mode: str, target: str, device: str, failing: dict[int, str], ran: Iterable[int] | None = None,
    dtype: str = "float32",
) -> tuple[str, Known | None]:
    """How an op's failures in a mode (`failing`: sample index -> wrong/crash) compare with the
    list, given the sample indices that ran: "ok" (no failure, none expected), "known",
    "unexpected" (not listed, another kind, or another sample than listed), or "stale" (listed,
    but it did not fail)."""
    entry = known_failure(key, mode, target, device, ran, dtype)
    if entry is None:
        return ("unexpected" if failing else "ok"), None
    if not failing:
        return "stale", entry
    kinds_ok = set(failing.values()) <= set(entry.kinds)
    samples_ok = entry.samples is None or set(failing) <= set(entry.samples)
    return ("known" if kinds_ok and samples_ok else "unexpected"), entry
