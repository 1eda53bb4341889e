"""The schema of a result file (bench/schema.py): a good document passes, each kind of bad
one is refused with the problem named, and files of older versions stay valid."""

from __future__ import annotations

import copy
import json

import pytest

from bench import schema
from tests.support import result_doc


def good_doc() -> dict:
    """A document of an H100 machine, as ``python -m bench`` writes it."""
    return result_doc("gpu-nvidia-h100-80gb-hbm3-x1", device_name="NVIDIA H100 80GB HBM3")


def _set(doc, path, value):
    *parents, last = path
    target = doc
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value


def test_a_good_document_passes():
    assert schema.validate(good_doc()) == []
    schema.check(good_doc())


@pytest.mark.parametrize("path, value, message", [
    (("schema_version",), 4, "schema_version"),
    (("schema_version",), True, "schema_version"),
    (("machine", "book_commit"), KeyError, "lacks 'book_commit'"),
    (("machine", "accelerator"), None, "accelerator must be null exactly"),
    (("machine", "accelerator"), "tpu", "accelerator must be one of"),
    (("machine", "flags"), [], "flags"),
    (("date",), "yesterday", "ISO-8601"),
    (("date",), "2026-01-02T03:04:05", "UTC"),
    (("command",), "", "command"),
    (("quick",), "no", "quick"),
    (("figures",), [], "non-empty"),
    (("machine", "driver"), None, "driver"),
    (("machine", "cuda"), None, "CUDA"),
    (("machine", "gpu_count"), 2, "gpus"),
    (("machine", "slug"), "Not A Slug", "slug"),
    (("machine", "torch"), KeyError, "lacks 'torch'"),
    (("figures", 0, "value"), float("inf"), "finite"),
    (("figures", 0, "value"), True, "finite"),
    (("figures", 0, "value"), "51", "finite"),
    (("figures", 0, "spread"), -1.0, "spread"),
    (("figures", 0, "unit"), "", "unit"),
    (("figures", 0, "device"), "NVIDIA H100", "device"),
    (("figures", 0, "chapter"), None, "chapter"),
    (("figures", 0, "note"), KeyError, "lacks 'note'"),
])
def test_schema_rejects_bad_documents(path, value, message):
    doc = copy.deepcopy(good_doc())
    _set(doc, path, value)
    problems = schema.validate(doc)
    assert any(message in p for p in problems), problems
    with pytest.raises(schema.SchemaError, match=message):
        schema.check(doc)


def test_schema_rejects_a_figure_reported_twice_and_a_misnamed_file(tmp_path):
    doc = good_doc()
    doc["figures"].append(dict(doc["figures"][0]))
    assert any("twice" in p for p in schema.validate(doc))
    path = tmp_path / "other-name.json"
    path.write_text(json.dumps(good_doc()))
    assert any("named 'other-name.json'" in p for p in schema.validate_file(path))
    path.write_text("{not json")
    assert "cannot be read as JSON" in schema.validate_file(path)[0]
    assert schema.validate([]) and schema.validate({"figures": []})


def test_a_cpu_only_machine_needs_no_driver():
    doc = good_doc()
    doc["machine"].update(slug="cpu-some-cpu-16c", device_name="Some CPU", gpu_count=0, gpus=[],
                          driver=None, cuda=None, accelerator=None)
    doc["figures"][0]["device"] = "cpu"
    assert schema.validate(doc) == []


@pytest.mark.parametrize("kind, extra", [("rocm", {"hip": "6.4.1"}), ("mps", {}), ("xpu", {})])
def test_rocm_mps_and_xpu_machines_need_no_nvidia_driver(kind, extra):
    doc = good_doc()
    doc["machine"].update(accelerator=kind, driver=None, cuda=None, **extra)
    doc["figures"][0]["device"] = "cuda:0" if kind == "rocm" else f"{kind}:0"
    assert schema.validate(doc) == []
    if kind == "rocm":
        del doc["machine"]["hip"]
        assert any("HIP" in p for p in schema.validate(doc))


def test_version_1_files_stay_valid():
    doc = good_doc()
    doc["schema_version"] = 1
    for key in ("accelerator", "book_commit", "flags"):
        del doc["machine"][key]
    assert schema.validate(doc) == []
    doc["machine"].update(driver=None, cuda=None, hip="6.2")  # a ROCm run in version 1
    assert schema.validate(doc) == []


def test_version_3_names_the_tutorials_figures_and_older_files_are_read_under_those_names():
    from helpers.results import RENAMED_FIGURES, _migrate

    doc = good_doc()
    doc["figures"][0]["name"] = "seed_product_seconds"
    assert any("named 'tutorial_product_seconds' since schema version 3" in p
               for p in schema.validate(doc))
    doc["schema_version"] = 2
    assert schema.validate(doc) == []
    assert _migrate(doc)["figures"][0]["name"] == "tutorial_product_seconds"
    assert all("seed" not in new for new in RENAMED_FIGURES.values())
