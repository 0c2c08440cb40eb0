"""Transparent huge-page advice for large fresh CPU buffers, on every target."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sympy
import torch

import wrapgen
from wrapgen.backends.huge_pages import HUGE_PAGE_BYTES, advise_huge_pages, gets_advice, whole_huge_pages
from wrapgen.wrapper_ir.values import TensorType, storage_bytes

TARGETS = ("python", "fx", "cpp")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not THP.exists(), reason="needs Linux with transparent huge pages"
)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.125, dim=-1)


def vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def first_huge_page(t: torch.Tensor) -> int:
    return -(-t.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES


@needs_thp
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("target", TARGETS)
def test_large_output_is_advised_huge_pages(target: str, dynamic: bool) -> None:
    compiled = wrapgen.compile(softmax, (torch.randn(1024, 4096),), target=target, dynamic=dynamic)
    assert "advise_huge_pages(" in compiled.source
    for rows in (1024, 768, 8) if dynamic else (1024,):
        x = torch.randn(rows, 4096)
        out = compiled(x)
        torch.testing.assert_close(out, softmax(x))
        if rows >= 512:  # 8 MiB and more; 8 rows (128 KiB) get no advice, read at run time
            # "hg": the mapping carries MADV_HUGEPAGE (whether the kernel found free huge
            # pages is its business; the advice is ours).
            assert "hg" in vm_flags(first_huge_page(out)), target


@pytest.mark.parametrize("target", TARGETS)
def test_small_buffers_and_the_option_off_get_no_advice(target: str) -> None:
    small = wrapgen.compile(softmax, (torch.randn(64, 256),), target=target)
    assert "advise_huge_pages(" not in small.source
    with wrapgen.config.patch(cpu_huge_pages=False):
        large = wrapgen.compile(softmax, (torch.randn(1024, 4096),), target=target)
    assert "advise_huge_pages(" not in large.source
    x = torch.randn(1024, 4096)
    torch.testing.assert_close(large(x), softmax(x))


def test_advice_goes_to_cpu_buffers_that_may_reach_a_huge_page() -> None:
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cpu = torch.device("cpu")
    assert storage_bytes(TensorType(torch.float32, cpu, (1024, 512), (512, 1))) == HUGE_PAGE_BYTES
    assert gets_advice(TensorType(torch.float32, cpu, (1024, 512), (512, 1)))
    assert not gets_advice(TensorType(torch.float32, cpu, (1024, 511), (512, 1)))  # a byte short
    # A transposed view's storage spans the same bytes as its contiguous twin.
    assert storage_bytes(TensorType(torch.float64, cpu, (512, 1024), (1, 512))) == 2 * HUGE_PAGE_BYTES
    # torch allocates nothing for a tensor with a zero size, whatever its strides.
    assert storage_bytes(TensorType(torch.float32, cpu, (4096, 0, 4096), (4096, 4096, 1))) == 0
    assert not gets_advice(TensorType(torch.float32, cpu, (4096, 0, 4096), (4096, 4096, 1)))
    # Dynamic sizes are advised; the run-time call reads the real size from the storage.
    assert sympy.simplify(storage_bytes(TensorType(torch.float32, cpu, (s0, s1), (s1, 1))) - 4 * s0 * s1) == 0
    assert gets_advice(TensorType(torch.float32, cpu, (s0, s1), (s1, 1)))
    assert not gets_advice(TensorType(torch.float32, torch.device("meta"), (4096, 4096), (4096, 1)))
    with wrapgen.config.patch(cpu_huge_pages=False):
        assert not gets_advice(TensorType(torch.float32, cpu, (4096, 4096), (4096, 1)))


def test_advice_covers_only_whole_huge_pages_inside_the_buffer() -> None:
    page = HUGE_PAGE_BYTES
    assert whole_huge_pages(page + 64, 3 * page) == (2 * page, 4 * page)
    assert whole_huge_pages(page, 3 * page) == (page, 4 * page)
    assert whole_huge_pages(page + 64, 2 * page - 128) is None  # ends 64 bytes short of a whole page
    assert whole_huge_pages(page - 1, page + 1) == (page, 2 * page)


@needs_thp
def test_advice_marks_the_buffer_mapping() -> None:
    buffer = torch.empty(3 * HUGE_PAGE_BYTES, dtype=torch.uint8)
    advise_huge_pages(buffer)
    assert "hg" in vm_flags(first_huge_page(buffer))
    torch.testing.assert_close(buffer.fill_(7), torch.full_like(buffer, 7))
