"""results/ holds only result files, every committed one matches the schema and comes from a
full run, and the appendix's report shows every file the runner writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import schema
from helpers import results as report
from helpers.results import load_results
from tests.conftest import ROOT
from tests.support import check_report, write_results

RESULTS = ROOT / "results"
COMMITTED = sorted(RESULTS.glob("*.json"))


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
    # Before schema version 3 the benchmark was the package helpers.bench.
    runner = "python -m bench" if doc["schema_version"] >= 3 else "python -m helpers.bench"
    assert doc["command"].startswith(runner), doc["command"]
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
