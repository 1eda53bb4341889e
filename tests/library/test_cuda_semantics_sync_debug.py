"""helpers.cuda_semantics.sync_debug (chapters 4, 5, 11): what it counts, on a faked CUDA torch.

A CPU has no sync-debug mode, so the tests stand in for torch's CUDA side exactly as a GPU run
showed it (torch 2.11 on an H200, ../shared/gpu-runs/2026-11-28-h200): the first
``set_sync_debug_mode`` call of a process warns "Synchronization debug mode is a prototype
feature ..." once, and each synchronising call warns (mode "warn") or raises (mode "error")
"called a synchronizing CUDA operation".
"""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import cuda_semantics
from helpers.cuda_semantics import SYNC_MESSAGE, sync_debug

PROTOTYPE = ("Synchronization debug mode is a prototype feature and does not yet detect all "
             "synchronizing operations (Triggered internally at "
             "/pytorch/torch/csrc/cuda/Module.cpp:1003.)")

# As a GPU words it: torch appends where in its C++ the warning was raised.
GPU_SYNC_WARNING = (f"{SYNC_MESSAGE} (Triggered internally at "
                    "/pytorch/c10/cuda/CUDAFunctions.cpp:170.)")


class FakeCudaTorch:
    """The sync-debug state of torch's CUDA side: a process-wide mode and a one-time notice."""

    def __init__(self, mode: int = 0) -> None:
        self.mode = mode
        self.noticed = False
        self.calls: list[int | str] = []

    def set_sync_debug_mode(self, mode: int | str) -> None:
        self.calls.append(mode)
        if not self.noticed:  # TORCH_WARN_ONCE in THCPModule_cudaSetSyncDebugMode
            self.noticed = True
            warnings.warn(PROTOTYPE, UserWarning, stacklevel=2)
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def synchronizing_call(self) -> None:
        """What ``.item()`` does on a GPU: warn_or_error_on_sync() in c10/cuda."""
        if self.mode == 2:
            raise RuntimeError(SYNC_MESSAGE)
        if self.mode == 1:
            warnings.warn(GPU_SYNC_WARNING, UserWarning, stacklevel=2)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCudaTorch:
    state = FakeCudaTorch()
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", state.set_sync_debug_mode)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", state.get_sync_debug_mode)
    monkeypatch.setattr(cuda_semantics, "resolve_device", lambda device: torch.device(device))
    return state


def test_a_block_that_waits_for_nothing_counts_no_synchronisation(fake: FakeCudaTorch) -> None:
    # The first GPU run counted torch's one-time notice as a synchronisation (chapter 4 printed
    # "loss kept on the device: 1 synchronisation(s)"): the notice is not a call.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anything passed on to the page fails here
        with sync_debug("cuda", "warn") as calls:
            pass
    assert calls == []
    assert fake.noticed, "the fake really issued the notice"


def test_each_synchronising_call_is_counted_once(fake: FakeCudaTorch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sync_debug("cuda:0", "warn") as first:
            fake.synchronizing_call()
        with sync_debug("cuda:0", "warn") as second:
            fake.synchronizing_call()
            fake.synchronizing_call()
    assert first == [GPU_SYNC_WARNING] and second == [GPU_SYNC_WARNING, GPU_SYNC_WARNING]


def test_error_mode_raises_inside_the_block_and_restores_the_mode(fake: FakeCudaTorch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the notice must not reach the page in "error" mode
        with pytest.raises(RuntimeError, match=SYNC_MESSAGE):
            with sync_debug("cuda", "error"):
                assert fake.mode == 2
                fake.synchronizing_call()
    assert fake.mode == 0 and fake.calls == ["error", 0]


def test_the_mode_in_force_before_is_restored(fake: FakeCudaTorch) -> None:
    fake.mode = 1  # a reader had set "warn" process-wide
    with sync_debug("cuda", "error"):
        assert fake.mode == 2
    assert fake.mode == 1


def test_other_warnings_of_the_block_reach_the_caller(fake: FakeCudaTorch) -> None:
    with pytest.warns(DeprecationWarning, match="something else"):
        with sync_debug("cuda") as calls:
            warnings.warn("something else", DeprecationWarning, stacklevel=1)
            fake.synchronizing_call()
    assert calls == [GPU_SYNC_WARNING]


@pytest.mark.parametrize("device", ["cpu", "meta", "mps"])
def test_a_device_that_is_not_cuda_is_refused_with_what_to_do(device: str) -> None:
    with pytest.raises(ValueError, match="sync-debug mode needs a CUDA device.*'cuda'"):
        with sync_debug(device):
            pass


def test_a_mode_that_lists_nothing_is_refused(fake: FakeCudaTorch) -> None:
    with pytest.raises(ValueError, match="mode must be 'warn'.*or 'error'"):
        with sync_debug("cuda", "default"):
            pass
    assert fake.calls == [], "nothing was set"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_only_the_read_is_a_synchronisation() -> None:
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize("cuda")
    with sync_debug("cuda") as quiet:
        y = (x * 2).sum()
    with sync_debug("cuda") as read:
        y.item()
    assert quiet == [] and len(read) == 1
