"""How the C++ target's wrapper compiles fast: the runtime helpers are compiled once per cache
into an object every model links (the wrapper unit only declares them), the run function is
host glue compiled unoptimized, and a GPU kernel table is constant-initialized data. Header-only
use of the runtime (the Python module, the standalone runner) keeps the inline definitions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import wrapgen
from wrapgen.backends.cpp import build as cpp_build
from wrapgen.kernels.cpp import build as kernel_build

needs_nm = pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")


def _symbols(obj: Path) -> dict[str, str]:
    """Demangled symbol -> nm's type letter, for the symbols `obj` defines."""
    out = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            symbols[parts[2]] = parts[1]
    return symbols


def _defines(obj: Path, prefix: str) -> bool:
    return any(name.startswith(prefix) for name in _symbols(obj))


@needs_nm
def test_runtime_helpers_compile_once_per_cache_and_wrappers_only_declare_them(tmp_path) -> None:
    """A cache's first model compiles the helpers inline (one model does not pay for the runtime
    object); from the second on, models link the runtime object, made once."""
    commands: list[tuple[str, list[str]]] = []
    run = kernel_build._run

    def record(cmd, what, source=None):
        commands.append((what, list(cmd)))
        run(cmd, what, source)

    x = torch.randn(4, 8)
    models = [lambda t: torch.relu(t) * 2, lambda t: torch.tanh(t) - 1, lambda t: torch.sigmoid(t) + 3]
    with wrapgen.config.patch(cache_dir=str(tmp_path)), pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_build, "_run", record)
        for model in models:
            compiled = wrapgen.compile(model, (x,), target="cpp")
            torch.testing.assert_close(compiled(x), model(x))
        # an input check, now out of line, still raises naming the input
        with pytest.raises(Exception, match="input .*expected shape"):
            compiled(torch.randn(5, 8))
    runtime = [cmd for what, cmd in commands if what == "compiling the C++ runtime"]
    wrappers = [cmd for what, cmd in commands if what == "compiling the C++ wrapper"]
    assert len(runtime) == 1 and len(wrappers) == 3, [what for what, _ in commands]
    first, *later = wrappers
    assert "-UWRAPGEN_RUNTIME_LINKED" in first and _defines(Path(first[first.index("-c") + 1]).with_suffix(".o"),
                                                             "wrapgen::check_input(")
    assert all("-UWRAPGEN_RUNTIME_LINKED" not in cmd for cmd in later + runtime)
    runtime_obj = Path(runtime[0][runtime[0].index("-o") + 1]).parent
    objects = sorted(runtime_obj.glob("runtime_*.o"))
    assert len(objects) == 1 and _defines(objects[0], "wrapgen::check_input(")
    for cmd in later:
        source = Path(cmd[cmd.index("-c") + 1])
        unit = source.with_suffix(".o")
        assert not _defines(unit, "wrapgen::check_input("), "the wrapper compiled a runtime helper"
        assert not _defines(unit, "wrapgen::empty_strided(")


def test_run_function_is_compiled_unoptimized() -> None:
    """The program's run function is straight-line host glue: the source compiles it at -O0
    (GCC and clang pragmas) and restores the unit's options right after it."""
    model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.no_grad():
        source = wrapgen.compile(model, (x,), target="cpp").artifact.source
    start = source.index("void run_program(")
    assert '#pragma GCC optimize("O0")' in source[:start] and "#pragma clang optimize off" in source[:start]
    end = source.index("}  // namespace", start)
    assert "#pragma GCC pop_options" in source[start:end] and "#pragma clang optimize on" in source[start:end]
    assert source.index("extern \"C\"", end) > end  # the exported entry points keep the unit's -O1


@needs_nm
def test_header_only_use_keeps_inline_definitions(tmp_path) -> None:
    """Without WRAPGEN_RUNTIME_LINKED (the Python module, the standalone runner) runtime.h
    defines its helpers inline, so such a unit links without the runtime object."""
    source = tmp_path / "probe.cpp"
    source.write_text(
        '#include "wrapgen/runtime.h"\n'
        "void wg_probe(const wrapgen::Tensor& t) {\n"
        '  wrapgen::check_input("x", t, 0, -1, -1, {1}, {1}, {true});\n'
        "  wrapgen::Stack st(1);\n"
        "}\n"
    )
    flags = [f for f in cpp_build.WRAPPER_FLAGS if f != "-DWRAPGEN_RUNTIME_LINKED"]
    obj = tmp_path / "probe.o"
    subprocess.run([kernel_build.CXX, *flags, *cpp_build._includes(), "-c", str(source), "-o", str(obj)], check=True)
    symbols = _symbols(obj)
    assert any(name.startswith("wrapgen::check_input(") and kind == "W" for name, kind in symbols.items())
    assert any(name.startswith("wrapgen::Stack::~Stack()") for name in symbols)


@needs_nm
@pytest.mark.parametrize("lazy_unaligned", [False, True])
def test_gpu_kernel_table_is_constant_initialized(tmp_path, monkeypatch, lazy_unaligned) -> None:
    """The kernel table compiles to initialized data (no start-up code per kernel): built on a
    machine without a GPU from stand-in binaries, with the CUDA flags. A lazy table (a model
    loaded in-process) declares the unaligned variants without binaries, compiles none of them,
    and exports the setter of the resolver that compiles them on first use."""
    from wrapgen.backends.cpp import gpu_kernels
    from wrapgen.kernels.triton import runtime as triton_runtime
    from wrapgen.wrapper_ir.lines import KernelDefinition

    def fake_binaries(kernels, unaligned_too=True):
        binary = SimpleNamespace(function_name="triton_fn", image=b"\x7fELF stand-in", shared_bytes=0, num_warps=4,
                                 scratch_params=1)
        return {name: (binary, binary if unaligned_too and "unaligned" in dict(meta) else None)
                for name, _, meta in kernels}

    monkeypatch.setattr(triton_runtime, "kernel_binaries", fake_binaries)
    kernels = [KernelDefinition(f"triton_k{i}", "triton", "# stand-in", (("unaligned", ("in_ptr0",)),) if i % 2 else ())
               for i in range(6)]
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        text = gpu_kernels.kernel_table_source(kernels, lazy_unaligned=lazy_unaligned)
        flags = ("-DUSE_CUDA",)
        obj = cpp_build._compile_unit(text, flags, cpp_build.unit_object(text, flags))
    symbols = _symbols(obj)
    tables = {name: kind for name, kind in symbols.items() if name.startswith("wg_cuda_triton_k")}
    assert len(tables) == 9, tables
    assert set(tables.values()) <= {"D", "d", "R", "r"}, tables  # data, not zero-filled and set up at start-up
    images = [name for name in symbols if name.startswith("wg_image_") and not name.endswith("_end")]
    assert len(images) == (6 if lazy_unaligned else 9), images
    assert (symbols.get("wg_set_kernel_resolver") == "T") == lazy_unaligned
