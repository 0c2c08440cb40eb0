"""A damaged AOT package is refused with a PackageError naming the file and what is wrong,
before anything is mapped: by `wrapgen.load_package` (in a child process, which must exit
normally, never by a signal: a truncated model.so mapped by dlopen used to die with SIGBUS)
and by the standalone runner, with the same message. One tiny model is compiled once; each
damage is a copy of its package. SHA256SUMS (sizes and SHA-256s, sealed on its last line) is
parsed here independently of wrapgen, as a check of its documented format.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import wrapgen
from tests.test_cpp_runtime import build_runner
from wrapgen.package_check import verify_package, write_manifest, write_metadata
from wrapgen.packaging import PackageDamagedError, PackageError, write_tensor_file

FILES = ["metadata.json", "model.cpp", "model.so", "weights.bin"]  # what SHA256SUMS lists, sorted
SEAL = b"# sha256 of the lines above: "


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(package: Path) -> None:
        data = (package / name).read_bytes()
        (package / name).write_bytes(data[: len(data) // 2])

    return damage


def _flip(name: str, at: float) -> Callable[[Path], None]:
    """Flip one bit of the byte at fraction `at` of the file (the size stays the same)."""

    def damage(package: Path) -> None:
        data = bytearray((package / name).read_bytes())
        data[min(int(len(data) * at), len(data) - 1)] ^= 0x01
        (package / name).write_bytes(bytes(data))

    return damage


def _remove(name: str) -> Callable[[Path], None]:
    return lambda package: (package / name).unlink()


def _replace(name: str, old: bytes, new: bytes, reseal: bool = False) -> Callable[[Path], None]:
    """Replace bytes of one file; with `reseal`, SHA256SUMS is written again to match (what a
    buggy tool could do), so only the content checks can catch it."""

    def damage(package: Path) -> None:
        data = (package / name).read_bytes()
        assert old in data
        (package / name).write_bytes(data.replace(old, new, 1))
        if reseal:
            write_manifest(package, FILES)

    return damage


def _resealed(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """A metadata edit written as wrapgen would (SHA256SUMS updated to match)."""

    def damage(package: Path) -> None:
        meta = json.loads((package / "metadata.json").read_text())
        edit(meta)
        write_metadata(package, meta)

    return damage


def _seal(body: bytes) -> bytes:
    return body + SEAL + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _manifest_resealed(edit: Callable[[list[bytes]], list[bytes]]) -> Callable[[Path], None]:
    """SHA256SUMS with its lines (the seal left out) edited, then sealed again."""

    def damage(package: Path) -> None:
        lines = (package / "SHA256SUMS").read_bytes().split(b"\n")[:-2]
        (package / "SHA256SUMS").write_bytes(_seal(b"".join(line + b"\n" for line in edit(lines))))

    return damage


def _older_wrapgen(fmt: int) -> Callable[[Path], None]:
    """A package as a wrapgen of format 1 (no hashes) or 2 (hashes in metadata.json) wrote it."""

    def damage(package: Path) -> None:
        meta = json.loads((package / "metadata.json").read_text()) | {"format": fmt}
        if fmt == 2:
            meta["files"] = {n: {"size": (package / n).stat().st_size, "sha256": "0" * 64} for n in FILES[1:]}
            meta["metadata_sha256"] = "0" * 64
        (package / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        (package / "SHA256SUMS").unlink()

    return damage


def _not_a_file(package: Path) -> None:
    (package / "SHA256SUMS").unlink()
    (package / "SHA256SUMS").mkdir()


# case -> (damage, error type, file named in the message, what the message says)
CASES: dict[str, tuple[Callable[[Path], None], str, str, str]] = {
    "model.so-truncated": (_truncate("model.so"), "PackageDamagedError", "model.so", r"has \d+ bytes, but SHA256SUMS records \d+ \(truncated\)"),
    "model.so-flipped": (_flip("model.so", 0.5), "PackageDamagedError", "model.so", "does not match its SHA-256 in SHA256SUMS"),
    "model.so-missing": (_remove("model.so"), "PackageDamagedError", "model.so", "is missing"),
    "weights.bin-truncated": (_truncate("weights.bin"), "PackageDamagedError", "weights.bin", r"\(truncated\)"),
    # the last byte is a weight's: this used to load and run with the wrong value
    "weights.bin-flipped": (_flip("weights.bin", 1.0), "PackageDamagedError", "weights.bin", "does not match its SHA-256"),
    "weights.bin-missing": (_remove("weights.bin"), "PackageDamagedError", "weights.bin", "is missing"),
    "model.cpp-flipped": (_flip("model.cpp", 0.5), "PackageDamagedError", "model.cpp", "does not match its SHA-256"),
    "metadata.json-truncated": (_truncate("metadata.json"), "PackageDamagedError", "metadata.json", r"\(truncated\)"),
    "metadata.json-flipped": (_replace("metadata.json", b'"float32"', b'"float33"'), "PackageDamagedError", "metadata.json",
                              "does not match its SHA-256 in SHA256SUMS"),
    "metadata.json-malformed": (_replace("metadata.json", b'"format": 3,', b'"format": 3;'), "PackageDamagedError", "metadata.json",
                                "does not match its SHA-256 in SHA256SUMS"),
    "metadata.json-missing": (_remove("metadata.json"), "PackageDamagedError", "metadata.json", "is missing"),
    "SHA256SUMS-missing": (_remove("SHA256SUMS"), "PackageError", "SHA256SUMS",
                           r"has no SHA256SUMS: .* or the file was lost; export it again with wrapgen.aot_compile"),
    "SHA256SUMS-not-a-file": (_not_a_file, "PackageDamagedError", "SHA256SUMS", "is not a regular file"),
    "SHA256SUMS-truncated": (_truncate("SHA256SUMS"), "PackageDamagedError", "SHA256SUMS",
                             r'has no seal: its last line is not "# sha256 of the lines above: <64 hex digits>"'),
    "SHA256SUMS-flipped": (_flip("SHA256SUMS", 0.5), "PackageDamagedError", "SHA256SUMS", "was changed after wrapgen wrote it"),
    # a flipped format digit is damage, not a package of another format: the seal is checked first
    "SHA256SUMS-format-edited": (_replace("SHA256SUMS", b"format 3", b"format 2"), "PackageDamagedError", "SHA256SUMS",
                                 "was changed after wrapgen wrote it"),
    "SHA256SUMS-malformed": (_manifest_resealed(lambda lines: [line[1:] if line.endswith(b"  model.so") else line for line in lines]),
                             "PackageDamagedError", "SHA256SUMS", r'has a malformed line \d+ \(expected "<64 hex digits>  <file name>"'),
    "SHA256SUMS-unlisted": (_manifest_resealed(lambda lines: [line for line in lines if not line.endswith(b"  model.so")]),
                            "PackageDamagedError", "SHA256SUMS", "does not list model.so"),
    "SHA256SUMS-size-only": (_manifest_resealed(lambda lines: [line for line in lines if not re.fullmatch(rb"[0-9a-f]{64}  model.cpp", line)]),
                             "PackageDamagedError", "SHA256SUMS", "lists model.cpp without its SHA-256"),
    "SHA256SUMS-bad-name": (_manifest_resealed(lambda lines: [*lines, b"# size 1  ../x"]), "PackageDamagedError", "SHA256SUMS",
                            r"has line 10, which does not name a file of the package"),
    "future-format": (_manifest_resealed(lambda lines: [b"# wrapgen package format 4", *lines[1:]]), "PackageError", "",
                      r"cannot load the wrapgen package .*: package format 4, this wrapgen reads format 3"),
    "older-wrapgen": (_older_wrapgen(1), "PackageError", "SHA256SUMS",
                      r"written by an older wrapgen \(package format 1 or 2\).*export it again with wrapgen.aot_compile"),
    "format-2": (_older_wrapgen(2), "PackageError", "SHA256SUMS", r"written by an older wrapgen \(package format 1 or 2\)"),
    # SHA256SUMS matches, but a tool wrote a metadata.json the Python loader cannot use (the
    # runner never reads metadata.json, so these are Python's alone)
    "metadata.json-bad-json": (_replace("metadata.json", b'"format": 3,', b'"format": 3', reseal=True), "PackageDamagedError", "metadata.json",
                               r"is not valid JSON: Expecting ',' delimiter: line \d+ column \d+"),
    "metadata.json-not-utf8": (_replace("metadata.json", b'"float32"', b'"float32\xff"', reseal=True), "PackageDamagedError", "metadata.json",
                               "is not UTF-8 text"),
    "metadata.json-missing-key": (_resealed(lambda m: m.pop("inputs")), "PackageDamagedError", "metadata.json", r'lacks the key \["inputs"\]'),
    "metadata.json-wrong-type": (_resealed(lambda m: m.update(model_abi="1")), "PackageDamagedError", "metadata.json",
                                 r'has \["model_abi"\] of type string, expected an integer'),
    "metadata.json-loader-key": (_resealed(lambda m: m.update(inputs={})), "PackageDamagedError", "metadata.json",
                                 r'has \["inputs"\] of type object, expected an array'),
}
PYTHON_ONLY = {"metadata.json-bad-json", "metadata.json-not-utf8", "metadata.json-missing-key", "metadata.json-wrong-type",
               "metadata.json-loader-key"}

# Loads each package given on the command line; one JSON line per package. Anything but a
# PackageError propagates (a traceback and exit code 1); a crash shows as a signal.
CHILD = """
import json, sys, torch, wrapgen
x, expected = torch.load(sys.argv[1])
for path in sys.argv[2:]:
    print(json.dumps({"loading": path}), flush=True)
    try:
        out = wrapgen.load_package(path)(x)
    except wrapgen.PackageError as e:
        print(json.dumps({"path": path, "type": type(e).__name__, "file": getattr(e, "file", ""), "message": str(e)}), flush=True)
    else:
        torch.testing.assert_close(out, expected)
        print(json.dumps({"path": path, "type": "loaded"}), flush=True)
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    path = Path(wrapgen.aot_compile(model, (x,), tmp_path_factory.mktemp("pkg") / "tiny.wgpkg"))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(wrapgen.load_package(path)(x), expected)  # builds the runtime module in this session's cache
    return path, x, expected


@pytest.fixture(scope="module")
def damaged(package, tmp_path_factory) -> dict[str, Path]:
    """case -> a copy of the package with that damage ("intact": an undamaged copy)."""
    path, _, _ = package
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for case, spec in {"intact": None, **CASES}.items():
        shutil.copytree(path, root / case)
        if spec is not None:
            spec[0](root / case)
        out[case] = root / case
    return out


@pytest.fixture(scope="module")
def loaded_in_child(package, damaged, wrapgen_cache_dir, tmp_path_factory) -> dict[str, dict]:
    """What `wrapgen.load_package` did with each package, run in one child process."""
    _, x, expected = package
    io = tmp_path_factory.mktemp("child") / "io.pt"
    torch.save((x, expected), io)
    env = dict(os.environ, WRAPGEN_CACHE_DIR=str(wrapgen_cache_dir))
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(io), *map(str, damaged.values())],
        capture_output=True, text=True, env=env, timeout=300,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    last = next((line["loading"] for line in reversed(lines) if "loading" in line), None)
    assert result.returncode == 0, f"the child exited with {result.returncode} while loading {last}:\n{result.stderr[-3000:]}"
    by_path = {line["path"]: line for line in lines if "path" in line}
    return {case: by_path[str(path)] for case, path in damaged.items()}


def test_sha256sums_lists_size_and_sha256_of_every_file(package):
    path, _, _ = package
    assert sorted(p.name for p in path.iterdir()) == sorted([*FILES, "SHA256SUMS"])
    blob = (path / "SHA256SUMS").read_bytes()
    lines = blob.decode().split("\n")
    assert lines[0] == "# wrapgen package format 3"
    assert lines[1:5] == [f"# size {(path / name).stat().st_size}  {name}" for name in FILES]
    assert lines[5:9] == [f"{hashlib.sha256((path / name).read_bytes()).hexdigest()}  {name}" for name in FILES]
    assert blob == _seal(blob[: blob.index(SEAL)]) and lines[10:] == [""]
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["format"] == 3 and "files" not in meta and "metadata_sha256" not in meta


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="sha256sum is not installed")
def test_sha256sum_checks_a_package(damaged):
    def check(case: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=damaged[case], capture_output=True, text=True)

    intact = check("intact")
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert intact.stdout.splitlines() == [f"{name}: OK" for name in FILES]
    flipped = check("weights.bin-flipped")
    assert flipped.returncode == 1 and "weights.bin: FAILED" in flipped.stdout


def test_write_metadata_keeps_the_other_hashes(package, tmp_path):
    """A tool that rewrites metadata.json through write_metadata does not bless other damage."""
    path, _, _ = package
    copy = tmp_path / "edited.wgpkg"
    shutil.copytree(path, copy)
    meta = json.loads((copy / "metadata.json").read_text()) | {"note": "edited by a tool"}
    write_metadata(copy, meta)
    assert verify_package(copy) == meta
    _flip("weights.bin", 1.0)(copy)
    write_metadata(copy, meta | {"note": "edited again"})
    with pytest.raises(PackageDamagedError, match="weights.bin does not match its SHA-256 in SHA256SUMS"):
        verify_package(copy)


def test_errors_are_exported():
    assert wrapgen.PackageError is PackageError
    assert issubclass(wrapgen.PackageDamagedError, wrapgen.PackageError) and wrapgen.PackageDamagedError is PackageDamagedError


def test_intact_package_loads_in_child_and_matches_eager(loaded_in_child):
    assert loaded_in_child["intact"]["type"] == "loaded"  # the child asserted it matches eager


@pytest.mark.parametrize("case", sorted(CASES))
def test_damage_is_a_package_error_naming_the_file(case, loaded_in_child, damaged):
    _, kind, file, pattern = CASES[case]
    got = loaded_in_child[case]
    assert got["type"] == kind, got
    assert got["file"] == (file if kind == "PackageDamagedError" else "")
    assert str(damaged[case]) in got["message"] and file in got["message"]
    if kind == "PackageDamagedError":
        assert got["message"].startswith(f"damaged wrapgen package {damaged[case]}: {file} "), got["message"]
    assert re.search(pattern, got["message"]), got["message"]


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    return build_runner(tmp_path_factory.mktemp("cmake"))


RUNNER_CASES = sorted(set(CASES) - PYTHON_ONLY)


@pytest.mark.parametrize("case", ["intact", *RUNNER_CASES])
def test_standalone_runner_refuses_damage_with_the_same_message(case, runner, package, damaged, loaded_in_child, tmp_path):
    _, x, expected = package
    write_tensor_file(tmp_path / "inputs.bin", {"x": x})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run([str(runner), str(damaged[case]), str(tmp_path / "inputs.bin")], capture_output=True, text=True, env=env, timeout=60)
    if case == "intact":
        assert result.returncode == 0, result.stderr
        printed = torch.tensor([float(v) for v in result.stdout.splitlines()[1].split()]).reshape(expected.shape)
        torch.testing.assert_close(printed, expected)
        return
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert result.stderr.strip() == f"wrapgen_runner: {loaded_in_child[case]['message']}"
