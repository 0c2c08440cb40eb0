"""What both routes of an extern call share: the C++ lines a call becomes, the refusal a route
raises when it cannot express a call, and questions about an operator's schema types."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

INTEGRAL_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class CannotExpress(ValueError):
    """This route cannot express the call (the caller tries the next one or refuses the line)."""


@dataclass
class CallCode:
    """The C++ lines of one call and the shim functions it uses."""

    lines: list[str] = field(default_factory=list)
    shims: set[str] = field(default_factory=set)


def overload_parts(op: str) -> tuple[str, str, str]:
    """`aten::addmm.out` -> ("aten", "addmm", "out")."""
    namespace, rest = op.split("::", 1)
    name, _, overload = rest.partition(".")
    return namespace, name, overload or "default"


def jit_kind(t: torch._C.JitType) -> str:
    return t.kind()


def is_number_type(t: torch._C.JitType) -> bool:
    kind = jit_kind(t)
    if kind in ("OptionalType", "ListType"):
        return is_number_type(t.getElementType())
    return kind == "NumberType"
