"""Chapters 10 (trainers) and 11 (CUDA semantics): the pieces a CPU can check."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


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
