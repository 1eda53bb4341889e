"""Chapters 10 (trainers) and 11 (CUDA semantics): the pieces a CPU can check."""

from __future__ import annotations

import pytest
import torch

from helpers.cuda_semantics import ASYNC_ERROR_SCRIPT, async_error_report


def test_the_faulty_call_is_marked_once_and_is_the_cross_entropy() -> None:
    marked = [line for line in ASYNC_ERROR_SCRIPT.splitlines() if line.endswith("# the faulty call")]
    assert len(marked) == 1 and "cross_entropy(logits, target)" in marked[0]


def test_on_the_cpu_the_error_is_raised_by_the_faulty_call() -> None:
    report = async_error_report("cpu")
    assert report.error == "IndexError: Target 10 is out of bounds."
    assert report.reported_line == report.faulty_line and report.lines_late == 0
    assert report.printed == "", "nothing after the faulty call ran"


def test_the_meta_device_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="meta device runs no kernels"):
        async_error_report("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_device_side_assert_surfaces_late_unless_launches_block() -> None:
    late = async_error_report("cuda")
    blocking = async_error_report("cuda", launch_blocking=True)
    assert "device-side assert" in late.error and "device-side assert" in blocking.error
    assert late.lines_late > 0 and "the faulty call returned" in late.printed
    assert blocking.lines_late == 0


def test_chapter_11_sets_the_sync_debug_mode_only_through_the_helper() -> None:
    """Issue 26 item 1: torch's one-time "prototype feature" notice appeared on the GPU page,
    because the chapter called ``torch.cuda.set_sync_debug_mode`` itself. ``sync_debug`` drops
    that notice and restores the mode; the chapter uses it for every sync-debug block."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "chapters" / "11_cuda_semantics.ipynb"
    code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "code"]
    assert not [c for c in code if "set_sync_debug_mode(" in c]
    assert any("with sync_debug(device, mode=\"error\")" in c for c in code)
