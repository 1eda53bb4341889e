"""The GPU report (scripts/gpu_report.py) end to end on the CPU at quick sizes, the rule that
decides which outputs a page of the book shows, and the recorded pages' own checks."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.bench import schema
from tests.conftest import ROOT
from tests.test_notebooks import output_problems

SCRIPT = ROOT / "scripts" / "gpu_report.py"
CHAPTER = ROOT / "chapters" / "01_devices.ipynb"
RECORDED = sorted((ROOT / "results" / "pages").glob("*/*.ipynb"))


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load_script()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One chapter recorded on this CPU by the real command, with a quick, partial benchmark."""
    tmp = tmp_path_factory.mktemp("gpu-report")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--chapters", CHAPTER.stem, "--quick",
         "--bench-only", "matmul", "--results", str(tmp / "results"), "--work", str(tmp / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc.stdout


@pytest.mark.slow
def test_the_report_writes_a_result_file_and_stamped_pages(recorded):
    tmp, stdout = recorded
    (result,) = (tmp / "results").glob("*.json")
    assert schema.validate_file(result) == []
    doc = json.loads(result.read_text())
    assert doc["quick"] is True and "--only matmul" in doc["command"]
    slug = doc["machine"]["slug"]
    page_path = tmp / "results" / "pages" / slug / CHAPTER.name
    assert (tmp / "work" / "chapters" / CHAPTER.name).exists(), "the executed notebook is kept"
    page = nbformat.read(page_path, as_version=4)
    run = page.metadata["book"]["recorded_run"]
    import torch

    assert run["torch"] == str(torch.__version__)
    assert run["code_hash"] == report.code_hash(nbformat.read(CHAPTER, as_version=4))
    for key in ("device", "driver", "cuda", "book_commit", "date", "slug"):
        assert key in run, key
    assert run["book_commit"] == doc["machine"]["book_commit"]
    stamp = page.cells[1]
    assert report.STAMP_TAG in stamp.metadata["tags"]
    assert f"torch {run['torch']}" in stamp.source and run["date"][:10] in stamp.source
    assert "CI also runs this page on a CPU-only machine" in stamp.source
    assert output_problems(page) == []
    assert "smoke test" in stdout and "not for committing" in stdout


@pytest.mark.slow
def test_a_page_shows_the_recorded_run_only_while_its_code_matches(recorded):
    tmp, _ = recorded
    pages = tmp / "results" / "pages"
    executed = tmp / "cpu-executed"
    executed.mkdir()
    cpu = nbformat.read(tmp / "work" / "chapters" / CHAPTER.name, as_version=4)
    cpu.metadata["book"]["from"] = "the CPU build"  # tells the CPU copy apart
    nbformat.write(cpu, executed / CHAPTER.name)
    chapters = tmp / "chapters"
    chapters.mkdir()
    shutil.copy(CHAPTER, chapters / CHAPTER.name)

    def staged() -> nbformat.NotebookNode:
        out = tmp / "staged"
        shutil.rmtree(out, ignore_errors=True)
        assert report.main(["stage", "--executed", str(executed), "--out", str(out),
                            "--chapter-dir", str(chapters), "--pages", str(pages)]) == 0
        return nbformat.read(out / CHAPTER.name, as_version=4)

    current = staged()
    assert "recorded_run" in current.metadata["book"] and "from" not in current.metadata["book"]
    assert report.STAMP_TAG in current.cells[1].metadata["tags"]

    edited = nbformat.read(chapters / CHAPTER.name, as_version=4)
    code = next(c for c in edited.cells if c.cell_type == "code" and c.source.strip())
    code.source += "\n# changed"
    nbformat.write(edited, chapters / CHAPTER.name)
    stale = staged()
    assert stale.metadata["book"]["from"] == "the CPU build"
    assert report.CPU_NOTE_TAG in stale.cells[1].metadata["tags"]
    assert "earlier version of this page's code" in stale.cells[1].source

    shutil.rmtree(pages)
    none = staged()
    assert "no run of this page on a GPU is recorded yet" in none.cells[1].source


def _fake_page(folder: Path, slug: str, chapter, gpu_count: int, date: str, code_hash: str):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T")])
    nb.metadata["book"] = {"recorded_run": {"slug": slug, "gpu_count": gpu_count, "date": date,
                                            "code_hash": code_hash, "machine_label": slug}}
    (folder / slug).mkdir(parents=True)
    nbformat.write(nb, folder / slug / "x.ipynb")


def test_the_newest_matching_gpu_run_is_chosen(tmp_path):
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    h = report.code_hash(chapter)
    _fake_page(tmp_path, "gpu-a-x1", chapter, 1, "2026-01-01T00:00:00+00:00", h)
    _fake_page(tmp_path, "gpu-b-x1", chapter, 1, "2026-02-01T00:00:00+00:00", h)
    _fake_page(tmp_path, "gpu-c-x1", chapter, 1, "2026-03-01T00:00:00+00:00", "other")
    _fake_page(tmp_path, "cpu-d-2c", chapter, 0, "2026-04-01T00:00:00+00:00", h)
    page, stale = report.choose_page(chapter, tmp_path, "x")
    assert page.metadata["book"]["recorded_run"]["slug"] == "gpu-b-x1"
    assert [r["slug"] for r in stale] == ["gpu-c-x1"]
    # markdown edits keep a recorded page current; code edits do not
    chapter.cells.append(nbformat.v4.new_markdown_cell("more prose"))
    assert report.code_hash(chapter) == h


@pytest.mark.parametrize("path", RECORDED, ids=[f"{p.parent.name}/{p.stem}" for p in RECORDED])
def test_recorded_pages_are_clean_and_stamped(path):
    page = nbformat.read(path, as_version=4)
    assert output_problems(page) == []
    run = page.metadata["book"]["recorded_run"]
    assert run["slug"] == path.parent.name
    assert (ROOT / "chapters" / path.name).exists(), "a recorded page of a chapter that is gone"
    assert any(report.STAMP_TAG in c.metadata.get("tags", []) for c in page.cells)
