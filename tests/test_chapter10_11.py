"""Chapters 10 (trainers) and 11 (CUDA semantics): the pieces a CPU can check."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from bench import cuda_semantics
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


def test_cpu_workload_figures_do_not_include_the_cuda_only_ones() -> None:
    names = [f.name for f in cuda_semantics.run(torch.device("cpu"), quick=True)]
    assert names == ["launch_ms", "matmul_done_ms"], "the two figures every device measures"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_device_side_assert_surfaces_late_unless_launches_block() -> None:
    late = async_error_report("cuda")
    blocking = async_error_report("cuda", launch_blocking=True)
    assert "device-side assert" in late.error and "device-side assert" in blocking.error
    assert late.lines_late > 0 and "the faulty call returned" in late.printed
    assert blocking.lines_late == 0


def test_an_accelerate_state_cannot_change_within_a_process() -> None:
    """Why chapter 10 runs the CPU, mixed-precision and two-process cases as scripts."""
    pytest.importorskip("accelerate")
    code = textwrap.dedent("""
        from accelerate import Accelerator
        Accelerator()
        try:
            Accelerator(mixed_precision="bf16")
        except ValueError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "refused: AcceleratorState has already been initialized and cannot be changed" in out.stdout
