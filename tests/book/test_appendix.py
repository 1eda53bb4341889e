"""Every committed result file matches the schema, and the appendix shows each one."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from bench import core
from helpers.results import load_results
from tests.conftest import ROOT  # noqa: E402

RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))
APPENDIX = ROOT / "chapters" / "appendix_results.ipynb"
APPENDIX_HTML = ROOT / "_build" / "html" / "chapters" / "appendix_results.html"


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


@pytest.mark.book
def test_the_built_appendix_names_every_machine():
    if not APPENDIX_HTML.exists():
        pytest.skip("the book is not built (make book)")
    built = APPENDIX_HTML.stat().st_mtime
    if any(p.stat().st_mtime > built for p in [*COMMITTED, APPENDIX]):
        pytest.skip("the built book is older than results/ or the appendix (make book)")
    page = APPENDIX_HTML.read_text()
    assert f"{len(COMMITTED)} result file(s)" in page
    for doc in load_results(RESULTS):
        m = doc["machine"]
        assert html.escape(m["device_name"]) in page, f"the appendix does not show {m['slug']}"
        assert f"results/{m['slug']}.json" in page


@pytest.mark.slow
@pytest.mark.parametrize("gpu_machines", [None, 2])
def test_the_appendix_executes_and_names_every_machine(tmp_path, monkeypatch, gpu_machines):
    """The appendix notebook itself, on no result files and on three machines' files."""
    import nbformat
    from nbclient import NotebookClient

    folder = tmp_path / "results"
    folder.mkdir()
    if gpu_machines is not None:
        write_results(folder, monkeypatch, gpu_machines)
    docs = load_results(folder)
    monkeypatch.setenv("BOOK_RESULTS_DIR", str(folder))
    nb = nbformat.read(APPENDIX, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()
    text = []
    images = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
            assert out.get("name") != "stderr", out.get("text")
            text.append(out.get("text", ""))
            data = out.get("data", {})
            text.append(data.get("text/html", "") + data.get("text/plain", ""))
            images += "image/png" in data
    shown = "\n".join(text)
    assert "Warning" not in shown and "deprecated" not in shown
    assert f"{len(docs)} result file(s)" in shown
    for doc in docs:
        assert html.escape(doc["machine"]["device_name"]) in shown
    assert images == (2 if docs else 0)  # matmul and mnist
