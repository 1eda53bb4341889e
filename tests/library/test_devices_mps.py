"""Apple GPUs (mps) through a stand-in: the helpers name mps with its index, as its tensors do.

No Mac runs these tests, so ``_type_available`` / ``_type_count`` are replaced to describe one;
what an mps tensor reports is read from the installed torch (ATen's MPSGuardImpl).
"""

from pathlib import Path

import pytest
import torch

from helpers import devices

TORCH = Path(torch.__file__).parent


@pytest.fixture
def mac(monkeypatch):
    """This machine as a Mac: one Apple GPU and the CPU, no CUDA or XPU."""
    monkeypatch.setattr(devices, "_type_available", lambda kind: kind in ("mps", "cpu"))
    monkeypatch.setattr(devices, "_type_count", lambda kind: 1 if kind in ("mps", "cpu") else 0)
    monkeypatch.delenv(devices.DEVICE_ENV_VAR, raising=False)


def test_an_index_less_device_is_not_equal_to_index_zero():
    # Why the helpers must fill the index in: torch compares type and index.
    assert torch.device("mps") != torch.device("mps:0")
    assert torch.device("mps", 0) == torch.device("mps:0")


def test_mps_tensors_report_index_zero_in_the_installed_torch():
    # Every MPS device, stream and tensor is Device(MPS, 0) in ATen's MPS guard.
    guard = (TORCH / "include" / "ATen" / "mps" / "MPSGuardImpl.h").read_text()
    assert guard.count("Device(c10::DeviceType::MPS, 0)") >= 3
    assert "Device(c10::DeviceType::MPS, 1)" not in guard


def test_resolve_device_fills_the_mps_index(mac):
    for spec in ("mps", "mps:0", torch.device("mps"), " mps "):
        resolved = devices.resolve_device(spec)
        assert resolved == torch.device("mps", 0) and str(resolved) == "mps:0", spec


def test_available_and_best_device_name_mps_0(mac, monkeypatch):
    assert devices.available_devices() == ["mps:0", "cpu"]
    assert devices.best_device() == torch.device("mps:0")
    # Chapter 1: a tensor moved to the chosen device reports that device.
    assert devices.best_device() == torch.device("mps", 0)
    monkeypatch.setenv(devices.DEVICE_ENV_VAR, "mps")
    assert str(devices.best_device()) == "mps:0"


@pytest.mark.parametrize("spec", ["mps:1", "mps:2", torch.device("mps", 1)])
def test_a_second_apple_gpu_is_refused(mac, spec):
    with pytest.raises(ValueError) as err:
        devices.resolve_device(spec)
    message = str(err.value)
    assert str(spec) in message and "mps:0" in message and "numbered 0 to 0" in message


def test_gpu_on_a_mac_suggests_mps(mac):
    with pytest.raises(ValueError, match="did you mean 'mps'"):
        devices.resolve_device("gpu")


def test_describe_devices_lists_mps_0(mac):
    assert "  mps:0   Apple GPU" in devices.describe_devices("mps")
