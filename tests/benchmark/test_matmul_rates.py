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
