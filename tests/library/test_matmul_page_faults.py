"""The page-fault probes of chapter 3's "comparing like with like" (helpers.matmul)."""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import matmul


@pytest.mark.skipif(sys.platform != "linux", reason="fault counts are read on Linux")
def test_a_fresh_output_faults_and_a_mapped_one_does_not() -> None:
    a, b = torch.rand(2000, 50), torch.rand(50, 2000)
    out = torch.empty(2000, 2000)
    torch.matmul(a, b, out=out)  # maps out's pages once
    assert matmul.minor_page_faults(lambda: torch.matmul(a, b, out=out)) < 100
    assert matmul.minor_page_faults(lambda: None) >= 0


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("[always] madvise never\n", "", True),
    ("always [madvise] never\n", "", False),
    ("always [madvise] never\n", "1", True),
    ("always madvise [never]\n", "1", False),
])
def test_huge_pages_are_read_from_the_kernel_setting(tmp_path, monkeypatch, text, env,
                                                     expected) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(text)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", env)
    assert matmul.huge_pages_for_large_blocks(str(setting)) is expected
    assert matmul.huge_pages_for_large_blocks(str(tmp_path / "missing")) is False


def test_another_allocator_is_seen_in_ld_preload(monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc.so.4")
    assert matmul.other_allocator_loaded()
    monkeypatch.delenv("LD_PRELOAD")
    assert not matmul.other_allocator_loaded()


def test_a_probe_needs_a_function() -> None:
    with pytest.raises(TypeError, match="lambda"):
        matmul.minor_page_faults(torch.ones(2))
