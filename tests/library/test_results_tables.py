"""The appendix's tables (helpers.results): every committed file shown, and the share of a GPU's
quoted peak and the speed-up over the host CPU, left empty where no peak is known."""

from __future__ import annotations

import pytest

from helpers import results as report
from helpers.results import load_results
from tests.conftest import ROOT
from tests.support import check_report, write_results

RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))


def test_the_appendix_tables_show_every_committed_file():
    docs = load_results(RESULTS)
    assert len(docs) == len(COMMITTED)
    check_report(docs)


@pytest.fixture(params=["this host", "a one-GPU host"])
def host(request, monkeypatch):
    """This host as it is, or faked as the H200 host of the first GPU run, whose own machine
    record once made the fixture's CPU-only file count as a GPU machine."""
    if request.param == "a one-GPU host":
        from bench import core

        h200 = {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8,
                "multiprocessors": 132}
        monkeypatch.setattr(core, "_accelerator", lambda: ("cuda", [h200]))
        monkeypatch.setattr(core, "_driver_version", lambda: "580.159.04")
        assert core.machine_info()["gpu_count"] == 1
    return request.param


def test_the_cpu_file_is_a_cpu_machine_on_any_host(tmp_path, monkeypatch, host):
    write_results(tmp_path, monkeypatch, gpu_machines=1)
    docs = load_results(tmp_path)
    assert sorted(doc["machine"]["gpu_count"] for doc in docs) == [0, 1]
    cpu = next(doc for doc in docs if not doc["machine"]["gpu_count"])
    assert cpu["machine"]["gpus"] == [] and cpu["machine"]["accelerator"] is None
    assert not cpu["machine"]["slug"].startswith("gpu-") and "-on-" not in cpu["machine"]["slug"]


def test_share_of_peak_and_speed_up_over_the_host_cpu(tmp_path, monkeypatch, host):
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


def test_a_workloads_folded_table_holds_each_figure_under_each_machine(tmp_path, monkeypatch):
    write_results(tmp_path, monkeypatch, gpu_machines=2)
    docs = load_results(tmp_path)
    labels = report.machine_labels(docs)
    for name in report.workloads(docs):
        table = report.workload_figures(docs, name)
        # one column however many machines: the appendix's tables never scroll sideways
        assert list(table.columns) == ["value ± spread"]
        assert table.index.names == ["figure", "unit", "machine"]
        expected = {(f["name"], f["unit"], label)
                    for label, doc in zip(labels, docs, strict=True)
                    for f in doc["figures"] if f["workload"] == name}
        assert set(table.index) == expected
        for label, doc in zip(labels, docs, strict=True):
            for f in doc["figures"]:
                if f["workload"] == name:
                    assert f"{f['value']:.4g}" in table.loc[(f["name"], f["unit"], label)].iloc[0]
    assert report.workload_figures(docs, "no such workload").empty


def test_a_folded_table_is_a_closed_details_block_with_a_text_fallback(monkeypatch):
    import pandas as pd
    from IPython import display as ipd

    shown = []
    monkeypatch.setattr(ipd, "display", lambda obj, raw=False: shown.append((obj, raw)))
    table = pd.DataFrame({"value ± spread": ["1.5 ± 0.1"]}, index=["a <b>"])
    report.show_folded("matmul: 1 figures & more", table)
    (bundle, raw), = shown
    assert raw is True
    html = bundle["text/html"]
    assert html.startswith('<details class="book-folded"><summary>matmul: 1 figures &amp; more')
    assert " open" not in html.split(">", 1)[0], "folded means closed until the reader opens it"
    assert "a &lt;b&gt;" in html and html.endswith("</details>")
    assert bundle["text/plain"].startswith("matmul: 1 figures & more\n")
    assert "1.5 ± 0.1" in bundle["text/plain"]


@pytest.mark.parametrize(("summary", "table", "error"), [
    ("", None, ValueError), ("  ", None, ValueError), ("ok", [1, 2], TypeError)])
def test_a_folded_table_refuses_bad_input(summary, table, error):
    import pandas as pd

    with pytest.raises(error, match="summary must say|table must be a DataFrame"):
        report.show_folded(summary, pd.DataFrame() if table is None else table)
