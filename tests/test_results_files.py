"""Every committed result file matches the schema, and the appendix shows each one."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from bench import core, schema
from helpers import results as report
from helpers.results import load_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))
APPENDIX = ROOT / "chapters" / "appendix_results.ipynb"
APPENDIX_HTML = ROOT / "_build" / "html" / "chapters" / "appendix_results.html"


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


def test_the_appendix_tables_show_every_committed_file():
    docs = load_results(RESULTS)
    assert len(docs) == len(COMMITTED)
    check_report(docs)


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


# The report and the appendix on files the benchmark command writes for made-up machines --------

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


@pytest.mark.parametrize("gpu_machines", [0, 2])
def test_the_report_shows_every_file_the_runner_writes(tmp_path, monkeypatch, gpu_machines):
    write_results(tmp_path, monkeypatch, gpu_machines)
    docs = load_results(tmp_path)
    assert len(docs) == 1 + gpu_machines
    assert all(schema.validate_file(d["_path"]) == [] for d in docs)
    check_report(docs)
    assert report.figures_table([]).empty and report.machines_table([]).empty
    assert report.plot_workload(docs, "no such workload") is None


def test_share_of_peak_and_speed_up_over_the_host_cpu(tmp_path, monkeypatch):
    from helpers import timing

    write_results(tmp_path, monkeypatch, gpu_machines=2)
    docs = load_results(tmp_path)
    labels = [label for label, doc in zip(report.machine_labels(docs), docs, strict=True)
              if doc["machine"]["gpu_count"]]
    # made-up GPUs have no quoted peak: the cells stay empty, no share is claimed
    shares = report.peak_share_table(docs)
    assert list(shares.columns) == labels and shares.isna().all().all()
    speedups = report.speedup_table(docs)
    assert list(speedups.columns) == labels
    assert speedups.loc[("matmul", "product_seconds [s]")].tolist() == [2.0 / 0.05, 2.0 / 0.025]
    # a GPU the book knows: the share is the measured rate over the quoted peak
    gpu = docs[1]
    gpu["machine"]["device_name"] = "NVIDIA H100 80GB HBM3"
    peak = timing.peak_tflops("NVIDIA H100 80GB HBM3", "fp32")
    if peak is not None:
        share = report.peak_share_table([gpu]).iloc[0, 0]
        assert share == pytest.approx(400.0 / peak)
    monkeypatch.setattr(timing, "peak_tflops", lambda name, dtype="fp32": None)
    assert report.peak_share_table([gpu]).isna().all().all()


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
