"""The matmul workload's burst and sustained figures (chapter 3): what a result file records
beside them, and the schema's check of it."""

from __future__ import annotations

import copy

import pytest

from bench import schema
from tests.support import result_doc

GOOD = {"kind": "burst", "shape": [8192, 8192, 8192], "products": 20, "seconds": 0.0014,
        "sm_clock_mhz": 1980.0, "power_w": 612.5, "temperature_c": 41.0,
        "source": "pynvml", "missing": None, "busy": True}


def doc_with(conditions) -> dict:
    doc = result_doc("gpu-nvidia-h100-80gb-hbm3-x1", device_name="NVIDIA H100 80GB HBM3")
    fig = copy.deepcopy(doc["figures"][0])
    fig.update(name="bf16_burst_tflops", unit="TFLOP/s", conditions=conditions)
    doc["figures"].append(fig)
    return doc


def test_conditions_with_every_reading_pass():
    assert schema.validate(doc_with(GOOD)) == []


def test_conditions_with_null_readings_pass_only_with_a_reason():
    unread = dict(GOOD, sm_clock_mhz=None, power_w=None, temperature_c=None, source=None,
                  busy=None, missing="the CPU has no GPU telemetry")
    assert schema.validate(doc_with(unread)) == []
    problems = schema.validate(doc_with(dict(unread, missing=None)))
    assert any("why a reading is null" in p for p in problems), problems


@pytest.mark.parametrize("change, message", [
    ({"shape": [8192, 8192]}, "conditions.shape"),
    ({"shape": [8192, 0, 8192]}, "conditions.shape"),
    ({"power_w": -1.0}, "conditions.power_w"),
    ({"sm_clock_mhz": "1980"}, "conditions.sm_clock_mhz"),
])
def test_bad_conditions_are_refused(change, message):
    problems = schema.validate(doc_with(dict(GOOD, **change)))
    assert any(message in p for p in problems), problems


def test_conditions_must_be_an_object_and_name_every_reading():
    assert any("conditions must be an object" in p for p in schema.validate(doc_with([1])))
    lacking = {k: v for k, v in GOOD.items() if k != "temperature_c"}
    assert any("lacks ['temperature_c']" in p for p in schema.validate(doc_with(lacking)))


def test_the_quick_cpu_run_records_burst_and_sustained_with_null_telemetry():
    import torch

    from bench import matmul as bench_matmul

    figures = {f.name: f for f in bench_matmul.run(torch.device("cpu"), quick=True)}
    for kind in ("burst", "sustained"):
        row = figures[f"cpu_fp32_{kind}_gflops"].as_dict()
        cond = row["conditions"]
        assert cond["kind"] == kind and list(map(tuple, [cond["shape"]]))[0] in \
            bench_matmul.QUICK_SHAPES
        assert (cond["sm_clock_mhz"], cond["power_w"], cond["temperature_c"]) == (None,) * 3
        assert "CPU" in cond["missing"] and "quick run" in row["note"]
    burst = figures["cpu_fp32_burst_gflops"].as_dict()["conditions"]
    sustained = figures["cpu_fp32_sustained_gflops"].as_dict()["conditions"]
    assert sustained["shape"] == burst["shape"], "sustained runs at the burst's best shape"
    assert sustained["seconds"] >= bench_matmul.QUICK_SECONDS


def test_the_runner_writes_conditions_into_a_valid_result_file():
    from bench.__main__ import _figures
    from bench.core import Workload
    from bench.matmul import RateFigure

    fig = RateFigure("bf16_burst_tflops", 790.0, "TFLOP/s", "cuda:0", None, "n", dict(GOOD))
    rows = _figures(Workload("matmul", 3, lambda *a, **k: []), [fig])
    assert rows[0]["conditions"] == GOOD
    doc = doc_with(GOOD)
    doc["figures"][-1] = rows[0]
    assert schema.validate(doc) == []


def test_gpu_rate_figures_name_the_format_kind_and_share_of_peak():
    from bench.matmul import _rate_figures
    from helpers.matmul import MatmulRate, Telemetry

    rate = MatmulRate("burst", "bf16", "cuda:0", (8192, 8192, 8192), 791.5, 20, 0.0014,
                      Telemetry(1980.0, 612.5, 41.0, "pynvml", busy=True),
                      {(4096,) * 3: 700.0, (8192,) * 3: 791.5})
    figs = _rate_figures(rate, "bf16_burst_tflops", "", peak_of="NVIDIA H100 80GB HBM3")
    assert [f.name for f in figs] == ["bf16_burst_tflops", "bf16_burst_share_of_peak"]
    assert figs[0].conditions["sm_clock_mhz"] == 1980.0
    assert figs[0].conditions["shape"] == [8192, 8192, 8192]
    assert "best of 2 shapes" in figs[0].note and "1980 MHz" in figs[0].note
    assert figs[1].value == pytest.approx(791.5 / 989.4)
    unknown = _rate_figures(rate, "bf16_burst_tflops", "", peak_of="Fake GPU for tests")
    assert [f.name for f in unknown] == ["bf16_burst_tflops"], "no peak, no share"
