"""C++ for collective lines, through torch's stable C shim only. Per line, the first route
that the installed torch offers:

1. A C shim function of the collective (`aoti_torch_cpu__c10d_functional_all_reduce`,
   `..._wait_tensor` in `aoti_torch/c/shim_cpu.h`: torch 2.11 and 2.13 have these three,
   all_reduce, all_reduce_ and wait_tensor, for the CPU), called with the group name as a
   C string.
2. `aoti_torch_call_dispatcher` with the functional collective itself, when its schema
   takes the group name as a `str` (torch 2.11: `all_gather_into_tensor(Tensor input, int
   group_size, str group_name)`): a StableIValue carries the string.
3. `aoti_torch_call_dispatcher` with wrapgen's forwarding op (`wrapgen_c10d::<collective>`,
   the same arguments with a `str` group name), when the collective's schema takes it as
   `Any` (torch 2.13), which no StableIValue can carry. `register_forwarding_ops` defines
   those ops from Python; a library that calls them lists them in its metadata
   (`wrapgen_ops`), and the loader registers them before the first call.

In every route the process group is looked up by its name when the line runs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch

from wrapgen.backends.cpp.call_code import CallCode, CannotExpress, jit_kind
from wrapgen.backends.cpp.exprs import cpp_int, cpp_string
from wrapgen.backends.cpp.extern import ExternWriter
from wrapgen.backends.runtime import resolve_op
from wrapgen.wrapper_ir.collectives import COLLECTIVES, WAIT_OP, CollectiveStart, CollectiveWait
from wrapgen.wrapper_ir.lines import ExternKernel
from wrapgen.wrapper_ir.values import TensorRef

FORWARDING_NAMESPACE = "wrapgen_c10d"
_PARAMETERS = {"reduce_op": "str reduce_op", "group_size": "int group_size"}
_library: torch.library.Library | None = None


@functools.cache
def collective_shims(device_type: str) -> dict[str, tuple[str, ...]]:
    """`aoti_torch_<device>__c10d_functional_*` functions of `aoti_torch/c/shim_<device>.h`, with
    their parameter names."""
    path = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor" / "aoti_torch" / "c" / f"shim_{device_type}.h"
    if not path.exists():
        return {}
    text = path.read_text()
    pattern = rf"AOTI_TORCH_EXPORT AOTITorchError (aoti_torch_{device_type}__c10d_functional_\w+)\(([^)]*)\);"
    return {
        name: tuple(part.strip().rpartition(" ")[2].lstrip("*") for part in params.split(","))
        for name, params in re.findall(pattern, text)
    }


def group_name_is_str(op: str) -> bool:
    """Whether the op's schema takes its group name as a `str` (a StableIValue can carry it)."""
    schema = resolve_op(op)._schema
    return any(a.name == "group_name" and jit_kind(a.real_type) == "StringType" for a in schema.arguments)


def register_forwarding_ops() -> None:
    """Define `wrapgen_c10d::<collective>` (group name as `str`), forwarding to `_c10d_functional`."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library(FORWARDING_NAMESPACE, "DEF")
    for name, extra in COLLECTIVES.items():
        parameters = ", ".join(["Tensor input", *(_PARAMETERS[e] for e in extra), "str group_name"])
        library.define(f"{name}({parameters}) -> Tensor")
        library.impl(name, _forwarder(getattr(torch.ops._c10d_functional, name).default), "CompositeExplicitAutograd")
    _library = library


def _forwarder(op: torch._ops.OpOverload):
    def forward(*args: object) -> torch.Tensor:
        return op(*args)  # the work stays registered for the result: wait_tensor finds it

    return forward


class CollectiveWriter:
    """Writes the C++ of CollectiveStart / CollectiveWait lines of one program."""

    def __init__(self, externs: ExternWriter) -> None:
        self.externs = externs
        self.forwarded: set[str] = set()  # wrapgen_c10d ops the library calls

    def start(self, line: CollectiveStart) -> CallCode:
        device = line.type.device.type
        shim = f"aoti_torch_{device}__c10d_functional_{line.collective}"
        params = collective_shims(device).get(shim)
        if params is not None:
            values = dict(zip(("inp", *COLLECTIVES[line.collective], "group_name"), line.op_args()))
            args = []
            for param in params[:-1]:
                value = values.get(param)
                if isinstance(value, TensorRef):
                    args.append(f"t_{value.name}.get()")
                elif isinstance(value, str):
                    args.append(cpp_string(value))
                elif isinstance(value, int):
                    args.append(cpp_int(value))
                else:
                    raise CannotExpress(f"{shim} takes a parameter {param!r} the line does not give")
            return _shim_call(shim, args, f"t_{line.name} = wrapgen::Tensor(ret);")
        op = line.op
        if not group_name_is_str(op):
            register_forwarding_ops()
            op = f"{FORWARDING_NAMESPACE}::{line.collective}.default"
            self.forwarded.add(op)
        return self.externs.write(ExternKernel(line.name, op, line.op_args(), result=line.type))

    def wait(self, line: CollectiveWait, device_type: str) -> CallCode:
        shim = f"aoti_torch_{device_type}__c10d_functional_wait_tensor"
        if shim in collective_shims(device_type):
            # wait_tensor hands back the same tensor: the extra reference is dropped at once
            return _shim_call(shim, [f"t_{line.name}.get()"], "wrapgen::Tensor(ret).reset();")
        return self.externs.write(ExternKernel(None, WAIT_OP, (TensorRef(line.name),)))


def _shim_call(shim: str, args: list[str], take: str) -> CallCode:
    call = f"wrapgen::check({shim}({', '.join([*args, '&ret'])}), {cpp_string(shim)});"
    return CallCode(lines=["AtenTensorHandle ret = nullptr;", call, take], shims={shim})


__all__ = ["FORWARDING_NAMESPACE", "CollectiveWriter", "collective_shims", "group_name_is_str", "register_forwarding_ops"]
