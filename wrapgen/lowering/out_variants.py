"""Find an ATen op's `out=` overload, so its results can go into buffers the program allocates."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Ops whose out= overload is known not to agree with the functional op in this use.
_DENYLIST: frozenset[str] = frozenset(
    {
        "aten::_to_copy",  # out= ignores the requested memory format/device semantics
        "aten::lift_fresh_copy",
        "aten::empty_strided",
        "aten::empty",
        "aten::empty_like",
        "aten::new_empty_strided",
        "aten::bernoulli",  # random ops: keep the exact functional call
        "aten::native_dropout",
        "aten::rand",
        "aten::randn",
        "aten::rand_like",
        "aten::randn_like",
        "aten::randint",
        # FFTs: the CUDA out= kernels run the transform unscaled and scale it with mul_out into
        # `out`, where the functional op scales its own result in place; for float16 samples
        # (complex32 results) the two round differently (1-2 ulp off eager for norm="ortho").
        "aten::_fft_r2c",
        "aten::_fft_c2c",
        "aten::_fft_c2r",
    }
)


@dataclass(frozen=True)
class OutVariant:
    """The out= overload of a functional op and the keyword names of its out arguments."""

    op: torch._ops.OpOverload
    out_names: tuple[str, ...]


def _signature(schema: torch._C.FunctionSchema) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, str(a.type)) for a in schema.arguments if not _is_out_arg(a))


def _is_out_arg(argument: torch._C.Argument) -> bool:
    return bool(argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write)


def is_functional(op: torch._ops.OpOverload) -> bool:
    """True when the op neither mutates nor aliases its arguments."""
    schema = op._schema
    if any(a.alias_info is not None for a in schema.arguments):
        return False
    return not any(r.alias_info is not None for r in schema.returns)


# The dispatch key whose kernel runs an op for tensors of a device type.
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}


def has_real_kernel(op: torch._ops.OpOverload, device_type: str) -> bool:
    """True when `op` has its own kernel for the device (or decomposes into ops that do).

    Many out= overloads only have the generated CompositeExplicitAutograd wrapper, which runs
    the functional op into a temporary and copies it into `out`: slower than the plain op
    and heavier on memory, so those are not worth calling.
    """
    name = f"{op._schema.name}.{op._overloadname}" if op._overloadname != "default" else op._schema.name
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    key = _BACKEND_KEYS.get(device_type)
    return (key is not None and has_kernel(name, key)) or has_kernel(name, "CompositeImplicitAutograd")


@functools.cache
def find_out_variant(op: torch._ops.OpOverload, device_type: str) -> OutVariant | None:
    """The overload of `op`'s packet that is `op` plus keyword-only out tensors, if one exists
    with a real kernel for `device_type`."""
    schema = op._schema
    if schema.name in _DENYLIST or not is_functional(op) or not schema.returns:
        return None
    if any(str(r.type) != "Tensor" for r in schema.returns):
        return None
    wanted = _signature(schema)
    packet = op.overloadpacket
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        cand_schema = candidate._schema
        outs = [a for a in cand_schema.arguments if _is_out_arg(a)]
        if len(outs) != len(schema.returns) or any(str(a.type) != "Tensor" for a in outs):
            continue
        if _signature(cand_schema) == wanted:
            if not has_real_kernel(candidate, device_type):
                return None
            return OutVariant(candidate, tuple(a.name for a in outs))
    return None
