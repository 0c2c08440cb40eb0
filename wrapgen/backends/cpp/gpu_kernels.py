"""The kernel table of a C++ model with GPU kernels: one translation unit that embeds each
Triton kernel's compiled binary (cubin) in the model library and defines the
`wrapgen::cuda::Kernel` the wrapper launches (`cpp_runtime/include/wrapgen/cuda_kernels.h`).

Binaries are embedded with the assembler's `.incbin` (written to the cache under their
content hash first), so a model of many kernels compiles as fast as one of few, and the
library is self-contained: an AOT package needs no kernel files beside `model.so`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from wrapgen.backends.cpp.exprs import cpp_string
from wrapgen.cache import cache_root
from wrapgen.wrapper_ir.lines import KernelDefinition


def _binary_file(image: bytes) -> Path:
    folder = cache_root() / "cuda_binaries"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(image).hexdigest()[:32]}.cubin"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(image)
        os.replace(tmp, path)
    return path


def _embed(symbol: str, path: Path) -> list[str]:
    """A read-only byte array `symbol` (and `symbol_end`) holding the file's bytes."""
    if any(c in str(path) for c in '"\\\n'):
        raise ValueError(f"cannot embed {path}: its path has a quote, backslash or newline")
    return [
        "asm(",
        '    ".section .rodata\\n"',
        '    ".balign 16\\n"',
        f'    ".globl {symbol}\\n.hidden {symbol}\\n{symbol}:\\n"',
        f'    ".incbin \\"{path}\\"\\n"',
        f'    ".globl {symbol}_end\\n.hidden {symbol}_end\\n{symbol}_end:\\n"',
        '    ".previous\\n");',
        f'extern "C" const unsigned char {symbol}[];',
        f'extern "C" const unsigned char {symbol}_end[];',
    ]


def kernel_table_source(kernels: list[KernelDefinition], lazy_unaligned: bool = False) -> str:
    """Compile `kernels` (Triton KernelDefinitions) and return the C++ source of their table.

    `lazy_unaligned`: the variants for maybe-unaligned pointers are not compiled now but on their
    first launch, through the resolver the library exports (`wg_set_kernel_resolver`, attached by
    `loader.CppModel.attach_kernel_compiler`): a model built in this process then compiles each
    kernel once, as the Python target does, where both variants up front nearly doubled Triton's
    share of a cold build. Packages, run without Python, embed both."""
    from wrapgen.kernels.triton.runtime import kernel_binaries

    binaries = kernel_binaries([(k.name, k.source, k.metadata) for k in kernels], unaligned_too=not lazy_unaligned)
    lines = ["// wrapgen: compiled GPU kernels, embedded (see wrapgen/cuda_kernels.h).", '#include "wrapgen/cuda_kernels.h"', ""]
    if lazy_unaligned:
        lines += ['extern "C" __attribute__((visibility("default"))) void wg_set_kernel_resolver(wrapgen::cuda::KernelResolver r) {',
                  "  wrapgen::cuda::kernel_resolver().store(r, std::memory_order_release);", "}", ""]
    for kernel in kernels:
        aligned, unaligned = binaries[kernel.name]
        if lazy_unaligned and dict(kernel.metadata).get("unaligned"):
            name = f"{kernel.name}_unaligned"
            lines += [f"extern const wrapgen::cuda::Kernel wg_cuda_{name}({cpp_string(name)});", ""]
        for suffix, binary in (("", aligned), ("_unaligned", unaligned)):
            if binary is None:
                continue
            symbol = f"wg_image_{kernel.name}{suffix}"
            lines += _embed(symbol, _binary_file(binary.image))
            lines.append(
                f"extern const wrapgen::cuda::Kernel wg_cuda_{kernel.name}{suffix}({cpp_string(kernel.name + suffix)}, "
                f"{cpp_string(binary.function_name)}, {symbol}, {symbol}_end, "
                f"{binary.shared_bytes}u, {binary.num_warps}u, {binary.scratch_params}u);"
            )
            lines.append("")
    return "\n".join(lines) + "\n"
