"""Every committed result file matches the schema, and the appendix shows each one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import core, schema
from helpers import results as report
from helpers.results import load_results
from tests.conftest import ROOT  # noqa: E402

RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))
APPENDIX = ROOT / "chapters" / "appendix_results.ipynb"
APPENDIX_HTML = ROOT / "_build" / "html" / "chapters" / "appendix_results.html"


def check_report(docs: list[dict]) -> None:
    """What the appendix renders: a column per file, every figure, every machine named."""
    machines = report.machines_table(docs)
    assert list(machines.columns) == report.machine_labels(docs)
    for doc, label in zip(docs, report.machine_labels(docs), strict=True):
        assert machines.loc["device", label] == doc["machine"]["device_name"]
        assert machines.loc["torch", label] == doc["machine"]["torch"]
    table = report.figures_table(docs)
    assert report.missing_figures(docs, table) == []
    assert len(table) == len({(f["workload"], f["name"], f["unit"])
                              for d in docs for f in d["figures"]})
    gpu_labels = [label for label, doc in zip(report.machine_labels(docs), docs, strict=True)
                  if doc["machine"]["gpu_count"]]
    shares = report.peak_share_table(docs)
    speedups = report.speedup_table(docs)
    assert set(shares.columns) <= set(gpu_labels) and set(speedups.columns) <= set(gpu_labels)
    for name in report.workloads(docs):
        fig = report.plot_workload(docs, name)
        legend = {t.get_text() for t in fig.legends[0].get_texts()}
        for doc, label in zip(docs, report.machine_labels(docs), strict=True):
            if any(f["workload"] == name for f in doc["figures"]):
                assert any(text.startswith(label) for text in legend), (name, label)


FAKE_GPU = {"index": 0, "name": "Example GPU 80GB", "capability": "9.0", "memory_gib": 79.1,
            "multiprocessors": 132}


def write_results(folder: Path, monkeypatch: pytest.MonkeyPatch, gpu_machines: int = 1) -> None:
    """Run the real runner on fake workloads: this machine's CPU, plus made-up GPU machines."""
    from bench import __main__ as runner

    real_info = core.machine_info()
    with monkeypatch.context() as m:
        m.setattr(core, "WORKLOADS", {})
        m.setattr(runner, "load_workload_modules", lambda package=None: [])
        state = {"gpu": False, "scale": 1.0}

        @core.workload("matmul", 3)
        def matmul(device, *, quick):
            figs = [core.Figure("fp32 1024x1024 time", 0.02 / state["scale"], "s", "cpu",
                                spread=0.001),
                    core.Figure("fp32 1024x1024", 0.1 * state["scale"], "TFLOP/s", "cpu")]
            if state["gpu"]:
                figs.append(core.Figure("fp32 1024x1024", 50.0 * state["scale"], "TFLOP/s",
                                        "cuda:0", spread=0.4))
                figs.append(core.Figure("fp32_tflops_n1024", 40.0 * state["scale"], "TFLOP/s",
                                        "cuda:0"))
                figs.append(core.Figure("cpu_product_seconds", 2.0, "s", "cpu"))
                figs.append(core.Figure("product_seconds", 0.5 / state["scale"], "s", "cuda:0"))
            return figs

        @core.workload("mnist", 5)
        def mnist(device, *, quick):
            dev = "cuda:0" if state["gpu"] else "cpu"
            return [core.Figure("images per second", 900.0 * state["scale"], "images/s", dev)]

        assert runner.main(["--no-progress", "--out", str(folder)]) == 0
        state["gpu"] = True
        for i in range(gpu_machines):
            state["scale"] = 10.0 * (i + 1)
            gpu = {**FAKE_GPU, "name": f"Example GPU {i + 1} 80GB"}
            m.setattr(core, "machine_info", lambda gpu=gpu: {
                **real_info, "device_name": gpu["name"], "gpu_count": 1, "gpus": [gpu],
                "driver": "570.1", "cuda": "12.8", "cudnn": 90100, "accelerator": "cuda"})
            assert runner.main(["--no-progress", "--out", str(folder)]) == 0


def test_results_holds_only_result_files():
    if not RESULTS.exists():
        pytest.skip("no results/ folder yet")
    others = [p.name for p in RESULTS.iterdir()
              if p.suffix != ".json" and p.name not in (".gitkeep", "pages")]
    assert not others, f"results/ holds files the benchmark did not write: {others}"
    # results/pages/<machine>/<chapter>.ipynb: the GPU report's recorded pages, nothing else
    pages = RESULTS / "pages"
    if pages.exists():
        strays = [p.relative_to(RESULTS).as_posix() for p in pages.rglob("*")
                  if p.is_file() and (p.suffix != ".ipynb" or p.parent.parent != pages)]
        assert not strays, f"results/pages/ holds files the GPU report did not write: {strays}"


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_file_matches_the_schema(path: Path):
    assert schema.validate_file(path) == []
    doc = json.loads(path.read_text())
    assert doc["quick"] is False, "quick runs are smoke tests and are never committed"
    assert doc["command"].startswith("python -m bench"), doc["command"]
    assert "--only" not in doc["command"], "a committed file comes from a run of every workload"


@pytest.mark.parametrize("gpu_machines", [0, 2])
def test_the_report_shows_every_file_the_runner_writes(tmp_path, monkeypatch, gpu_machines):
    write_results(tmp_path, monkeypatch, gpu_machines)
    docs = load_results(tmp_path)
    assert len(docs) == 1 + gpu_machines
    assert all(schema.validate_file(d["_path"]) == [] for d in docs)
    check_report(docs)
    assert report.figures_table([]).empty and report.machines_table([]).empty
    assert report.plot_workload(docs, "no such workload") is None
