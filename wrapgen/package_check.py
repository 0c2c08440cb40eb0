"""Is a package directory what `wrapgen.aot_compile` wrote? Checked before anything is loaded.

A truncated model.so mapped by dlopen kills the process with SIGBUS, and a flipped byte in
model.so or weights.bin runs wrong code or wrong weights without a sound, so both must be
caught before `load_package` maps or reads them.

SHA256SUMS (package format 3) lists every other file of the package with its size and its
SHA-256, in the format of coreutils' `sha256sum` (so `sha256sum -c SHA256SUMS` in the package
folder checks it too; it skips the `#` lines):

    # wrapgen package format 3
    # size 5822  metadata.json              one size line per file, sorted by name
    # size 16384  model.so
    ...
    9f86d081...0f00a08  metadata.json      one SHA-256 line per file, sorted by name
    ...
    # sha256 of the lines above: 5e884898...42d1542

The last line seals the manifest, since it holds the other hashes: a manifest that does not
end with its seal, or whose bytes before the seal have another SHA-256, is damaged. Sizes are
checked first (cheap, and a truncated file is caught before it is read), then the hashes,
and only then is metadata.json parsed; a package without SHA256SUMS (format 1 or 2, or one
that lost it) is refused with a message to export it again.

cpp_runtime/include/wrapgen/package_check.h does the same for the standalone runner with
plain line parsing (no JSON: the runner never reads metadata.json), with the same messages
word for word.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wrapgen.packaging import PACKAGE_FORMAT, PackageDamagedError, PackageError

__all__ = ["MANIFEST", "verify_package", "write_manifest", "write_metadata"]

MANIFEST = "SHA256SUMS"
METADATA = "metadata.json"
REQUIRED_FILES = (METADATA, "model.so", "weights.bin")
_HEADER = re.compile(rb"# wrapgen package format ([0-9]{1,9})")
_SIZE_LINE = re.compile(rb"# size ([0-9]{1,18})  (.*)")
_HASH_LINE = re.compile(rb"([0-9a-f]{64})  (.*)")
_SEAL_PREFIX = b"# sha256 of the lines above: "
_SEAL = re.compile(re.escape(_SEAL_PREFIX) + rb"([0-9a-f]{64})")
_TYPE_NAMES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))

# Keys the Python loader reads -> the JSON types each may have.
_LOADER_KEYS = {
    "format": ("integer",), "program": ("string",), "torch_version": ("string",), "model_abi": ("integer",),
    "shims": ("object",), "inputs": ("array",), "outputs": ("array",), "constants": ("array",),
    "in_spec": ("string", "null"), "out_spec": ("string", "null"), "output_kind": ("string",),
}


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _names_a_file(name: bytes) -> bool:
    return name not in (b"", b".", b"..", MANIFEST.encode()) and not any(c in name for c in (b"/", b"\\", b"\0"))


def _manifest_bytes(entries: dict[bytes, tuple[int, str]]) -> bytes:
    names = sorted(entries)
    lines = [b"# wrapgen package format %d" % PACKAGE_FORMAT]
    lines += [b"# size %d  %s" % (entries[name][0], name) for name in names]
    lines += [b"%s  %s" % (entries[name][1].encode(), name) for name in names]
    body = b"".join(line + b"\n" for line in lines)
    return body + _SEAL_PREFIX + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _write_atomic(path: Path, blob: bytes) -> None:
    """Replace `path` by `blob` in one step: a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the package from other users
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(package: str | Path, names: Iterable[str]) -> None:
    """Write SHA256SUMS listing the named files of `package` as they are on disk now."""
    folder = Path(package)
    entries = {}
    for name in names:
        if not _names_a_file(os.fsencode(name)):
            raise PackageError(f"cannot list {name!r} in {MANIFEST} of {package}: it is not the name of a file in the package folder")
        entries[os.fsencode(name)] = ((folder / name).stat().st_size, _sha256_file(folder / name))
    _write_atomic(folder / MANIFEST, _manifest_bytes(entries))


def write_metadata(package: str | Path, metadata: dict[str, Any]) -> None:
    """Write metadata.json and, where the package has a SHA256SUMS, record the new file in it
    (the other lines are kept, so a damaged model.so is still caught). Tools that must change
    a package's metadata write it through here, or the load refuses it as damaged."""
    folder = Path(package)
    entries = _read_manifest(folder, str(package)) if (folder / MANIFEST).exists() else None
    blob = (json.dumps(metadata, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
    _write_atomic(folder / METADATA, blob)
    if entries is not None:
        entries[METADATA.encode()] = (len(blob), hashlib.sha256(blob).hexdigest())
        _write_atomic(folder / MANIFEST, _manifest_bytes(entries))


def _read_manifest(folder: Path, where: str) -> dict[bytes, tuple[int, str]]:
    """name -> (size, sha256) from SHA256SUMS, once its seal, format and every line check out."""

    def damaged(problem: str) -> PackageDamagedError:
        return PackageDamagedError(where, MANIFEST, problem)

    try:
        info = os.stat(folder / MANIFEST)
    except (FileNotFoundError, NotADirectoryError):
        if (folder / METADATA).exists():
            raise PackageError(
                f"wrapgen package {where} has no {MANIFEST}: it was written by an older wrapgen (package format 1 or 2) "
                "or the file was lost; export it again with wrapgen.aot_compile"
            ) from None
        raise PackageError(f"{where} is not a wrapgen package (no {MANIFEST})") from None
    except OSError as e:
        raise damaged(f"cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise damaged("is not a regular file")
    try:
        blob = (folder / MANIFEST).read_bytes()
    except OSError as e:
        raise damaged(f"cannot be read ({e.strerror})") from None

    start = blob.rfind(b"\n", 0, len(blob) - 1) + 1  # the last line, without its newline
    seal = _SEAL.fullmatch(blob, start, len(blob) - 1) if blob.endswith(b"\n") else None
    if seal is None:
        raise damaged(f'has no seal: its last line is not "{_SEAL_PREFIX.decode()}<64 hex digits>" (truncated or edited)')
    body = blob[:start]
    if hashlib.sha256(body).hexdigest() != seal.group(1).decode():
        raise damaged("was changed after wrapgen wrote it (its content does not match the SHA-256 on its last line)")
    lines = body.split(b"\n")[:-1]
    header = _HEADER.fullmatch(lines[0]) if lines else None
    if header is None:
        raise damaged('does not start with the line "# wrapgen package format <N>"')
    if int(header.group(1)) != PACKAGE_FORMAT:
        raise PackageError(
            f"cannot load the wrapgen package {where}: package format {int(header.group(1))}, this wrapgen reads format {PACKAGE_FORMAT}"
        )

    sizes: dict[bytes, int] = {}
    hashes: dict[bytes, str] = {}
    for number, line in enumerate(lines[1:], start=2):
        if line.startswith(b"# size "):
            m, table, what = _SIZE_LINE.fullmatch(line), sizes, "size"
        else:
            m, table, what = _HASH_LINE.fullmatch(line), hashes, "SHA-256"
        if m is None:
            raise damaged(f'has a malformed line {number} (expected "<64 hex digits>  <file name>" or "# size <bytes>  <file name>")')
        name = m.group(2)
        if not _names_a_file(name):
            raise damaged(f"has line {number}, which does not name a file of the package")
        if name in table:
            raise damaged(f"has a second {what} line for {os.fsdecode(name)} (line {number})")
        table[name] = int(m.group(1)) if table is sizes else m.group(1).decode()
    for name in sorted(sizes.keys() | hashes.keys()):
        for table, what in ((sizes, "size"), (hashes, "SHA-256")):
            if name not in table:
                raise damaged(f"lists {os.fsdecode(name)} without its {what}")
    for needed in REQUIRED_FILES:
        if needed.encode() not in sizes:
            raise damaged(f"does not list {needed}")
    return {name: (sizes[name], hashes[name]) for name in sorted(sizes)}


def verify_package(package: str | Path) -> dict[str, Any]:
    """The metadata of the package at `package`, once every file SHA256SUMS lists is intact
    and the keys the loader reads have their types. Raises PackageDamagedError naming the file
    and what is wrong with it, or PackageError for a package this wrapgen cannot read."""
    where = str(package)
    folder = Path(package)
    table = {os.fsdecode(name): entry for name, entry in _read_manifest(folder, where).items()}

    def damaged(file: str, problem: str) -> PackageDamagedError:
        return PackageDamagedError(where, file, problem)

    for name, (size, _) in table.items():  # sizes first: cheap, and catches truncation
        try:
            info = (folder / name).stat()
        except FileNotFoundError:
            raise damaged(name, "is missing") from None
        except OSError as e:
            raise damaged(name, f"cannot be read ({e.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise damaged(name, "is not a regular file")
        if info.st_size != size:
            how = "truncated" if info.st_size < size else "it grew"
            raise damaged(name, f"has {info.st_size} bytes, but {MANIFEST} records {size} ({how})")
    for name, (_, sha256) in table.items():
        try:
            actual = _sha256_file(folder / name)
        except OSError:
            raise damaged(name, "cannot be read to the end") from None
        if actual != sha256:
            raise damaged(name, f"does not match its SHA-256 in {MANIFEST} (recorded {sha256[:16]}..., found {actual[:16]}...)")

    # Intact as wrapgen wrote it; what follows catches a tool that wrote a bad one and resealed it.
    try:
        meta = json.loads((folder / METADATA).read_bytes().decode("utf-8"))
    except OSError as e:
        raise damaged(METADATA, f"cannot be read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise damaged(METADATA, f"is not UTF-8 text (invalid byte at offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise damaged(METADATA, f"is not valid JSON: {e.msg}: line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise damaged(METADATA, "is not valid JSON: Nesting too deep") from None
    if not isinstance(meta, dict):
        raise damaged(METADATA, "does not hold a JSON object")
    _check_loader_keys(meta, where)
    return meta


def _check_loader_keys(meta: dict[str, Any], where: str) -> None:
    """What PackagedModel reads, so a wrong shape is a PackageError, not a KeyError later."""
    for key, types in _LOADER_KEYS.items():
        _require(meta, (), key, types, " or ".join(_article(t) for t in types), where)
    for name in meta["shims"]:
        _require(meta["shims"], ("shims",), name, ("string",), "a string", where)
    for section, fields in (("inputs", {"name": ("string",), "kind": ("string",)}),
                            ("constants", {"name": ("string",), "origin": ("string", "null")})):
        for i in range(len(meta[section])):
            entry = _require(meta[section], (section,), i, ("object",), "an object", where)
            for key, types in fields.items():
                _require(entry, (section, i), key, types, " or ".join(_article(t) for t in types), where)


def _require(container: Any, path: tuple, key: str | int, types: tuple[str, ...], expected: str, where: str) -> Any:
    """container[key] if it exists with one of the JSON `types`, else a PackageDamagedError."""
    full = _key_path((*path, key))
    present = key < len(container) if isinstance(key, int) else key in container
    if not present:
        raise PackageDamagedError(where, METADATA, f"lacks the key {full}")
    value = container[key]
    kind = _json_type(value)
    if kind not in types:
        raise PackageDamagedError(where, METADATA, f"has {full} of type {kind}, expected {expected}")
    return value


def _article(json_type: str) -> str:
    return f"an {json_type}" if json_type[0] in "aeiou" else f"a {json_type}"


def _json_type(value: Any) -> str:
    return next((name for t, name in _TYPE_NAMES if isinstance(value, t)), "null")


def _key_path(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f'["{k}"]' for k in path)
