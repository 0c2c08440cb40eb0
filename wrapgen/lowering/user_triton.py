"""Lowering of user-defined Triton kernels: the `triton_kernel_wrapper_functional` and
`triton_kernel_wrapper_mutation` higher-order ops that dynamo, `torch.library.triton_op` and
`wrap_triton` leave in a graph.

Each launch becomes a `KernelDefinition` per config (the user's source as data, see
`kernels/triton/user_kernels.py`) and a `KernelCall`, or, for an autotuned kernel, a
`MultiKernelCall` among the configs' kernels, chosen per autotune key at run time. Every
buffer the kernel may write is declared as written, so memory planning and the verifier see
it. The functional op's "clone, then launch on the clones" is kept where the original is
still read later (a program input, a value used after the launch); where the launch is the
value's last reader, the kernel writes it in place, as Inductor's reinplacing does.
"""

from __future__ import annotations

import hashlib
import inspect

import sympy
import torch
import torch.fx

from wrapgen.errors import LoweringError
from wrapgen.kernels.triton.user_kernels import (
    UserKernel,
    describe,
    kernel_module_source,
    launch_kernel_source,
    pointer_type,
)
from wrapgen.wrapper_ir.lines import Allocate, ExternKernel, KernelCall, KernelDefinition, Reinterpret, WrapperLine
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall
from wrapgen.wrapper_ir.values import Arg, TensorRef

# Ops that read only a tensor's metadata: a value they use may still be written in place.
_METADATA_READERS = frozenset({
    "aten::empty_like", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
})


def user_triton_ops() -> tuple[object, ...]:
    """The higher-order ops that launch a user's Triton kernel (none where torch lacks them)."""
    try:
        from torch._higher_order_ops.triton_kernel_wrap import (
            triton_kernel_wrapper_functional,
            triton_kernel_wrapper_mutation,
        )
    except ImportError:
        return ()
    return (triton_kernel_wrapper_functional, triton_kernel_wrapper_mutation)


def triton_op_decomposition() -> dict[str, bool]:
    """run_decompositions options that open `torch.library.triton_op`s into their kernel launches
    (torch.export keeps them whole by default), where this torch has the option."""
    parameters = inspect.signature(torch.export.ExportedProgram.run_decompositions).parameters
    return {"decompose_custom_triton_ops": True} if "decompose_custom_triton_ops" in parameters else {}


def is_user_triton(target: object) -> bool:
    return any(target is op for op in user_triton_ops())


def _is_functional(target: object) -> bool:
    ops = user_triton_ops()
    return bool(ops) and target is ops[0]


class _Launch:
    """The pieces of one user-kernel launch, gathered from the node."""

    def __init__(self, lowering, node: torch.fx.Node, kernel: UserKernel) -> None:
        self.lowering, self.node, self.kernel = lowering, node, kernel
        self.params: list[str] = []  # runtime parameters, in the kernel's parameter order
        self.args: list[Arg] = []
        self.types: list[str] = []
        self.constants: dict[str, object] = {}
        self.written: list[str] = []
        self.results: dict[str, object] = {}
        self.device: torch.device | None = None

    def refuse(self, reason: str) -> LoweringError:
        return LoweringError(f"node {self.node.name}: user Triton kernel {self.kernel.name}: {reason}")


def lower_user_triton(lowering, node: torch.fx.Node) -> object:
    """Lower one launch; returns {parameter: Buffer} for the functional op (what its getitems
    pick), None for the mutation op."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kwargs = node.kwargs
    kernel = describe(kernel_side_table.get_kernel(kwargs["kernel_idx"]))
    launch = _Launch(lowering, node, kernel)
    if kwargs.get("tma_descriptor_metadata"):
        raise launch.refuse("TMA descriptor arguments are not supported")
    functional = _is_functional(node.target)
    to_clone = set(kwargs.get("tensors_to_clone", ())) if functional else None
    values = dict(kwargs["kwargs"])
    constants = dict(kernel_side_table.get_constant_args(kwargs["constant_args_idx"]))
    for param in kernel.param_names:
        if param in values:
            _lower_argument(launch, param, values[param], to_clone)
        elif param in constants:
            launch.constants[param] = constants[param]
    unknown = (set(values) | set(constants)) - set(kernel.param_names)
    if unknown:
        raise launch.refuse(f"arguments {sorted(unknown)} are not parameters of the kernel")
    grids = [_grid(launch, grid) for grid in kwargs["grid"]]
    if len(grids) != len(kernel.configs):
        raise launch.refuse(f"{len(grids)} launch grids for {len(kernel.configs)} configs")
    _emit(launch, grids, kwargs["kernel_idx"])
    return launch.results if functional else None


def _lower_argument(launch: _Launch, param: str, value: object, to_clone: set[str] | None) -> None:
    lowering = launch.lowering
    fake = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
    if isinstance(fake, torch.Tensor):
        buffer = _tensor_argument(launch, param, value, fake, to_clone)  # type: ignore[arg-type]
        launch.params.append(param)
        launch.args.append(TensorRef(buffer.name))
        launch.types.append(pointer_type(fake.dtype, f"user Triton kernel {launch.kernel.name}: argument {param}"))
        if launch.device is None:
            launch.device = fake.device
        return
    if isinstance(fake, bool) or fake is None or isinstance(fake, (float, str)):
        launch.constants[param] = fake
        return
    if isinstance(fake, (int, torch.SymInt)):
        expr = lowering.to_arg(value)
        if isinstance(expr, sympy.Basic) and not expr.is_Integer:
            launch.params.append(param)
            launch.args.append(expr)
            launch.types.append("int64")
            return
        number = int(expr)  # type: ignore[arg-type]
        launch.params.append(param)
        launch.args.append(number)
        launch.types.append("int32" if -(2**31) <= number < 2**31 else "int64")
        return
    raise launch.refuse(f"argument {param} is a {type(fake).__name__}, which cannot be passed to the kernel")


def _tensor_argument(launch: _Launch, param: str, value: torch.fx.Node, fake: torch.Tensor, to_clone: set[str] | None):
    """The buffer the kernel gets for a tensor argument: the value itself, or a copy with the
    traced layout where the kernel writes a value that is read later (functional op) or where
    the value's layout is not known at compile time."""
    lowering = launch.lowering
    lowering.to_arg(value)  # materializes a value the kernel lowering holds as a loop body
    buffer = lowering.values[value]
    if not hasattr(buffer, "fixed_layout"):  # a Buffer (graph_lowering imports this module)
        raise launch.refuse(f"argument {param} is not a tensor buffer")
    written = to_clone is None or param in to_clone
    wanted = lowering.tensor_type(fake)
    layout_known = buffer.fixed_layout and buffer.type.strides == wanted.strides and buffer.type.sizes == wanted.sizes
    in_place = to_clone is None or (written and _last_reader(lowering, value, launch.node, buffer))
    if layout_known and (not written or in_place):
        result = buffer
    else:
        name = lowering.fresh()
        lowering.lines.append(Allocate(name, wanted))
        lowering.lines.append(
            ExternKernel(None, "aten::copy_.default", (TensorRef(name), TensorRef(buffer.name)), (), None, (name,))
        )
        result = type(buffer)(name, wanted, name, sympy.Integer(0), True)
        if to_clone is None and written:
            raise launch.refuse(f"argument {param} has a layout chosen at run time and the kernel may write it in place")
    if written:
        launch.written.append(result.name)
    launch.results[param] = result
    return result


def _last_reader(lowering, value: torch.fx.Node, launch_node: torch.fx.Node, buffer) -> bool:
    """Whether the launch may write `value` in place: the program owns its storage (not an
    input, constant or view) and nothing but the launch reads its data."""
    if buffer.root != buffer.name or buffer.name in lowering.tensor_inputs:
        return False
    if any(getattr(c, "name", None) == buffer.name for c in lowering.folded):
        return False
    if any(isinstance(line, Reinterpret) and line.source == buffer.name for line in lowering.lines):
        return False  # a view of it may be read later
    for user in value.users:
        if user is launch_node:
            continue
        target = user.target
        schema = getattr(getattr(target, "_schema", None), "name", None)
        if schema not in _METADATA_READERS:
            return False
    return value.op == "call_function"


def _grid(launch: _Launch, grid: object) -> tuple[sympy.Expr, ...]:
    items = tuple(grid) if isinstance(grid, (list, tuple)) else (grid,)
    if not 1 <= len(items) <= 3:
        raise launch.refuse(f"a launch grid has 1 to 3 dimensions, got {len(items)}")
    exprs = []
    for item in items:
        value = launch.lowering.to_arg(item) if isinstance(item, (torch.fx.Node, torch.SymInt)) else item
        if isinstance(value, bool) or not isinstance(value, (int, sympy.Basic)):
            raise launch.refuse(f"launch grid entry {item!r} is not an integer the program can compute")
        expr = sympy.sympify(value)
        if not (expr.is_integer or expr.is_Integer):
            raise launch.refuse(f"launch grid entry {expr} is not an integer expression")
        exprs.append(expr)
    return tuple(exprs) + (sympy.Integer(1),) * (3 - len(exprs))


def _emit(launch: _Launch, grids: list[tuple[sympy.Expr, ...]], kernel_idx: int) -> None:
    lowering, kernel = launch.lowering, launch.kernel
    if launch.device is None:
        raise launch.refuse("the kernel takes no tensor argument, so its device is unknown")
    module_source = kernel_module_source(kernel)
    allocated = {line.name for line in lowering.lines if isinstance(line, Allocate)}
    unaligned = tuple(p for p, a in zip(launch.params, launch.args) if isinstance(a, TensorRef) and a.name not in allocated)
    calls: list[KernelCall] = []
    lines: list[WrapperLine] = []
    for index, (config, grid) in enumerate(zip(kernel.configs, grids)):
        name = lowering.claim(f"user_{kernel.name}_{index}" if len(kernel.configs) > 1 else f"user_{kernel.name}")
        constants = {**launch.constants, **dict(config.kwargs)}
        constants = {p: constants[p] for p in kernel.param_names if p in constants}
        source = launch_kernel_source(kernel, module_source, name, tuple(launch.params), constants)
        metadata = (
            ("device", str(launch.device)),
            ("arg_names", tuple(launch.params)),
            ("arg_types", tuple(launch.types)),
            ("num_warps", config.num_warps),
            ("num_stages", config.num_stages),
            ("unaligned", unaligned),
            ("user_kernel", kernel.name),
        )
        lines.append(KernelDefinition(name, "triton", source, metadata))
        calls.append(KernelCall(name, tuple(launch.args), grid, tuple(launch.written)))
    if len(calls) == 1:
        lines.append(calls[0])
    else:
        lines.append(MultiKernelCall(_choice_name(launch, kernel_idx), tuple(calls), _autotune_key(launch), "autotune"))
    lowering.lines.extend(lines)


def _autotune_key(launch: _Launch) -> tuple[Arg, ...]:
    """The values Triton's autotuner keys on that can change between calls of this program."""
    by_param = dict(zip(launch.params, launch.args))
    key: list[Arg] = []
    for name in launch.kernel.key:
        value = by_param.get(name)
        if value is not None and not isinstance(value, TensorRef):
            key.append(value)
        elif name in launch.constants and isinstance(launch.constants[name], (int, bool)):
            key.append(int(launch.constants[name]))  # type: ignore[arg-type]
    return tuple(key)


def _choice_name(launch: _Launch, kernel_idx: int) -> str:
    """Launches of one kernel with the same argument types share their choices (per key), as
    the calls of one Triton autotuner share its cache."""
    signature = f"{kernel_idx}|{launch.params}|{launch.types}|{sorted(launch.constants.items(), key=str)}"
    digest = hashlib.sha256(signature.encode()).hexdigest()[:8]
    base = "".join(c if c.isalnum() else "_" for c in launch.kernel.name)
    return f"autotune_{base}_{digest}"
