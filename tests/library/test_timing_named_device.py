"""helpers.timing's clock and benchmark wait for the GPU they name, not the current one
(chapter 3), and a GPU the machine lacks is refused before anything runs: a stand-in CUDA
backend with two GPUs plays the machine, and the unchecked inner wait
(``timing._synchronize``) is recorded."""

from __future__ import annotations

import pytest
import torch

from helpers import timing


@pytest.fixture
def two_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> list[torch.device | None]:
    waited: list[torch.device | None] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(timing, "_synchronize", waited.append)
    return waited


def test_device_clock_waits_for_the_device_it_names(two_fake_gpus) -> None:
    clock = timing.device_clock("cuda:1")
    clock()
    assert two_fake_gpus == [torch.device("cuda:1")]


def test_benchmark_waits_for_its_own_device_before_each_reading(two_fake_gpus) -> None:
    result = timing.benchmark(lambda: None, device="cuda:1", warmup=1, min_run_time=0.01,
                              min_runs=3)
    # the warm-up's wait plus two clock readings per measurement, all on cuda:1
    assert len(two_fake_gpus) >= 1 + 2 * result.runs
    assert set(two_fake_gpus) == {torch.device("cuda:1")}


def test_a_third_gpu_of_two_is_refused(two_fake_gpus) -> None:
    with pytest.raises(ValueError, match=r"'cuda:2' does not exist.*numbered 0 to 1"):
        timing.benchmark(lambda: None, device="cuda:2")
    assert two_fake_gpus == [], "nothing ran"
