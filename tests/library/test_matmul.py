"""The ``matmul`` and ``regression`` benchmark workloads (chapters 3 and 4), quick runs on the CPU."""

from __future__ import annotations

import types

import pytest
import torch

from helpers import matmul


def test_fp32_precision_restores_the_setting() -> None:
    before = torch.backends.cuda.matmul.fp32_precision
    with matmul.fp32_precision("tf32"):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before
    with pytest.raises(ValueError):
        with matmul.fp32_precision("fp16"):
            pass


def test_time_matmul_with_and_without_copy_on_cpu() -> None:
    for include_copy in (False, True):
        timing, tf = matmul.time_matmul(64, 32, 16, "cpu", include_copy=include_copy,
                                              warmup=1, min_run_time=0.01)
        assert timing.median > 0 and tf > 0
    assert matmul.supported_modes("cpu") == ["fp32"]
    with pytest.raises(ValueError):
        matmul.time_matmul(4, 4, 4, "cpu", mode="fp8")


def test_sweep_sizes_keep_a_tenth_of_the_named_gpus_memory(monkeypatch) -> None:
    # cuda:0 a T4 (15 GB), cuda:1 an H100 (80 GB): the rule asks the GPU it is given.
    totals = {0: 15_637_086_208, 1: 85_045_231_616}
    asked = []

    def properties(device=None):
        index = torch.device(device).index
        asked.append(index)
        return types.SimpleNamespace(total_memory=totals[index])

    # Two fake GPUs, whatever this host has: with the real count a one-GPU host has no
    # cuda:1 (and a CPU-only host's count of 0 would only hide that).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    t4 = matmul.sweep_sizes("cuda:0")
    h100 = matmul.sweep_sizes(torch.device("cuda:1"))
    assert asked == [0, 1]
    assert t4[-1] == 8192 and h100[-1] == 16384  # 3 * 16384**2 * 4 bytes = 3 GiB
    assert t4 == [s for s in matmul.SWEEP_SIZES if s <= 8192]
    for total, sizes in ((totals[0], t4), (totals[1], h100)):
        assert all(3 * s * s * 4 <= total / 10 for s in sizes)
    assert matmul.sweep_sizes("cuda:0", [1024, 4096, 8192, 16384]) == [1024, 4096, 8192]


def test_sweep_sizes_on_a_mac_and_where_memory_is_unknown(monkeypatch) -> None:
    # An 8 GB Mac: Metal recommends about 5.3 GiB for one process, so 16384 (3 GiB) is out.
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 5_726_633_984)
    assert matmul.sweep_sizes("mps")[-1] == 4096
    assert matmul.sweep_sizes("cpu")[-1] == matmul.UNKNOWN_MEMORY_LARGEST
    with pytest.raises(ValueError, match="positive"):
        matmul.sweep_sizes("cpu", [0, 64])
    with pytest.raises(ValueError, match="positive"):
        matmul.sweep_sizes("cpu", [])


def test_time_matmul_with_a_fresh_output_too() -> None:
    timing, tf = matmul.time_matmul(64, 32, 16, "cpu", preallocate=False, warmup=1,
                                          min_run_time=0.01, min_runs=2)
    assert timing.runs >= 2 and tf > 0
    assert matmul.supported_modes("meta") == ["fp32"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_supported_modes_ask_about_the_named_gpu() -> None:
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        ampere = torch.cuda.get_device_capability(device) >= (8, 0)
        modes = matmul.supported_modes(device)
        assert ("tf32" in modes) == ampere, (device, modes)
        assert ("bf16" in modes) == (ampere or bool(torch.version.hip)), (device, modes)


