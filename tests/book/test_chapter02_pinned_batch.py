"""Chapter 2's pinned-batch lesson and its hidden check, run as a CUDA GPU runs them.

On a CUDA GPU the loader pins its batch (``is_pinned()`` is True) and ``.to(device)`` returns a
CUDA tensor, whose ``is_pinned()`` is False (pinning is a property of host memory). The first
GPU run (H200, torch 2.11) failed because the check asked the *moved* batch whether it was
pinned. Here the loader and the copy are faked the way CUDA behaves, so the CPU proves the
check holds on a GPU, and the real CPU path runs too.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.data

from tests.conftest import ROOT
from tests.support import lesson_and_check

NOTEBOOK = ROOT / "chapters" / "02_moving_tensors.ipynb"


def _cells() -> tuple[str, str]:
    lesson, check = lesson_and_check(NOTEBOOK, "DataLoader(data, batch_size=16, pin_memory=pin)")
    assert check.startswith("# Check:")
    return lesson, check


class _OnGpu:
    """A batch after ``.to(cuda)``: on the GPU, so not pinned (GPU memory never is)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def is_pinned(self) -> bool:
        return False


class _Pinned:
    """The loader's batch with ``pin_memory=True`` on a CUDA machine: pinned host memory."""

    device = torch.device("cpu")

    def is_pinned(self) -> bool:
        return True

    def to(self, device, non_blocking=False):
        assert non_blocking, "from pinned memory the chapter copies without blocking"
        return _OnGpu(torch.device(device))


class _CudaLoader:
    def __init__(self, data, batch_size, pin_memory):
        assert pin_memory, "on a CUDA GPU the chapter asks the loader to pin"

    def __iter__(self):
        return iter([(_Pinned(), _Pinned())])


def test_the_check_holds_on_a_cuda_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    lesson, check = _cells()
    monkeypatch.setattr(torch.utils.data, "DataLoader", _CudaLoader)
    namespace = {"torch": torch, "device": torch.device("cuda", 0)}
    exec(compile(lesson, "chapter 2 lesson", "exec"), namespace)
    assert namespace["xb"].device == torch.device("cuda", 0)
    assert not namespace["xb"].is_pinned(), "the fake behaves as CUDA does"
    exec(compile(check, "chapter 2 check", "exec"), namespace)


def test_the_check_holds_on_the_cpu() -> None:
    lesson, check = _cells()
    namespace = {"torch": torch, "device": torch.device("cpu")}
    exec(compile(lesson, "chapter 2 lesson", "exec"), namespace)
    exec(compile(check, "chapter 2 check", "exec"), namespace)


def test_the_check_refuses_an_unpinned_batch_on_a_gpu(monkeypatch) -> None:
    """Still strict: a loader that did not pin fails the check on a CUDA GPU."""
    lesson, check = _cells()
    monkeypatch.setattr(_Pinned, "is_pinned", lambda self: False)
    monkeypatch.setattr(torch.utils.data, "DataLoader", _CudaLoader)
    namespace = {"torch": torch, "device": torch.device("cuda", 0)}
    exec(compile(lesson, "chapter 2 lesson", "exec"), namespace)
    with pytest.raises(AssertionError):
        exec(compile(check, "chapter 2 check", "exec"), namespace)
