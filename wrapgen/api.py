"""The public entry points: `lower`, `compile`, and `build` (Program -> runnable artifact)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from wrapgen import config, debug
from wrapgen.backends.emitter import CompiledArtifact
from wrapgen.backends.registry import get_backend
from wrapgen.compiled import CompiledFunction
from wrapgen.errors import LoweringError
from wrapgen.kernels.triton.runtime import start_workers_early
from wrapgen.lowering.capture import CapturedGraph, capture
from wrapgen.lowering.lower import lower_captured
from wrapgen.size_hints import ExampleSizeProgram, flat_example, symbolic_products
from wrapgen.specialize import SizeSpecializations
from wrapgen.wrapper_ir.passes import add_finite_checks, partition_graphs, plan_memory, schedule_collectives
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.verify import verify


def _check_arguments(model: object, example_inputs: object, dynamic: object) -> tuple:
    if not callable(model):
        raise TypeError(f"model must be an nn.Module, a function or an fx.GraphModule, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (list, tuple)):
        raise TypeError(
            f"example_inputs must be a tuple or list of inputs, got {type(example_inputs).__name__}"
            " (wrap a single tensor as (x,))"
        )
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    return tuple(example_inputs)


def _capture(model: object, example_inputs: object, dynamic: object) -> CapturedGraph:
    inputs = _check_arguments(model, example_inputs, dynamic)
    first_parameter = next(iter(model.parameters()), None) if isinstance(model, torch.nn.Module) else None
    start_workers_early([*inputs, first_parameter])  # they start while torch.export traces
    return capture(model, inputs, bool(dynamic))


def lower(model: Callable | torch.nn.Module, example_inputs: Sequence[Any], dynamic: bool = False) -> Program:
    """Trace `model` and return its verified Wrapper IR program (`str(program)` is the IR text)."""
    return verify(lower_captured(_capture(model, example_inputs, dynamic)))


def resolve_target(target: str | None) -> str:
    name = config.target if target is None else target
    if not isinstance(name, str):
        raise TypeError(f"target must be a string, got {type(name).__name__}")
    get_backend(name)  # raises ValueError naming the registered targets
    return name


def optimize(program: Program, target: str | None = None) -> Program:
    """The configured passes, then the verifier: what every emitter is handed.

    `target` picks the CUDA-graph rule for library ops (`cuda_graphs`); the program's static
    inputs (parameters under torch.compile) are used in place by its graphs."""
    config.snapshot()
    if config.check_finite:
        program = add_finite_checks(program)
    program = schedule_collectives(verify(program), config.overlap_collectives)
    program = plan_memory(verify(program), config.memory_planning)
    if config.cuda_graphs and not config.sanitize:  # the sanitizer's checks read memory on the host
        program = partition_for_target(verify(program), target)
    return verify(program)


def partition_for_target(program: Program, target: str | None) -> Program:
    """The graph-partition pass with the target's rule for which library ops a graph may hold."""
    emitter = get_backend(resolve_target(target))
    return partition_graphs(program, program.static_input_names(),
                            blocker=getattr(emitter, "cuda_graph_op_blocker", None))


def _emit(program: Program, target: str) -> CompiledArtifact:
    return _start_emit(program, target)()


def _start_emit(program: Program, target: str) -> Callable[[], CompiledArtifact]:
    """Emit `program` for `target` now; the returned step makes it runnable (Emitter.start_compile)."""
    finish = get_backend(target)().compile_in_steps(program)
    folder = debug.dump_folder(program, target)

    def runnable() -> CompiledArtifact:
        artifact = finish()
        debug.dump(program, target, artifact, folder)
        return artifact

    return runnable


def build(program: Program, target: str | None = None) -> CompiledArtifact:
    """Optimize and verify `program`, then compile it for `target` (default config.target)."""
    name = resolve_target(target)
    return _emit(optimize(program, name), name)


def compile(
    model: Callable | torch.nn.Module,
    example_inputs: Sequence[Any],
    target: str | None = None,
    dynamic: bool = False,
) -> CompiledFunction:
    """Compile `model` for `target`; the result is called like `model` and returns eager's structure.

    With `dynamic=True` it serves every size: sizes >= 2 through the one dynamic program, and a
    call with a dynamic size of 0 or 1 through a program traced at that call's sizes on first use;
    with `max_autotune` also, calls at the example's sizes through a program whose matrix
    products were measured there (wrapgen/size_hints.py).
    """
    name = resolve_target(target)
    captured = _capture(model, example_inputs, dynamic)
    compiled = _compile_captured(captured, name)
    if dynamic and captured.traced:
        build = _specializer(model, name, config.snapshot(), torch.is_grad_enabled())
        compiled.specializations = SizeSpecializations(compiled.program, build)
        if config.max_autotune and symbolic_products(compiled.program):
            compiled.at_hints = _compile_at_hints(model, tuple(example_inputs), name)
    return compiled


def _compile_at_hints(model: object, example_inputs: tuple, target: str) -> ExampleSizeProgram | None:
    """The model compiled static at the example's sizes, its products measured there; None (with
    a warning naming why) when that fails: the dynamic program serves every call then."""
    try:
        static = _compile_captured(capture(model, example_inputs, dynamic=False), target, "forward_at_hints")
    except LoweringError as err:
        warnings.warn(f"max_autotune: no program at the example's sizes ({err}); every call runs the dynamic "
                      "program and its library matrix products", stacklevel=3)
        return None
    return ExampleSizeProgram(static, flat_example(example_inputs))


def _compile_captured(captured: CapturedGraph, target: str, name: str = "forward") -> CompiledFunction:
    program = optimize(lower_captured(captured, name), target)
    artifact = _emit(program, target)
    return CompiledFunction(program, artifact, target, captured.in_spec, captured.out_spec, captured.output_kind)


def _specializer(
    model: object, target: str, settings: dict[str, Any], grad: bool
) -> Callable[[tuple], CompiledFunction]:
    """Compiles `model` again for one call's arguments, as the first compile did (options, grad mode)."""

    def build(args: tuple) -> CompiledFunction:
        with config.patch(settings), torch.set_grad_enabled(grad):
            return _compile_captured(capture(model, args, dynamic=True), target, "forward_specialized")

    return build
