"""Helpers the book's tests share (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import core
from helpers import results as report


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
        if fig is None:  # nothing to compare: the figures stay in the table
            assert not report.plot_panels(docs, name), name
            continue
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
