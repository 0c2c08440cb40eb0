"""The C++ target's build machinery: wrapper objects compiled in the background and reused,
cache keys that change with what goes into a build (flags, runtime headers, compiler), and
Triton compile workers warming both alignment variants for the C++ target."""

from __future__ import annotations

import shutil
import time

import pytest
import torch

import wrapgen
from wrapgen.api import optimize
from wrapgen.backends.cpp import build as cpp_build
from wrapgen.backends.cpp.emitter import CppEmitter
from wrapgen.kernels.cpp import build as kernel_build
from wrapgen.wrapper_ir.lines import KernelDefinition


def _recording(monkeypatch) -> list[tuple[str, list[str]]]:
    """Every g++ command the builds run, with what it was for."""
    commands: list[tuple[str, list[str]]] = []
    run = kernel_build._run

    def record(cmd, what, source=None):
        commands.append((what, list(cmd)))
        run(cmd, what, source)

    monkeypatch.setattr(kernel_build, "_run", record)
    return commands


def _emitted(fn, x: torch.Tensor) -> tuple[str, list[str]]:
    emitter = CppEmitter()
    source = emitter.emit(optimize(wrapgen.lower(fn, (x,)), "cpp"))
    return source, [k.source for k in emitter.kernels]


def test_wrapper_compiled_in_the_background_is_not_compiled_again(tmp_path, monkeypatch) -> None:
    """start_wrapper_compile (what the emitter calls before Triton compiles a CUDA model's
    kernels) builds the wrapper's object, and beside it the runtime object and the precompiled
    runtime header; build_model waits for it instead of compiling again, and the library it
    links runs."""

    def fn(t):
        return torch.tanh(t) @ t.T + 1.0

    x = torch.randn(8, 8)
    commands = _recording(monkeypatch)
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        source, kernels = _emitted(fn, x)
        cpp_build.start_wrapper_compile(source)
        library = cpp_build.build_model(source, kernels)
        wrappers = [c for what, c in commands if what == "compiling the C++ wrapper"]
        assert len(wrappers) == 1, commands
        assert cpp_build.unit_object(source).exists()
        # the runtime header was precompiled beside it (hidden behind Triton's compile on CUDA),
        # for the kernel table compiled after Triton and for later builds
        cpp_build._background.submit(lambda: None).result()  # the background jobs ran
        for _ in range(600):
            if cpp_build.precompiled_header() is not None:
                break
            time.sleep(0.05)
        assert cpp_build.precompiled_header() is not None
        assert [what for what, _ in commands].count("compiling the C++ runtime") == 1
        commands.clear()
        compiled = wrapgen.compile(fn, (x,), target="cpp")  # the same program: a cache hit, nothing built
        assert compiled.artifact.path == str(library)
        assert commands == []
    torch.testing.assert_close(compiled(x), fn(x))


def test_background_compile_errors_surface_in_the_build(tmp_path) -> None:
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        cpp_build.start_wrapper_compile("this is not C++;\n")
        with pytest.raises(cpp_build.ModelBuildError, match="compiling the C\\+\\+ wrapper failed"):
            cpp_build.build_model("this is not C++;\n", [])


def test_cache_keys_change_with_flags_headers_and_compiler(tmp_path, monkeypatch) -> None:
    """The precompiled header and the wrapper objects are keyed by everything that shapes
    them: a changed flag, runtime header or compiler makes a new one, never reuses the old."""
    source = '#include "wrapgen/runtime.h"\nint wg_probe() { return 1; }\n'
    with wrapgen.config.patch(cache_dir=str(tmp_path / "cache")):
        pch, obj = cpp_build._pch_paths(()), cpp_build.unit_object(source)
        assert cpp_build._pch_paths(("-DUSE_CUDA",)) != pch
        assert cpp_build.unit_object(source, ("-DUSE_CUDA",)) != obj
        assert cpp_build.unit_object(source + "\n") != obj

        # A runtime header edited: copy the headers, change one, point the build at the copy.
        headers = tmp_path / "include"
        shutil.copytree(cpp_build.runtime_include_dir(), headers)
        runtime_h = headers / "wrapgen" / "runtime.h"
        runtime_h.write_text(runtime_h.read_text() + "\n// edited\n")
        monkeypatch.setattr(cpp_build, "runtime_include_dir", lambda: headers)
        cpp_build._runtime_digest.cache_clear()
        try:
            assert cpp_build._pch_paths(()) != pch
            assert cpp_build.unit_object(source) != obj
        finally:
            monkeypatch.undo()
            cpp_build._runtime_digest.cache_clear()
        assert cpp_build._pch_paths(()) == pch and cpp_build.unit_object(source) == obj

        monkeypatch.setattr(kernel_build, "compiler_id", lambda: "g++ (another) 99.0|x86_64|0")
        assert cpp_build._pch_paths(()) != pch
        assert cpp_build.unit_object(source) != obj


def test_precompiled_header_is_remade_for_changed_flags(tmp_path) -> None:
    """A header precompiled for one set of flags is not used for another (g++ would reject it
    or, worse, accept a mismatched one): each set gets its own."""
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        plain = cpp_build.make_precompiled_header(())
        assert plain is not None and cpp_build.precompiled_header(()) == plain
        assert cpp_build.precompiled_header(("-DWG_TEST_FLAG",)) is None
        other = cpp_build.make_precompiled_header(("-DWG_TEST_FLAG",))
        assert other is not None and other != plain


KERNEL = """import triton
import triton.language as tl


@triton.jit
def k_add(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    offsets = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offsets < xnumel
    tl.store(out_ptr0 + offsets, tl.load(in_ptr0 + offsets, mask=mask) + 1, mask=mask)
"""


def test_workers_warm_both_alignment_variants_for_the_cpp_target(tmp_path, monkeypatch) -> None:
    """The C++ target embeds both variants of a kernel with maybe-unaligned pointers, so both
    compile in the workers (in parallel), not the unaligned ones one after another in-process."""
    pytest.importorskip("triton")
    from wrapgen.kernels.triton import runtime
    from wrapgen.kernels.triton.worker_pool import Outcome

    sent: list[tuple[str, tuple]] = []

    class FakePool:
        def run(self, requests, progress=None):
            sent.extend(requests)
            return [Outcome(key, None) for key, _ in requests]

    monkeypatch.setattr(runtime, "compile_pool", lambda: FakePool())
    metadata = (("arg_names", ("in_ptr0", "out_ptr0", "xnumel")), ("arg_types", ("ptr:float32", "ptr:float32", "int32")),
                ("constexprs", (("XBLOCK", 64),)), ("num_warps", 4), ("unaligned", ("in_ptr0",)))
    spec = runtime.KernelSpec("k_add", KERNEL, metadata)
    with wrapgen.config.patch(cache_dir=str(tmp_path), triton_compile_workers_min=1):
        runtime.warm_in_workers([spec])  # the Python target: the aligned variant only
        assert [key for key, _ in sent] == ["k_add|True"]
        sent.clear()
        runtime.warm_in_workers([spec], unaligned_too=True)  # the aligned one is warm already
        assert [key for key, _ in sent] == ["k_add|False"]
        kinds = sent[0][1][2]
        assert kinds[0] == ("ptr", (torch.float32, False)) and kinds[1] == ("ptr", (torch.float32, True))
        sent.clear()
        runtime.warm_in_workers([spec], unaligned_too=True)
        assert sent == []  # both marked built


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cpp_build_compiles_each_kernel_once_and_unaligned_variants_on_first_use(tmp_path) -> None:
    """On CUDA, wrapgen.compile's C++ target compiles each Triton kernel once (its variant for
    aligned pointers, in the worker processes, the wrapper beside them); the variant for
    unaligned ones compiles on the first launch that needs it, through the resolver the loader
    attaches. An AOT package embeds both variants and runs an unaligned input with no compiler
    attached; a lazy library loaded without one names the kernel it lacks."""
    import shutil

    from wrapgen.backends.cpp.loader import CppModel
    from wrapgen.kernels.triton.worker_pool import compile_pool

    def fn(t):
        return torch.sin(t) * 2 + torch.cos(t).sum()

    base = torch.randn(4097, device="cuda")
    aligned, unaligned = base[:4096], base[1:]
    with wrapgen.config.patch(cache_dir=str(tmp_path), triton_compile_workers_min=1):
        before = sum(compile_pool().served().values())
        compiled = wrapgen.compile(fn, (unaligned,), target="cpp")
        served = sum(compile_pool().served().values()) - before
    kernels = [line for line in compiled.program.lines if isinstance(line, KernelDefinition)]
    assert kernels and any(dict(k.metadata).get("unaligned") for k in kernels)
    assert served == len(kernels), (served, len(kernels))  # no unaligned variant yet
    for x in (aligned, unaligned, aligned, unaligned):
        torch.testing.assert_close(compiled(x), fn(x))

    library = compiled.artifact.path
    copy = tmp_path / "copy_without_resolver.so"  # a new path: loaded anew, nothing attached
    shutil.copyfile(library, copy)
    bare = CppModel(str(copy))
    bare.set_constants([compiled.program.constant_values().get(c.name) for c in compiled.program.constants])
    torch.testing.assert_close(bare([aligned])[0], fn(aligned))
    with pytest.raises(RuntimeError, match="_unaligned is not built into this library"):
        bare([unaligned])

    path = wrapgen.aot_compile(fn, (unaligned,), tmp_path / "fn.wgpkg")
    loaded = wrapgen.load_package(path)
    for x in (unaligned, aligned):
        torch.testing.assert_close(loaded(x), fn(x))


@pytest.mark.parametrize("target", ["python", "cpp"])
def test_kernel_prelude_is_precompiled_for_builds_of_many_new_kernels(tmp_path, monkeypatch, target) -> None:
    """A build of enough new C++ kernels precompiles the prelude first and its kernels include
    it; a build of fewer new kernels makes none (it would cost more than it saves) but uses one
    the cache holds. Results are eager's either way."""

    def fn(t):
        return torch.softmax(torch.tanh(t) * 2, dim=-1).sum(0)

    def other(t):
        return torch.sigmoid(t).mean(1) + 1.0

    x = torch.randn(16, 32)
    commands = _recording(monkeypatch)
    monkeypatch.setattr(kernel_build, "PCH_MIN_KERNELS_PER_CORE", 1000)  # "few": no prelude PCH made
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        torch.testing.assert_close(wrapgen.compile(fn, (x,), target=target)(x), fn(x))
        assert kernel_build.prelude_header() is None
        assert not any(what == "precompiling the kernel prelude" for what, _ in commands)

        monkeypatch.setattr(kernel_build, "PCH_MIN_KERNELS_PER_CORE", 0)  # "many"
        commands.clear()
        torch.testing.assert_close(wrapgen.compile(other, (x,), target=target)(x), other(x))
        header = kernel_build.prelude_header()
        assert header is not None and header.read_text() == kernel_build.PRELUDE
        assert [what for what, _ in commands].count("precompiling the kernel prelude") == 1
        kernels = [c[c.index("-c") + 1] for what, c in commands if what == "compiling a kernel"]
        assert kernels and all(open(k).readline() == f'#include "{header}"\n' for k in kernels)

        monkeypatch.setattr(kernel_build, "PCH_MIN_KERNELS_PER_CORE", 1000)  # few again: the made one is used
        commands.clear()
        y = torch.randn(16, 32)
        torch.testing.assert_close(wrapgen.compile(lambda t: torch.cos(t) * 3, (y,), target=target)(y), torch.cos(y) * 3)
        kernels = [c[c.index("-c") + 1] for what, c in commands if what == "compiling a kernel"]
        assert kernels and all(open(k).readline() == f'#include "{header}"\n' for k in kernels)


def test_kernel_prelude_pch_is_keyed_by_prelude_flags_and_compiler(tmp_path, monkeypatch) -> None:
    with wrapgen.config.patch(cache_dir=str(tmp_path)):
        paths = kernel_build._prelude_paths()
        monkeypatch.setattr(kernel_build, "PRELUDE", kernel_build.PRELUDE + "\n// changed\n")
        assert kernel_build._prelude_paths() != paths
        monkeypatch.undo()
        flags = kernel_build.compile_flags()
        monkeypatch.setattr(kernel_build, "compile_flags", lambda: (*flags, "-DWG_OTHER"))
        assert kernel_build._prelude_paths() != paths
        monkeypatch.undo()
        monkeypatch.setattr(kernel_build, "compiler_id", lambda: "g++ (another) 99.0|x86_64|0")
        assert kernel_build._prelude_paths() != paths
