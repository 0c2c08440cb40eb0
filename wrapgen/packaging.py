"""The AOT package on disk, and whether this runtime can load it.

    PACKAGE/model.so        the model library (wrapper + kernels), C ABI of wrapgen/abi.h
    PACKAGE/weights.bin     constants in the tensor-file format of wrapgen/tensor_file.h
    PACKAGE/model.cpp       the wrapper's C++ source, for reading
    PACKAGE/metadata.json   input/output specs, constants, versions, every shim function the
                            library calls with the torch version that added it
    PACKAGE/SHA256SUMS      size and SHA-256 of every other file, in sha256sum's format, sealed
                            by its own SHA-256 on its last line (package_check.py); its first
                            line, "# wrapgen package format N", and that seal are kept by every
                            later format, so any wrapgen can tell which format a package has

The shim list comes from the library's undefined symbols (what the dynamic linker will ask
libtorch for), so it is exact; loading checks each against the running libtorch first and
names the missing ones instead of failing inside dlopen.
"""

from __future__ import annotations

import ctypes
import functools
import re
import struct
import subprocess
from pathlib import Path

import torch

# 2: metadata.json recorded each file's size and SHA-256 and sealed itself.
# 3: SHA256SUMS records them instead (no JSON needed to check a package); metadata.json is plain.
PACKAGE_FORMAT = 3
_SHIM_PREFIXES = ("aoti_torch_", "torch_")

_DTYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11, torch.bfloat16: 15,
}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}


class PackageError(RuntimeError):
    """A package is malformed or was built for a runtime this one is not compatible with."""


class PackageDamagedError(PackageError):
    """A file of a package is missing, truncated or changed since aot_compile wrote it, or its
    SHA256SUMS or metadata.json is malformed: loading it would crash the process or run the
    wrong model."""

    def __init__(self, package: str, file: str, problem: str) -> None:
        super().__init__(f"damaged wrapgen package {package}: {file} {problem}")
        self.package, self.file, self.problem = package, file, problem

    def __reduce__(self) -> tuple:
        return type(self), (self.package, self.file, self.problem)


# -- tensor files -------------------------------------------------------------------------------


def _span(sizes: tuple[int, ...], strides: tuple[int, ...]) -> int:
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


def write_tensor_file(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """Tensors with their exact sizes and strides (CPU copies of the spanned storage)."""
    with open(path, "wb") as out:
        out.write(b"WGT1" + struct.pack("<I", len(tensors)))
        for name, t in tensors.items():
            if t.dtype not in _DTYPE_CODES:
                raise PackageError(f"tensor {name}: dtype {t.dtype} cannot be stored")
            t = t.detach().cpu()
            sizes, strides = tuple(t.shape), tuple(t.stride())
            span = _span(sizes, strides)
            data = torch.as_strided(t, (span,), (1,), t.storage_offset()).contiguous() if span else t.new_empty(0)
            raw = data.view(torch.uint8).numpy().tobytes() if span else b""
            encoded = name.encode()
            out.write(struct.pack("<I", len(encoded)) + encoded)
            out.write(struct.pack("<iI", _DTYPE_CODES[t.dtype], len(sizes)))
            out.write(struct.pack(f"<{len(sizes)}q", *sizes) + struct.pack(f"<{len(strides)}q", *strides))
            out.write(struct.pack("<Q", len(raw)) + raw)


def read_tensor_file(path: str | Path) -> dict[str, torch.Tensor]:
    blob = Path(path).read_bytes()
    if blob[:4] != b"WGT1":
        raise PackageError(f"{path} is not a wrapgen tensor file")
    (count,), pos = struct.unpack_from("<I", blob, 4), 8
    out: dict[str, torch.Tensor] = {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", blob, pos)
        name = blob[pos + 4 : pos + 4 + n].decode()
        pos += 4 + n
        code, ndim = struct.unpack_from("<iI", blob, pos)
        pos += 8
        sizes = struct.unpack_from(f"<{ndim}q", blob, pos)
        strides = struct.unpack_from(f"<{ndim}q", blob, pos + 8 * ndim)
        pos += 16 * ndim
        (nbytes,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        dtype = _CODE_DTYPES[code]
        storage = torch.frombuffer(bytearray(blob[pos : pos + nbytes]), dtype=torch.uint8).view(dtype) if nbytes else torch.empty(0, dtype=dtype)
        pos += nbytes
        out[name] = torch.as_strided(storage, sizes, strides) if nbytes else torch.empty_strided(sizes, strides, dtype=dtype)
    return out


# -- shim functions and versions ------------------------------------------------------------------


@functools.cache
def shim_versions() -> dict[str, str]:
    """Every shim function the installed headers declare -> the torch version that added it
    (from the headers' `#if TORCH_FEATURE_VERSION >= TORCH_VERSION_X_Y_0` guards; "" = unguarded)."""
    include = Path(torch.__file__).parent / "include" / "torch" / "csrc"
    headers = [include / "inductor/aoti_torch/c/shim.h", include / "stable/c/shim.h"]
    headers += sorted((include / "inductor/aoti_torch/generated").glob("c_shim_*.h"))
    out: dict[str, str] = {}
    for header in headers:
        if not header.exists():
            continue
        guards: list[str] = []
        for line in header.read_text().splitlines():
            if line.startswith("#if"):
                m = re.search(r"TORCH_VERSION_(\d+)_(\d+)_\d+", line)
                guards.append(f"{m.group(1)}.{m.group(2)}" if m else "")
            elif line.startswith("#endif") and guards:
                guards.pop()
            for name in re.findall(r"\b((?:aoti_torch|torch)_\w+)\s*\(", line):
                version = max((g for g in guards if g), default="", key=lambda v: tuple(map(int, v.split("."))))
                out.setdefault(name, version)
    return out


def used_shims(library: str | Path) -> dict[str, str]:
    """The shim functions a built library imports, each with the version that added it."""
    result = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True)
    names = sorted({line.split()[-1] for line in result.stdout.splitlines() if line.split()[-1].startswith(_SHIM_PREFIXES)})
    versions = shim_versions()
    return {name: versions.get(name, "") for name in names}


@functools.cache
def _libtorch() -> tuple[ctypes.CDLL, ...]:
    """The libtorch libraries that define shim functions: the CPU one, and the CUDA one where
    this torch has it (the CUDA guard/stream and aoti_torch_cuda_* shims live there)."""
    lib_dir = Path(torch.__file__).parent / "lib"
    return tuple(ctypes.CDLL(str(lib_dir / name)) for name in ("libtorch_cpu.so", "libtorch_cuda.so") if (lib_dir / name).exists())


def check_compatible(metadata: dict, where: str) -> None:
    """Raise PackageError naming every reason this runtime cannot run the package."""
    from wrapgen.backends.cpp.loader import WG_MODEL_ABI_VERSION

    problems = []
    if metadata.get("format") != PACKAGE_FORMAT:
        problems.append(f"package format {metadata.get('format')!r}, this wrapgen reads format {PACKAGE_FORMAT}")
    if metadata.get("model_abi") != WG_MODEL_ABI_VERSION:
        problems.append(f"model ABI {metadata.get('model_abi')!r}, this runtime calls ABI {WG_MODEL_ABI_VERSION}")
    libraries = _libtorch()
    missing = [
        f"{name} (added in torch {version})" if version else name
        for name, version in metadata.get("shims", {}).items()
        if not any(hasattr(lib, name) for lib in libraries)
    ]
    if missing:
        problems.append(
            f"it calls shim functions this libtorch (torch {torch.__version__}) does not provide: {', '.join(missing)}"
        )
    if problems:
        built = metadata.get("torch_version", "an unknown torch")
        raise PackageError(f"cannot load the wrapgen package {where} (built with torch {built}): " + "; ".join(problems))

