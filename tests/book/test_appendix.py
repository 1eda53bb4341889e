"""The appendix shows every result file: the built page names each committed machine, and the
appendix notebook, executed on no result files and on three machines' files, names each
machine, plots each workload it can, and shows no warning, error or stderr output. (The
committed files' schema is checked in tests/benchmark/test_committed_results.py.)"""

from __future__ import annotations

import html

import pytest

from helpers import results as report
from helpers.results import load_results
from tests.conftest import ROOT
from tests.support import write_results

RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))
APPENDIX = ROOT / "chapters" / "appendix_results.ipynb"
APPENDIX_HTML = ROOT / "_build" / "html" / "chapters" / "appendix_results.html"


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


@pytest.fixture(scope="module")
def appendix_kernel():
    """One kernel for both runs of the appendix: the first run gets it fresh (what a reader
    gets), the second skips starting Python and importing torch, pandas and matplotlib again."""
    from jupyter_client.manager import AsyncKernelManager
    from nbclient.util import run_sync

    km = AsyncKernelManager(kernel_name="python3")
    yield km
    if km.has_kernel:
        run_sync(km.shutdown_kernel)(now=True)


@pytest.mark.slow
@pytest.mark.parametrize("gpu_machines", [None, 2])
def test_the_appendix_executes_and_names_every_machine(tmp_path, monkeypatch, gpu_machines,
                                                       appendix_kernel):
    """The appendix notebook itself, on no result files and on three machines' files."""
    import nbformat
    from nbclient import NotebookClient

    from tools.nbmake_kernel import reader_environment

    folder = tmp_path / "results"
    folder.mkdir()
    if gpu_machines is not None:
        write_results(folder, monkeypatch, gpu_machines)
    docs = load_results(folder)
    nb = nbformat.read(APPENDIX, as_version=4)
    # The kernel may have run the other case: the folder is set in it before the first cell.
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        # a clean namespace, as a fresh kernel would give (imports stay loaded)
        f"%reset -f\nimport os\nos.environ['BOOK_RESULTS_DIR'] = {str(folder)!r}"))
    client = NotebookClient(nb, timeout=600, kernel_name="python3", km=appendix_kernel,
                            resources={"metadata": {"path": str(ROOT / "chapters")}})
    try:
        # started by the first run, as Jupyter starts it (what C++ writes to stderr shows)
        client.execute(env=reader_environment())
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
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
    plotted = [w for w in report.workloads(docs) if report.plot_panels(docs, w)]
    assert images == len(plotted), (images, plotted)
