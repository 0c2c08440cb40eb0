"""Emitters, registry, config, the torch.compile entry point, debug output and the disk cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wrapgen
from wrapgen.backends import PythonEmitter, register_backend
from wrapgen.backends.emitter import Emitter, method_name
from wrapgen.errors import UnsupportedLineError
from wrapgen.wrapper_ir import KernelCall, KernelDefinition, Output


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


class ProfiledEmitter(PythonEmitter):
    """Wraps every library call in a profiler range: one overridden method."""

    def emit_extern_kernel(self, line):
        self.writeline(f"with torch.profiler.record_function({line.op!r}):")
        with self.indent():
            super().emit_extern_kernel(line)


def test_subclassed_emitter_through_config(tmp_path: Path) -> None:
    register_backend("profiled", ProfiledEmitter)
    model, x = mlp(), torch.randn(3, 8)
    with wrapgen.config.patch(target="profiled", matmul_kernel_limit=0):  # the linears stay library calls
        compiled = wrapgen.compile(model, (torch.randn(3, 8),))
    assert compiled.target == "profiled"
    assert "torch.profiler.record_function('aten::addmm.out')" in compiled.source
    with torch.profiler.profile() as prof:
        result = compiled(x)
    torch.testing.assert_close(result, model(x).detach())
    names = {event.name for event in prof.events()}
    assert "aten::addmm.out" in names


def test_register_backend_rejects_non_emitters() -> None:
    with pytest.raises(TypeError, match="subclass of wrapgen.backends.Emitter"):
        register_backend("bogus", object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown target 'nope'; registered targets: .*python"):
        wrapgen.compile(mlp(), (torch.randn(2, 8),), target="nope")


def test_missing_emit_method_names_the_line() -> None:
    class NoKernels(PythonEmitter):
        pass

    program = wrapgen.lower(mlp(), (torch.randn(2, 8),))
    definition = KernelDefinition("k0", "metal", "kernel void k0() {}")  # no device launches Metal
    lines = (*program.lines[:-1], definition, KernelCall("k0", ()), program.lines[-1])
    assert isinstance(lines[-1], Output)
    with pytest.raises(UnsupportedLineError, match=r"cannot emit line \d+ \(kernel k0 \[metal\]"):
        NoKernels().emit(program.with_lines(lines))


def test_method_name() -> None:
    assert method_name(KernelCall) == "emit_kernel_call"
    assert method_name(Output) == "emit_output"
    assert issubclass(PythonEmitter, Emitter)


def test_config_patch_validates_and_restores() -> None:
    before = wrapgen.config.target
    with wrapgen.config.patch(target="python", check_finite=True):
        assert wrapgen.config.check_finite is True
    assert wrapgen.config.target == before and wrapgen.config.check_finite is False
    with pytest.raises(ValueError, match="unknown config option 'targett'"):
        with wrapgen.config.patch(targett="python"):
            pass
    with pytest.raises(TypeError, match="'check_finite' takes a bool"):
        with wrapgen.config.patch(check_finite="yes"):
            pass


def test_target_from_environment() -> None:
    code = "import wrapgen; print(wrapgen.config.target)"
    env = {**os.environ, "WRAPGEN_TARGET": "profiled"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "profiled"


def test_torch_compile_entry_point_without_import(tmp_path: Path) -> None:
    """A fresh interpreter finds backend="wrapgen" through the entry point alone."""
    script = textwrap.dedent(
        """
        import sys, torch
        m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
        f = torch.compile(m, backend="wrapgen", options={"target": "python"})
        x = torch.randn(5, 8)
        with torch.no_grad():
            torch.testing.assert_close(f(x), m(x))
        assert "wrapgen.api" in sys.modules
        print("ok")
        """
    )
    env = {**os.environ, "WRAPGEN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_debug_dir_writes_ir_and_code(tmp_path: Path) -> None:
    with wrapgen.config.patch(debug_dir=str(tmp_path)):
        compiled = wrapgen.compile(mlp(), (torch.randn(2, 8),))
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1
    assert (folders[0] / "program.txt").read_text() == str(compiled.program)
    assert (folders[0] / "code.py").read_text() == compiled.source


def test_emitted_module_is_cached_by_content(tmp_path: Path) -> None:
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        first = wrapgen.compile(mlp(), (torch.randn(2, 8),))
        second = wrapgen.compile(mlp(), (torch.randn(2, 8),))  # other weights, same code
    assert first.artifact.path == second.artifact.path
    assert Path(first.artifact.path).is_relative_to(tmp_path)
    x = torch.randn(2, 8)
    # Same cached file, separate module objects: each keeps its own weights.
    assert not torch.allclose(first(x), second(x))


def test_generated_module_runs_as_a_script() -> None:
    compiled = wrapgen.compile(mlp(), (torch.randn(2, 8),), dynamic=True)
    out = subprocess.run([sys.executable, compiled.artifact.path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("us per call")


def test_python_target_makes_views_of_constants_once() -> None:
    """A static view of a weight (the transpose a matmul reads) is made when the module's constants
    are bound, not on every call; it shares the weight's storage, so in-place updates show."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128, bias=False)).eval()
    x = torch.randn(64, 256)
    with torch.no_grad():
        compiled = wrapgen.compile(model, (x,), target="python")
        body = compiled.source.split("def call(args):")[1].split("def _synchronize")[0]
        binder = compiled.source.split("def _bind_constant_views():")[1].split("def call(args):")[0]
        assert "p_0_weight" in binder and "p_2_weight" in binder
        assert "_reinterpret(p_" not in body  # no per-call view of a parameter left
        torch.testing.assert_close(compiled(x), model(x))
        model[2].weight.mul_(-0.5)
        torch.testing.assert_close(compiled(x), model(x))
        fresh = torch.randn(64, 256)
        torch.testing.assert_close(compiled(fresh), model(fresh))
