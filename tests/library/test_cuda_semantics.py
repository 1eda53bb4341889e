"""Chapters 10 (trainers) and 11 (CUDA semantics): the pieces a CPU can check."""

from __future__ import annotations

import subprocess

import pytest
import torch

from helpers import cuda_semantics
from helpers.cuda_semantics import ASYNC_ERROR_SCRIPT, async_error_report, async_error_reports


def test_the_faulty_call_is_marked_once_and_is_the_cross_entropy() -> None:
    marked = [line for line in ASYNC_ERROR_SCRIPT.splitlines() if line.endswith("# the faulty call")]
    assert len(marked) == 1 and "cross_entropy(logits, target)" in marked[0]


@pytest.fixture(scope="module")
def one_cpu_report() -> cuda_semantics.AsyncErrorReport:
    """``async_error_report("cpu")``, run once (a fresh process that imports torch) for the
    tests that read it."""
    return async_error_report("cpu")


def test_on_the_cpu_the_error_is_raised_by_the_faulty_call(one_cpu_report) -> None:
    report = one_cpu_report
    assert report.error == "IndexError: Target 10 is out of bounds."
    assert report.reported_line == report.faulty_line and report.lines_late == 0
    assert report.printed == "", "nothing after the faulty call ran"


def test_both_ways_at_once_give_the_reports_of_one_way_at_a_time_on_the_cpu(
        one_cpu_report) -> None:
    late, blocking = async_error_reports("cpu")
    one = one_cpu_report
    assert late == blocking == one, (late, blocking, one)


class _FakeFaultyScript:
    """Stands for the faulty script's process as a CUDA GPU runs it: without
    CUDA_LAUNCH_BLOCKING the device-side assert surfaces at the .item() line, with it at the
    faulty call. Records when each process starts and is waited for."""

    events: list[str] = []
    hang = False

    def __init__(self, args, *, stdout, stderr, text, env) -> None:  # noqa: ANN001
        assert stdout is stderr is subprocess.PIPE and text
        self.script, self.blocking = args[1], env.get("CUDA_LAUNCH_BLOCKING") == "1"
        self.returncode = None
        self.killed = False
        self.events.append(f"start blocking={self.blocking}")

    def communicate(self, timeout=None):  # noqa: ANN001
        self.events.append(f"wait blocking={self.blocking}")
        if self.hang and not self.killed:
            raise subprocess.TimeoutExpired("python", timeout)
        lines = ASYNC_ERROR_SCRIPT.splitlines()
        faulty = next(i for i, line in enumerate(lines, 1) if "# the faulty call" in line)
        item = next(i for i, line in enumerate(lines, 1) if "loss.item()" in line)
        self.returncode = 1
        printed = "" if self.blocking else "the faulty call returned\n"
        where = faulty if self.blocking else item
        return printed, (f'Traceback (most recent call last):\n  File "{self.script}", '
                         f"line {where}, in <module>\n"
                         "torch.AcceleratorError: CUDA error: device-side assert triggered\n")

    def poll(self):  # noqa: ANN201
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.events.append(f"kill blocking={self.blocking}")


def test_the_two_processes_run_side_by_side_and_each_report_is_its_own(monkeypatch) -> None:
    """Issue 27: chapter 11's two reports cost one process's start-up, not two (11 s on the
    H200 one after the other). The GPU's output is faked: the order of the pair is kept."""
    monkeypatch.setattr(cuda_semantics.subprocess, "Popen", _FakeFaultyScript)
    monkeypatch.setattr(_FakeFaultyScript, "events", [])
    late, blocking = async_error_reports("cpu")
    assert _FakeFaultyScript.events[:2] == ["start blocking=False", "start blocking=True"]
    assert "device-side assert" in late.error and "device-side assert" in blocking.error
    assert late.lines_late > 0 and "the faulty call returned" in late.printed
    assert blocking.lines_late == 0 and blocking.printed == ""


def test_a_timeout_kills_both_processes(monkeypatch) -> None:
    monkeypatch.setattr(cuda_semantics.subprocess, "Popen", _FakeFaultyScript)
    monkeypatch.setattr(_FakeFaultyScript, "events", [])
    monkeypatch.setattr(_FakeFaultyScript, "hang", True)
    with pytest.raises(TimeoutError, match="timeout=5"):
        async_error_reports("cpu", timeout=5)
    kills = [e for e in _FakeFaultyScript.events if e.startswith("kill")]
    assert kills == ["kill blocking=False", "kill blocking=True"], _FakeFaultyScript.events


class _ExclusiveGpuScript(_FakeFaultyScript):
    """The faulty script on a GPU in exclusive-process compute mode: a process started while
    another still runs gets no CUDA context at the script's first CUDA call."""

    running = 0

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.busy = _ExclusiveGpuScript.running > 0
        _ExclusiveGpuScript.running += 1

    def communicate(self, timeout=None):  # noqa: ANN001
        printed, stderr = super().communicate(timeout)
        _ExclusiveGpuScript.running -= 1
        if self.busy:
            first_cuda = next(i for i, line in enumerate(ASYNC_ERROR_SCRIPT.splitlines(), 1)
                              if "randn" in line)
            printed, stderr = "", (
                f'Traceback (most recent call last):\n  File "{self.script}", line '
                f"{first_cuda}, in <module>\ntorch.AcceleratorError: CUDA error: CUDA-capable "
                "device(s) is/are busy or unavailable\n")
        return printed, stderr


def test_a_process_refused_by_an_exclusive_gpu_is_run_again_alone(monkeypatch) -> None:
    """Side by side, an exclusive-process GPU refuses the second process: its report is taken
    again alone, so the pair says what one at a time says (the faulty line, not line 5)."""
    monkeypatch.setattr(cuda_semantics.subprocess, "Popen", _ExclusiveGpuScript)
    monkeypatch.setattr(cuda_semantics, "resolve_device", lambda d: torch.device("cuda", 0))
    monkeypatch.setattr(_FakeFaultyScript, "events", [])
    monkeypatch.setattr(_ExclusiveGpuScript, "running", 0)
    late, blocking = async_error_reports("cuda")
    assert "device-side assert" in late.error and "device-side assert" in blocking.error
    assert late.lines_late > 0 and blocking.lines_late == 0
    assert _FakeFaultyScript.events[-2:] == ["start blocking=True", "wait blocking=True"]


def test_the_meta_device_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="meta device runs no kernels"):
        async_error_report("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_device_side_assert_surfaces_late_unless_launches_block() -> None:
    one_at_a_time = (async_error_report("cuda"),
                     async_error_report("cuda", launch_blocking=True))
    for late, blocking in (one_at_a_time, async_error_reports("cuda")):  # side by side
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
