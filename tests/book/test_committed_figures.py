"""Each chapter with a benchmark workload shows the committed GPU figures in its executed
output: checked on the oldest-torch run (`make oldest`), which reads the fake GPU result file
tests/fixtures/fake-gpu-result.json next to the committed ones."""

from __future__ import annotations

import json
import re

import nbformat
import pytest

from tests.conftest import ROOT

OLDEST = ROOT / "_oldest"
FAKE = ROOT / "tests" / "fixtures" / "fake-gpu-result.json"
#: chapter file stem -> the workload whose committed figures it must show
CHAPTERS = {"03_matmul": "matmul", "04_linear_regression": "regression", "05_mnist": "mnist",
            "10_trainers": "mnist", "11_cuda_semantics": "cuda_semantics",
            "12_performance": "recipes", "14_fast_mnist": "fast_mnist"}
_NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")


def fake_doc() -> dict:
    return json.loads(FAKE.read_text())


def numbers_in(text: str) -> list[float]:
    found = []
    for match in _NUMBER.findall(text):
        try:
            found.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return found


def shown_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            data = out.get("data", {})
            parts.append(str(data.get("text/plain", "")) + str(data.get("text/html", "")))
    return "\n".join(parts)


def shows_value(text: str, value: float) -> bool:
    """Whether ``value`` appears in ``text`` in any of the ways pandas or print may round it."""
    return any(abs(n - value) <= 1e-3 * abs(value) for n in numbers_in(text))


def test_the_fake_result_file_is_valid_and_clearly_fake():
    from bench import schema

    doc = fake_doc()
    assert schema.validate_file(FAKE) == []
    assert doc["machine"]["device_name"] == "Fake GPU for tests"
    assert {f["workload"] for f in doc["figures"]} >= set(CHAPTERS.values())
    assert all(f["device"] != "cpu" for f in doc["figures"])


def test_shows_value_reads_pandas_formatting():
    import pandas as pd

    table = pd.DataFrame({"m": [0.0012345, 271.828, 123456.0]})
    text = table.to_string() + table.to_html()
    assert all(shows_value(text, v) for v in table["m"])
    assert not shows_value(text, 31.4159)


@pytest.fixture(scope="module")
def oldest_run(request) -> None:
    if not (OLDEST / ".done").exists():
        message = "the oldest-torch run is missing: run `make oldest` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    copied = OLDEST / "results" / FAKE.name
    assert copied.exists() and copied.read_text() == FAKE.read_text(), \
        "the oldest-torch run did not read the current fake GPU result file"


@pytest.mark.book
@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_each_chapter_shows_the_committed_gpu_figures(oldest_run, stem):
    path = OLDEST / "chapters" / f"{stem}.ipynb"
    assert path.exists(), f"{path} was not executed by make oldest"
    text = shown_text(nbformat.read(path, as_version=4))
    doc = fake_doc()
    assert "Fake GPU for tests x1" in text, f"{stem} does not name the committed GPU machine"
    assert "driver 000.00-fake" in text, f"{stem} does not show the machine's versions"
    values = [f["value"] for f in doc["figures"] if f["workload"] == CHAPTERS[stem]]
    assert any(shows_value(text, v) for v in values), \
        f"{stem} names the fake GPU but shows none of its {CHAPTERS[stem]} figures {values}"
