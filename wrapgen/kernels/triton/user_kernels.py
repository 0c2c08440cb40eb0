"""User-defined Triton kernels as data: the kernel's own source, the `@triton.jit` helpers and
module-level constexprs it reaches, and a small generated launch kernel with wrapgen's usual
signature (pointers and integers only, no constexpr parameters), which calls the user's
kernel with the launch's constants bound to module-level `tl.constexpr` values.

The launch kernel is what lets every target launch a user kernel exactly like a generated
one (Python, FX, and the C++ target through the cubin): Triton inlines the call, so it costs
nothing at run time, and the user's parameter order, defaults and constexprs stay the user's
business. The user's source is copied verbatim (docstrings with triple quotes or backslashes,
non-ASCII text): it is data carried by a KernelDefinition, embedded by each target with
repr() or written to a file, never pasted into a string literal by hand.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field

import torch

from wrapgen.errors import LoweringError

_TRITON_MODULE_PREFIXES = ("triton",)


@dataclass(frozen=True)
class LaunchConfig:
    """One autotune config (or the only launch of a plain kernel): its meta-parameters and
    launch options."""

    kwargs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class UserKernel:
    """A user's kernel as dynamo recorded it: the `@triton.jit` function, its configs (one for
    a plain kernel) and the names of the arguments an autotune key is computed from."""

    name: str
    jit_fn: object
    configs: tuple[LaunchConfig, ...]
    key: tuple[str, ...]
    autotuned: bool
    param_names: tuple[str, ...] = field(default=())
    constexpr_names: frozenset[str] = field(default=frozenset())


def describe(kernel: object) -> UserKernel:
    """What wrapgen needs of a kernel from torch's kernel side table; refuses (naming the
    kernel) what it cannot launch faithfully: heuristics, hooks, multi-CTA configs."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", type(kernel).__name__)
    if isinstance(kernel, JITFunction):
        configs = (LaunchConfig((), 4, 3),)  # Triton's defaults for a plain launch
        jit_fn, key, autotuned = kernel, (), False
    elif isinstance(kernel, Autotuner):
        jit_fn = kernel.fn
        if not isinstance(jit_fn, JITFunction):
            raise LoweringError(f"user Triton kernel {name}: @triton.autotune over {type(jit_fn).__name__} is not supported")
        if getattr(kernel, "user_defined_pre_hook", False) or getattr(kernel, "user_defined_post_hook", False):
            raise LoweringError(f"user Triton kernel {name}: autotune pre_hook/post_hook are not supported")
        configs_list = []
        for config in kernel.configs:
            if getattr(config, "pre_hook", None) is not None:
                raise LoweringError(f"user Triton kernel {name}: a triton.Config with pre_hook is not supported")
            if (getattr(config, "num_ctas", 1) or 1) != 1:
                raise LoweringError(f"user Triton kernel {name}: num_ctas != 1 is not supported")
            configs_list.append(LaunchConfig(tuple(config.kwargs.items()), int(config.num_warps), int(config.num_stages)))
        configs = tuple(configs_list)
        key, autotuned = tuple(kernel.keys), len(configs) > 1
    else:
        raise LoweringError(f"user Triton kernel {name}: {type(kernel).__name__} kernels (e.g. @triton.heuristics) are not supported")
    params = tuple(p.name for p in jit_fn.params)
    constexprs = frozenset(p.name for p in jit_fn.params if p.is_constexpr)
    return UserKernel(jit_fn.__name__, jit_fn, configs, key, autotuned, params, constexprs)


# -- source capture ------------------------------------------------------------------------------
def _code_names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a function's code (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _jit_header(fn: object) -> str:
    return "@triton.jit(noinline=True)" if getattr(fn, "noinline", False) else "@triton.jit"


def constant_expr(value: object, what: str) -> str:
    """Python source (module level) for a launch constant or a global constexpr's value."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return f"float({repr(value)!r})" if not math.isfinite(value) else repr(value)
    if isinstance(value, tl.dtype):
        return f"tl.dtype({value.name!r})"
    raise LoweringError(f"{what}: a constant of type {type(value).__name__} cannot be passed to a Triton kernel")


class _SourceCollector:
    """The module text of a kernel and everything it reaches, each definition once."""

    def __init__(self, kernel_name: str) -> None:
        self.kernel_name = kernel_name
        self.imports: dict[str, str] = {"triton": "import triton", "tl": "import triton.language as tl"}
        self.definitions: list[str] = []
        self.defined: dict[str, object] = {}  # def name -> function object
        self.aliases: list[str] = []

    def add_function(self, fn: object) -> str:
        """Emit `fn` (a JITFunction) and, first, what it reaches; returns its def name."""
        def_name = fn.__name__  # type: ignore[attr-defined]
        if def_name in self.defined:
            if self.defined[def_name] is not fn:
                raise LoweringError(f"user Triton kernel {self.kernel_name}: two different helpers are named {def_name}")
            return def_name
        self.defined[def_name] = fn
        scope = fn.get_capture_scope() if hasattr(fn, "get_capture_scope") else fn.__globals__  # type: ignore[attr-defined]
        names = _code_names(fn.fn.__code__)  # type: ignore[attr-defined]
        for name in sorted(names):
            if name in scope:
                self.add_global(name, scope[name], names)
        self.definitions.append(f"{_jit_header(fn)}\n{fn.src.rstrip()}\n")  # type: ignore[attr-defined]
        return def_name

    def add_global(self, name: str, value: object, names: set[str]) -> None:
        import triton.language as tl
        from triton.runtime.jit import JITFunction

        if isinstance(value, JITFunction):
            def_name = self.add_function(value)
            if def_name != name:
                self.aliases.append(f"{name} = {def_name}")
        elif isinstance(value, types.ModuleType):
            if value.__name__.split(".")[0] in _TRITON_MODULE_PREFIXES or value.__name__ in ("math", "torch"):
                self.imports.setdefault(name, f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}")
            else:
                self.add_user_module(name, value, names)
        elif isinstance(value, tl.constexpr):
            self.aliases.append(f"{name} = tl.constexpr({constant_expr(value, f'global {name}')})")

    def add_user_module(self, name: str, module: types.ModuleType, names: set[str]) -> None:
        """A helper module the kernel uses as `module.helper(...)`: a module object here holding
        the helpers (and constexprs) the kernel reads from it."""
        import triton.language as tl
        from triton.runtime.jit import JITFunction

        members = []
        for attr in sorted(names):
            value = getattr(module, attr, None)
            if isinstance(value, JITFunction):
                members.append(f"{name}.{attr} = {self.add_function(value)}")
            elif isinstance(value, tl.constexpr):
                members.append(f"{name}.{attr} = tl.constexpr({constant_expr(value, f'{name}.{attr}')})")
        self.imports.setdefault("types", "import types")
        self.aliases += [f"{name} = types.ModuleType({module.__name__!r})", *members]

    def text(self) -> str:
        parts = ["# User-defined Triton kernel, captured by wrapgen (source verbatim).", *self.imports.values(), ""]
        parts += self.definitions
        parts += self.aliases
        return "\n".join(parts) + "\n"


def kernel_module_source(kernel: UserKernel) -> str:
    """The user's kernel and everything it reaches, as one module's source."""
    collector = _SourceCollector(kernel.name)
    collector.add_function(kernel.jit_fn)
    return collector.text()


def launch_kernel_source(
    kernel: UserKernel,
    module_source: str,
    launch_name: str,
    runtime_params: tuple[str, ...],
    constants: dict[str, object],
) -> str:
    """`module_source` plus a launch kernel `launch_name(*runtime_params)` that calls the user's
    kernel by keyword: runtime parameters passed through, `constants` bound to constexprs."""
    lines = [module_source, ""]
    call_args = [f"{p}={p}" for p in runtime_params]
    for index, (param, value) in enumerate(constants.items()):
        lines.append(f"_wg_c{index} = tl.constexpr({constant_expr(value, f'user Triton kernel {kernel.name}: argument {param}')})")
        call_args.append(f"{param}=_wg_c{index}")
    lines += [
        "",
        "",
        "@triton.jit",
        f"def {launch_name}({', '.join(runtime_params)}):",
        f"    {kernel.jit_fn.__name__}({', '.join(call_args)})",  # type: ignore[attr-defined]
        "",
    ]
    return "\n".join(lines)


def pointer_type(dtype: torch.dtype, what: str) -> str:
    """The KernelDefinition arg type of a tensor argument."""
    from wrapgen.kernels.triton.runtime import _DTYPES

    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise LoweringError(f"{what}: tensors of dtype {name} are not supported")
    return f"ptr:{name}"
