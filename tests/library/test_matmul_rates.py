"""Burst and sustained matmul rates and the GPU telemetry beside them (chapter 3): run small
on the CPU, and the GPU branches with fakes (torch.cuda's pynvml readings, nvidia-smi's
output, CUDA events)."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import matmul

SMALL = [(64, 64, 64), (96, 96, 96)]
FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake-gpu-result.json"


def test_the_cpu_has_no_telemetry_and_says_so():
    reading = matmul.gpu_telemetry("cpu")
    assert (reading.sm_clock_mhz, reading.power_w, reading.temperature_c) == (None,) * 3
    assert reading.source is None and "CPU" in reading.missing
    assert "no telemetry" in str(reading)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine whose torch says it has one CUDA GPU, cuda:0, with a known UUID."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(matmul, "_device", lambda d: torch.device(d))
    monkeypatch.setattr(torch.version, "hip", None)
    props = types.SimpleNamespace(uuid="5f1c2d3e-0000-1111-2222-333344445555")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    return monkeypatch


def test_telemetry_through_torch_cuda_converts_milliwatts(fake_cuda):
    asked = []

    def reading(value):
        def read(device=None):
            asked.append(torch.device(device))
            return value
        return read

    fake_cuda.setattr(torch.cuda, "clock_rate", reading(1980))
    fake_cuda.setattr(torch.cuda, "power_draw", reading(612_500))  # NVML: milliwatts
    fake_cuda.setattr(torch.cuda, "temperature", reading(41))
    got = matmul.gpu_telemetry("cuda:0", run=pytest.fail)  # nvidia-smi is not needed
    assert (got.sm_clock_mhz, got.power_w, got.temperature_c) == (1980.0, 612.5, 41.0)
    assert got.source == "pynvml" and got.missing is None
    assert asked == [torch.device("cuda:0")] * 3, "each reading names the device"


def _no_pynvml(device=None):
    raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed or it can't be "
                              "imported.")


SMI = ("GPU-0a0a0a0a-9999-9999-9999-999999999999, 1410, 80.25, 30\n"
       "GPU-5F1C2D3E-0000-1111-2222-333344445555, 1755, 699.10, 63\n")


def fake_smi(stdout=SMI, error=None):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if error is not None:
            raise error
        return subprocess.CompletedProcess(cmd, 0, stdout=stdout, stderr="")

    run.calls = calls
    return run


def test_without_pynvml_nvidia_smi_reads_this_gpus_row(fake_cuda):
    for name in ("clock_rate", "power_draw", "temperature"):
        fake_cuda.setattr(torch.cuda, name, _no_pynvml)
    run = fake_smi()
    got = matmul.gpu_telemetry("cuda:0", run=run)
    assert run.calls == [list(matmul.NVIDIA_SMI_QUERY)]
    assert "clocks.sm,power.draw,temperature.gpu" in run.calls[0][1]
    assert (got.sm_clock_mhz, got.power_w, got.temperature_c) == (1755.0, 699.1, 63.0)
    assert got.source == "nvidia-smi" and got.missing is None


def test_nvidia_smi_readings_it_lacks_are_null_with_the_reason(fake_cuda):
    fake_cuda.setattr(torch.cuda, "clock_rate", _no_pynvml)
    got = matmul.gpu_telemetry(
        "cuda:0", run=fake_smi("GPU-5f1c2d3e-0000-1111-2222-333344445555, 1755, [N/A], 63\n"))
    assert got.power_w is None and got.sm_clock_mhz == 1755.0
    assert got.missing == "nvidia-smi reports no power.draw"


def test_one_gpu_without_a_uuid_match_is_still_this_one(fake_cuda):
    fake_cuda.setattr(torch.cuda, "clock_rate", _no_pynvml)
    fake_cuda.setattr(torch.cuda, "get_device_properties", lambda d=None: object())
    got = matmul.gpu_telemetry("cuda:0", run=fake_smi("GPU-1, 1200, 50, 40\n"))
    assert got.sm_clock_mhz == 1200.0
    two = matmul.gpu_telemetry("cuda:0", run=fake_smi(SMI))  # two rows, no UUID: no guess
    assert two.source is None and "none with cuda:0's UUID" in two.missing


@pytest.mark.parametrize("error, words", [
    (FileNotFoundError("nvidia-smi"), "not on PATH"),
    (subprocess.CalledProcessError(9, "nvidia-smi"), "exit status 9"),
    (subprocess.TimeoutExpired("nvidia-smi", 10), "within 10 s"),
])
def test_neither_source_gives_nulls_and_both_reasons(fake_cuda, error, words):
    fake_cuda.setattr(torch.cuda, "clock_rate", _no_pynvml)
    got = matmul.gpu_telemetry("cuda:0", run=fake_smi(error=error))
    assert (got.sm_clock_mhz, got.power_w, got.temperature_c, got.source) == (None,) * 4
    assert "ModuleNotFoundError" in got.missing and words in got.missing


def test_rocm_reads_watts_from_amdsmi_and_never_runs_nvidia_smi(fake_cuda):
    fake_cuda.setattr(torch.version, "hip", "6.4")
    fake_cuda.setattr(torch.cuda, "clock_rate", lambda d=None: 2100)
    fake_cuda.setattr(torch.cuda, "power_draw", lambda d=None: 550)  # amdsmi: watts
    fake_cuda.setattr(torch.cuda, "temperature", lambda d=None: 55)
    got = matmul.gpu_telemetry("cuda:0", run=pytest.fail)
    assert (got.power_w, got.source) == (550.0, "amdsmi")
    fake_cuda.setattr(torch.cuda, "clock_rate", lambda d=None: 0)  # amdsmi's "N/A"
    fake_cuda.setattr(torch.cuda, "power_draw", lambda d=None: 0)
    unread = matmul.gpu_telemetry("cuda:0", run=pytest.fail)
    assert (unread.sm_clock_mhz, unread.power_w, unread.temperature_c) == (None, None, 55.0)
    assert unread.missing == "amdsmi reports no clock or power draw"
    fake_cuda.setattr(torch.cuda, "clock_rate", _no_pynvml)
    failed = matmul.gpu_telemetry("cuda:0", run=pytest.fail)
    assert failed.source is None and "clock_rate failed" in failed.missing


def test_burst_and_sustained_on_the_cpu():
    burst = matmul.burst_rate("cpu", "fp32", SMALL, products=8, idle=0.0)
    assert burst.kind == "burst" and burst.shape in SMALL and set(burst.searched) == set(SMALL)
    assert burst.tflops == max(burst.searched.values()) > 0
    assert burst.products > matmul.BURST_FASTEST
    assert burst.telemetry.source is None and burst.telemetry.missing
    sustained = matmul.sustained_rate("cpu", "fp32", burst.shape, seconds=0.05)
    assert sustained.kind == "sustained" and sustained.shape == burst.shape
    assert sustained.seconds >= 0.05 and sustained.products >= 1
    m, n, k = burst.shape
    rate = sustained.products * 2 * m * n * k / sustained.seconds / 1e12
    assert sustained.tflops == pytest.approx(rate)
    assert "median of the 5 fastest" in burst.describe()
    assert "back-to-back" in sustained.describe()


@pytest.mark.parametrize("call, words", [
    (lambda: matmul.burst_rate("cpu", "fp8", SMALL), "unknown mode"),
    (lambda: matmul.burst_rate("cpu", "fp32", []), "shapes"),
    (lambda: matmul.burst_rate("cpu", "fp32", [(64, 64)]), "shapes"),
    (lambda: matmul.burst_rate("cpu", "fp32", SMALL, products=5), "products"),
    (lambda: matmul.burst_rate("meta", "fp32", SMALL), "meta"),
    (lambda: matmul.sustained_rate("cpu", "fp32", (64, 64), seconds=1), "shape"),
    (lambda: matmul.sustained_rate("cpu", "fp32", (64, 64, 64), seconds=0), "seconds"),
])
def test_bad_arguments_are_refused(call, words):
    with pytest.raises(ValueError, match=words):
        call()


class FakeEvent:
    """A CUDA event that records the host clock; query() answers what the test set."""

    done = False
    synced = 0

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        import time

        self.at = time.perf_counter()

    def query(self):
        return FakeEvent.done

    def synchronize(self):
        FakeEvent.synced += 1

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@pytest.fixture
def fake_events(fake_cuda):
    FakeEvent.done, FakeEvent.synced = False, 0
    fake_cuda.setattr(torch.cuda, "Event", FakeEvent)
    fake_cuda.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    fake_cuda.setattr(matmul, "_synchronize", lambda device: None)
    real = matmul._operands
    fake_cuda.setattr(matmul, "_operands", lambda shape, device, mode:
                      real(shape, torch.device("cpu"), mode))
    return fake_cuda


def test_a_cuda_burst_times_each_product_with_events_and_notes_if_still_busy(fake_events):
    seen = []

    def telemetry(device):
        seen.append((device, FakeEvent.synced))
        return matmul.Telemetry(1980.0, 600.0, 40.0, "pynvml")

    burst = matmul.burst_rate("cuda:0", "bf16", SMALL, products=7, idle=0.0,
                              telemetry=telemetry)
    assert [device for device, _ in seen] == [torch.device("cuda:0")] * len(SMALL)
    # Read once the middle product has finished (past the clock's ramp from idle), not as
    # soon as the burst is queued: one event waited on before each shape's reading.
    assert [synced for _, synced in seen] == [2 * i + 1 for i in range(len(SMALL))]
    assert burst.telemetry.busy is True, "the last event had not completed: still busy"
    assert burst.products in (6, 7) and burst.seconds > 0
    FakeEvent.done = True
    idle = matmul.burst_rate("cuda:0", "bf16", SMALL[:1], products=7, idle=0.0,
                             telemetry=telemetry)
    assert idle.telemetry.busy is False
    unread = matmul.burst_rate("cuda:0", "bf16", SMALL[:1], products=7, idle=0.0,
                               telemetry=lambda d: matmul.Telemetry(missing="no pynvml"))
    assert unread.telemetry.busy is None, "nothing read, so nothing to say about it"


def test_a_cuda_sustained_run_keeps_chunks_queued_and_reads_telemetry_once(fake_events):
    reads = []
    rate = matmul.sustained_rate("cuda:0", "fp32", (64, 64, 64), seconds=0.3,
                                 telemetry=lambda d: reads.append(d) or
                                 matmul.Telemetry(1755.0, 699.0, 63.0, "nvidia-smi"))
    assert reads == [torch.device("cuda:0")]
    assert rate.telemetry.busy is True and rate.telemetry.sm_clock_mhz == 1755.0
    assert rate.seconds >= 0.3 and rate.products > 0


def test_rates_table_shows_bursts_only_where_measured():
    from helpers import results

    h200 = results.load_results()
    fake = json.loads(FAKE.read_text())
    fake["_path"] = str(FAKE)
    table = matmul.rates_table([*h200, fake])
    assert "Fake GPU for tests x1, bf16" in table.columns
    column = table["Fake GPU for tests x1, bf16"]
    assert column["burst TFLOP/s"] == 662.607 and column["sustained TFLOP/s"] == 602.214
    assert column["sustained from"] == "sustained run"
    assert column["burst SM clock MHz"] == 1980.0 and column["sustained SM clock MHz"] == 1755.0
    assert column["burst shape"] == "8192x8192x8192"
    # Each committed GPU file: a burst where that run measured one, its own value, else
    # an empty cell and the size sweep standing in (files written before bursts existed).
    checked = 0
    for doc in h200:
        if not doc["machine"].get("gpu_count"):
            continue
        label = results.machine_label(doc)
        figs = {f["name"]: f["value"] for f in doc["figures"]
                if f.get("workload") == "matmul" and f.get("device") != "cpu"}
        for column in [c for c in table.columns if c.startswith(f"{label}, ")]:
            mode = column.rsplit(", ", 1)[1]
            burst = figs.get(f"{mode}_burst_tflops")
            if burst is None:
                assert pd.isna(table.loc["burst TFLOP/s", column]), column
                assert table.loc["sustained from", column].startswith("size sweep, n = ")
            else:
                assert table.loc["burst TFLOP/s", column] == burst, column
                assert table.loc["sustained TFLOP/s", column] == figs[f"{mode}_sustained_tflops"]
                assert table.loc["sustained from", column] == "sustained run", column
            checked += 1
    assert checked >= 1, "no committed GPU file's column was checked"
    assert matmul.rates_table([]).empty


def test_a_cpu_sustained_run_stops_soon_after_its_seconds_however_slow_a_product_gets(
        monkeypatch):
    """Products that slow down after the first (other processes on the cores) must not
    stretch the run: the CPU checks the clock after every product."""
    import time

    real = torch.matmul
    calls = []

    def slow_after_two(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            time.sleep(0.02)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", slow_after_two)
    rate = matmul.sustained_rate("cpu", "fp32", (32, 32, 32), seconds=0.1)
    assert rate.seconds < 0.5, "a few products past its seconds at most (the old chunks: 200 s)"
