"""Where and with what a benchmark ran: date, machine, processor, library versions."""

from __future__ import annotations

import datetime
import os
import platform
import re
import socket
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import wrapgen


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _triton_version() -> str | None:
    try:
        import triton
    except Exception:
        return None
    return getattr(triton, "__version__", None)


def _huge_pages() -> str:
    """Linux's transparent-huge-page mode and whether torch's CPU allocator asks for huge pages
    itself (THP_MEM_ALLOC_ENABLE): both change the cost of every fresh large CPU buffer."""
    try:
        mode = re.search(r"\[(\w+)\]", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text())
    except OSError:
        mode = None
    allocator = os.environ.get("THP_MEM_ALLOC_ENABLE", "")
    torch_thp = "on" if allocator.lower() in ("1", "true", "on", "yes") else "off"
    return f"THP {mode.group(1) if mode else 'unavailable'}; torch THP_MEM_ALLOC_ENABLE {torch_thp}"


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not dirty:
        return commit
    tree = _working_tree(root)
    return f"{commit}+dirty" + (f", tree {tree}" if tree else "")


def _working_tree(root: Path) -> str | None:
    """The git tree hash of the files as they are (tracked and untracked, less what .gitignore
    leaves out), made through a scratch index: a checkout copied elsewhere (a GPU host) keeps an
    old HEAD, and this hash names the tree that ran. `git rev-parse <commit>^{tree}` gives the same
    hash for the commit that holds these files."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        try:
            subprocess.run(["git", "add", "-A"], cwd=root, env=env, capture_output=True, timeout=60, check=True)
            return subprocess.run(["git", "write-tree"], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=60, check=True).stdout.strip()[:12]
        except (OSError, subprocess.SubprocessError):
            return None


@dataclass(frozen=True)
class MachineInfo:
    date: str
    time: str
    device: str
    hostname: str
    cpu: str
    cores: int
    torch_threads: int
    huge_pages: str
    gpu: str | None
    cuda: str | None
    python: str
    torch: str
    triton: str | None
    wrapgen: str
    wrapgen_commit: str | None

    @property
    def machine(self) -> str:
        """The machine a result is named after: the GPU on CUDA, the host name on CPU."""
        return self.gpu if self.device == "cuda" and self.gpu else self.hostname

    def as_dict(self) -> dict:
        return asdict(self)


def collect(device: str) -> MachineInfo:
    now = datetime.datetime.now()
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else None
    return MachineInfo(
        date=now.strftime("%Y-%m-%d"),
        time=now.strftime("%H:%M:%S"),
        device=device,
        hostname=socket.gethostname(),
        cpu=_cpu_model(),
        cores=os.cpu_count() or 0,
        torch_threads=torch.get_num_threads(),
        huge_pages=_huge_pages(),
        gpu=gpu,
        cuda=torch.version.cuda if device == "cuda" else None,
        python=platform.python_version(),
        torch=torch.__version__,
        triton=_triton_version(),
        wrapgen=wrapgen.__version__,
        wrapgen_commit=_git_commit(),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "amd", "radeon", "intel"}
_GPU_DETAIL = re.compile(r"^(\d+GB|HBM\d*e?|PCIe|SXM\d*|NVL|MIG.*)$", re.IGNORECASE)


def machine_tag(info: MachineInfo) -> str:
    """The machine in a file name: on CUDA the GPU's model without vendor and memory words
    ("NVIDIA H100 80GB HBM3" -> `H100`, "NVIDIA GeForce RTX 4090" -> `RTX-4090`), else the host name."""
    if info.device == "cuda" and info.gpu:
        words = [w for w in re.split(r"[\s_-]+", info.gpu) if w and w.lower() not in _VENDOR_WORDS]
        model = []
        for word in words:
            if _GPU_DETAIL.match(word):
                break
            model.append(word)
        if model:
            return _slug("-".join(model))
    return _slug(info.hostname) or "unknown"


def commit_tag(info: MachineInfo) -> str:
    """The code in a file name: the short commit, `-dirty` added for a modified checkout (the page
    names its working tree), `nocommit` outside a git checkout."""
    commit = info.wrapgen_commit
    if not commit:
        return "nocommit"
    head = re.match(r"[0-9a-f]+", commit)
    if not head:
        return "nocommit"
    return head.group(0) + ("-dirty" if "+dirty" in commit else "")


def file_stem(info: MachineInfo, suite: str) -> str:
    """`<suite>-<device>-<YYYY-MM-DD>-<machine>-<commit>`: what ran (its configuration words
    included, e.g. `models-bf16-inference`), where, when and on which code; the scheme
    benchmarks/results/README.md documents. A CPU run whose every buffer sits on huge pages
    (torch's THP_MEM_ALLOC_ENABLE) is a separate result: `-torch-thp` joins the suite."""
    if info.device == "cpu" and info.huge_pages.endswith("THP_MEM_ALLOC_ENABLE on"):
        suite += "-torch-thp"
    return "-".join([_slug(suite), info.device, info.date, machine_tag(info), commit_tag(info)])
