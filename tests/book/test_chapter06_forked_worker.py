"""Chapter 6's forked-worker pitfall and its hidden check, run as a CUDA GPU runs them.

On a CUDA GPU the Dataset's ``torch.full(..., device=device)`` fails in a worker forked after
the chapter initialised CUDA, and the DataLoader re-raises the worker's RuntimeError. That
error's traceback holds the DataLoader's iterator in a reference cycle (torch's
``ExceptionWrapper.reraise`` keeps the exception in a local). When the garbage collector
frees the cycle, the iterator's queues are already closed, so its shutdown waits
``MP_STATUS_CHECK_INTERVAL`` (5 s) for the worker before killing it: 5 s of the first GPU
run's chapter 6 went there. Here the worker's failure is faked as CUDA raises it (the
message of ``torch.cuda._lazy_init``), so the CPU proves the cells show the message and end
the worker at once.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "06_image_folder.ipynb"
CUDA_MESSAGE = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                "multiprocessing, you must use the 'spawn' start method")

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the pitfall needs the fork start method")


def _cells() -> tuple[str, str]:
    """The GPU-only lesson cell and the GPU-only check of its message, without the magic."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    (lesson,) = [s for s in sources if "class OnDeviceDataset" in s]
    (check,) = [s for s in sources if "# Check: the forked worker failed" in s]
    for source in (lesson, check):
        assert source.startswith("%%gpu_only\n"), source[:40]
    return lesson.removeprefix("%%gpu_only\n"), check.removeprefix("%%gpu_only\n")


class _CudaTorch:
    """torch, except that ``full`` fails as a CUDA call fails in a worker forked after the
    parent initialised CUDA (only the worker calls it: the parent never does)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def full(*args, **kwargs):
        raise RuntimeError(CUDA_MESSAGE)


def _run_lesson() -> tuple[dict, set[int]]:
    lesson, _ = _cells()
    before = {p.pid for p in multiprocessing.active_children()}
    namespace = {"torch": _CudaTorch(), "device": torch.device("cuda", 0), "sys": sys,
                 "Dataset": Dataset, "DataLoader": DataLoader}
    exec(compile(lesson, "chapter 6 lesson", "exec"), namespace)
    assert CUDA_MESSAGE in namespace["message"]
    return namespace, before


def _new_workers(before: set[int]) -> list:
    return [p for p in multiprocessing.active_children() if p.pid not in before]


def test_the_check_ends_the_forked_worker_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that does not leave within the shutdown's 5 s join is killed: a kill is
    # the wait, counted without a clock (a loaded CI machine makes wall times useless).
    killed = []
    terminate = multiprocessing.process.BaseProcess.terminate
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate",
                        lambda self: (killed.append(self.pid), terminate(self)))
    namespace, before = _run_lesson()
    assert _new_workers(before), "the fake's worker is still alive after the lesson"
    _, check = _cells()
    exec(compile(check, "chapter 6 check", "exec"), namespace)
    assert not _new_workers(before), "the check cell leaves the forked worker running"
    gc.collect()  # whatever the cells left for the collector is collected now
    assert not killed, "the worker did not leave: the shutdown waited 5 s and killed it"
