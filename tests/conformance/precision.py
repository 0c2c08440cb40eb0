"""The dtypes the suite runs in, and how results in each are compared with eager's.

float32 (the default), bfloat16 and float16. Samples come from the OpInfo for that dtype
(`op.sample_inputs(device, dtype)`), and only ops whose `supported_dtypes(device)` include it
run. Float results are compared with `torch.testing.assert_close`'s defaults for the result's
dtype (float32 1.3e-6 / 1e-5, float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5: rtol / atol),
raised to the OpInfo's own `toleranceOverride` for the sample dtype where it declares one for a
test that compares against eager or a reference (what PyTorch's OpInfo tests use).

Half precision: wrapgen's generated kernels load bf16/fp16 into float32, compute in float32
and round once where they store (README, "bfloat16 and float16"), while eager rounds after
every op it runs as a separate kernel (a decomposed op's intermediates included). A half result
therefore passes when it matches eager *or* the float32 reference within those tolerances: the
same sample run by eager on float32 copies of its half tensors, the results rounded back to the
half dtype. That is the oracle Inductor's own OpInfo tests use on the CPU (`check_model`'s
`reference_in_float`); a result that matches neither is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPE = "float32"
HALF = frozenset({torch.bfloat16, torch.float16})

# assert_close's defaults (torch.testing._comparison), as (rtol, atol).
_DEFAULTS: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}

# OpInfo test classes whose tolerance overrides describe "same op, computed another way,
# compared with eager or a reference" (decomposition, fusion and compiler tests, and the
# reference/consistency tests); overrides for JIT, autograd, DTensor or MPS tests are not ours.
_COMPARABLE_TEST_CLASSES = frozenset(
    {None, "TestCommon", "TestDecomp", "TestEagerFusionOpInfo", "TestInductorOpInfo", "TestUnaryUfuncs",
     "TestBinaryUfuncs", "TestReductions"}
)


def dtype_of(name: str) -> torch.dtype:
    """`"bfloat16"` -> torch.bfloat16 (a clear error for a dtype the suite does not run)."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; the suite runs {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _DEFAULTS.get(dtype, _DEFAULTS[torch.float32])


def op_tolerance(op: Any, device_type: str, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for the op's float results in `dtype`: assert_close's defaults for it,
    raised to the OpInfo's `toleranceOverride` for `dtype` in comparable tests."""
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    rtol, atol = default_tolerance(dtype)
    for info in op.decorators:
        if not isinstance(info, DecorateInfo) or not info.active_if:
            continue
        if info.cls_name not in _COMPARABLE_TEST_CLASSES or "mps" in (info.test_name or ""):
            continue
        if info.device_type not in (None, device_type) or (info.dtypes is not None and dtype not in info.dtypes):
            continue
        for decorator in info.decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                rtol, atol = max(rtol, decorator.d[dtype].rtol), max(atol, decorator.d[dtype].atol)
    return rtol, atol


def upcast(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """float32 copies of the `dtype` tensors, their whole storage converted, so sizes, strides,
    offsets and overlaps (expanded inputs) are as they were; the others as they are."""
    out = []
    for t in tensors:
        if t.dtype == dtype and t.layout == torch.strided and not t.is_nested:
            storage = t.untyped_storage()
            flat = torch.empty((0,), dtype=dtype, device=t.device)
            flat.set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
            wide = torch.empty((0,), dtype=torch.float32, device=t.device)
            wide.set_(flat.float().untyped_storage(), t.storage_offset(), t.size(), t.stride())
            t = wide
        out.append(t)
    return out


def round_like(value: Any, like: Any, dtype: torch.dtype) -> Any:
    """`value` (a float32 run's result) with each float32 tensor rounded to `dtype` where the
    eager result `like` holds a `dtype` tensor; None when the structures differ."""
    leaves, spec = pytree.tree_flatten(value)
    like_leaves, like_spec = pytree.tree_flatten(like)
    if spec != like_spec:
        return None
    rounded = []
    for v, e in zip(leaves, like_leaves):
        if isinstance(v, torch.Tensor) and isinstance(e, torch.Tensor) and e.dtype == dtype and v.dtype == torch.float32:
            v = v.to(dtype)
        elif isinstance(v, float) and isinstance(e, float):
            v = float(torch.tensor(v).to(dtype).item())
        rounded.append(v)
    return pytree.tree_unflatten(rounded, spec)


def float_reference(
    call: Callable[..., Any], inputs: Sequence[torch.Tensor], expected: tuple[Any, list], dtype: torch.dtype
) -> tuple[Any, list] | None:
    """The sample run on float32 copies of its `dtype` tensors, rounded back like eager's
    result `expected` (outputs, inputs after the call); None when that cannot be done (the op
    refuses float32 there, or the results do not line up with eager's)."""
    if dtype not in HALF:
        return None
    try:
        wide = upcast(inputs, dtype)
        torch.manual_seed(0)
        with torch.no_grad():
            output = call(*wide)
    except Exception:
        return None
    output = round_like(output, expected[0], dtype)
    after = round_like(list(wide), expected[1], dtype)
    return None if output is None or after is None else (output, after)
