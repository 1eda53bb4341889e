"""A plain `jupyter-book build .` (without the Makefile) must not publish pages full of
tracebacks: it executes nothing and says, from the build itself, to use `make book`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "_ext"))  # the extension is loaded by path, as Jupyter Book does
import book_build  # noqa: E402

JUPYTER_BOOK = Path(sys.executable).with_name("jupyter-book")


def _chapter(path: Path, executed: bool) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter"),
                nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]})]
    if executed:
        nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError",
                                                      evalue="division by zero", traceback=[])]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def test_the_config_executes_nothing_and_loads_the_extension():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"
    assert config["sphinx"]["local_extensions"] == {"book_build": "_ext", "figure_alt": "_ext"}


def test_unexecuted_chapters_are_found(tmp_path):
    _chapter(tmp_path / "chapters" / "a.ipynb", executed=False)
    _chapter(tmp_path / "chapters" / "b.ipynb", executed=True)
    assert [p.name for p in book_build.unexecuted_chapters(tmp_path)] == ["a.ipynb"]


def test_the_books_own_chapters_are_stored_unexecuted():
    # What a plain build would read: every chapter, without outputs.
    stored = sorted((ROOT / "chapters").glob("*.ipynb"))
    assert book_build.unexecuted_chapters(ROOT) == stored


@pytest.mark.slow
@pytest.mark.skipif(not JUPYTER_BOOK.exists(), reason="jupyter-book is not installed")
def test_a_plain_build_points_to_make_book_and_shows_no_traceback(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    shutil.copy(ROOT / "_config.yml", book)
    shutil.copytree(ROOT / "_ext", book / "_ext")
    (book / "intro.md").write_text("# Intro\n")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: chapters/one\n")
    _chapter(book / "chapters" / "one.ipynb", executed=False)
    plain = subprocess.run([str(JUPYTER_BOOK), "build", str(book)], capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    assert "build the book with `make book`" in plain.stdout + plain.stderr
    page = (book / "_build" / "html" / "chapters" / "one.html").read_text()
    assert "ZeroDivisionError" not in page and "Traceback" not in page
    strict = subprocess.run([str(JUPYTER_BOOK), "build", str(book), "-W", "--path-output",
                             str(tmp_path / "strict")], capture_output=True, text=True, timeout=300)
    assert strict.returncode != 0, "with -W the hint is an error"
    assert "build the book with `make book`" in strict.stdout + strict.stderr


def test_make_clean_removes_what_a_wheel_build_leaves():
    dry = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    removed = dry.split("rm -rf", 1)[1].split()
    assert {"build", "dist", "_build", "_executed", "_oldest"} <= set(removed)
