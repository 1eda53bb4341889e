"""The notebook conventions of CONTRIBUTING.md, checked for every chapter in _toc.yml, and the
executed outputs that `make book` produced (no warnings, no stray tracebacks)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.conftest import OLDEST, ROOT, STAGE

HARDWARE = {"cpu", "gpu", "multi-gpu"}


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part["chapters"]]
    return files


def toc_notebooks() -> list[Path]:
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


NOTEBOOKS = toc_notebooks()
IDS = [p.stem for p in NOTEBOOKS]


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_every_toc_entry_exists_and_every_chapter_is_listed():
    missing = [f for f in toc_files()
               if not any((ROOT / f"{f}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    listed = {ROOT / f"{f}.ipynb" for f in toc_files()} | {ROOT / f"{f}.md" for f in toc_files()}
    stray = [p.name for p in (ROOT / "chapters").glob("*") if p.suffix in (".ipynb", ".md")
             and p not in listed]
    assert not stray, f"chapters missing from _toc.yml: {stray}"
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} are stored with outputs; run tools/notebook.py normalize"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_metadata_asks_colab_for_a_gpu_and_declares_hardware(path):
    meta = nbformat.read(path, as_version=4).metadata
    assert meta.kernelspec.name == "python3"
    assert meta.get("accelerator") == "GPU"
    assert meta.get("colab", {}).get("gpuType") == "T4"
    book = meta.get("book", {})
    assert book.get("needs") in HARDWARE and book.get("best_on") in HARDWARE, book
    assert "chapter" in book


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_code_cell_is_the_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        "a chapter opens with its title"
    setup = code_cells(nb)[0].source
    assert "import helpers" in setup
    assert "%pip install" in setup
    url = repository_url()
    spec = re.search(r'"git\+(https://[^"]+)"', setup)
    assert spec, "the setup cell installs helpers from the book's repository"
    assert spec.group(1) == url, f"setup cell installs from {spec.group(1)}, _config.yml says {url}"
    book = nb.metadata.book
    chapter = repr(book["chapter"]) if isinstance(book["chapter"], str) else book["chapter"]
    call = f'helpers.chapter_setup(chapter={chapter}, needs="{book["needs"]}", best_on="{book["best_on"]}")'
    assert call.replace("'", '"') in setup.replace("'", '"'), f"setup cell must call {call}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_sys_path_hacks(path):
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):
        assert "sys.path" not in cell.source, "helpers must be installed, not found via sys.path"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_ends_with_exercises(path):
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and last.source.lstrip().startswith("## Exercises")


def test_every_repository_address_agrees_with_config():
    url = repository_url()
    for path in NOTEBOOKS:
        for found in re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", path.read_text()):
            assert found == url, f"{path.name} names {found}, _config.yml names {url}"


# ---- executed outputs (after `make book`) --------------------------------------------------

WARNING_PATTERNS = [
    re.compile(r"\b[A-Z][A-Za-z]*Warning\b"),        # UserWarning, FutureWarning, ...
    re.compile(r"warnings\.warn"),
    re.compile(r"^[WE]\d{4} \d\d:\d\d:\d\d", re.M),  # glog-style lines from torch's C++ side
    re.compile(r"\bWARNING\b"),
    re.compile(r"deprecated", re.I),
]


def output_texts(cell) -> list[tuple[str, str]]:
    texts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            texts.append((out.get("name", "stdout"), out.get("text", "")))
        elif kind in ("execute_result", "display_data"):
            texts.append(("data", str(out.get("data", {}).get("text/plain", ""))))
        elif kind == "error":
            texts.append(("error", "\n".join(out.get("traceback", []))))
    return texts


def output_problems(nb) -> list[str]:
    """What a reader must never see in an executed chapter: a warning, a stray traceback, text
    on stderr, or an error outside a ``raises-exception`` cell (and such a cell that raised
    nothing). Used for every executed copy: the book's, the oldest-torch run's and recorded pages.
    """
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        tagged = "raises-exception" in cell.metadata.get("tags", [])
        texts = output_texts(cell)
        errors = [t for kind, t in texts if kind == "error"]
        if tagged and not errors:
            problems.append(f"code cell {i} is tagged raises-exception but raised nothing")
        if not tagged and errors:
            problems.append(f"code cell {i} raised: {errors[0][-300:]}")
        for kind, text in texts:
            if kind == "error":
                continue
            if kind == "stderr":
                problems.append(f"code cell {i} wrote to stderr: {text[:300]!r}")
            if "Traceback (most recent call last)" in text:
                problems.append(f"code cell {i} prints a traceback")
            for pattern in WARNING_PATTERNS:
                m = pattern.search(text)
                if m:
                    start = max(0, m.start() - 120)
                    problems.append(f"code cell {i} shows a warning: {text[start:m.end() + 200]!r}")
                    break
    return problems


@pytest.fixture
def executed(request, built_book):
    path = STAGE / request.param.relative_to(ROOT)
    if not path.exists():
        pytest.fail(f"{path} was not executed by make book")
    return nbformat.read(path, as_version=4)


@pytest.mark.book
@pytest.mark.parametrize("executed", NOTEBOOKS, ids=IDS, indirect=True)
def test_executed_outputs_are_clean(executed):
    problems = output_problems(executed)
    assert not problems, "\n".join(problems)


@pytest.fixture
def executed_oldest(request):
    """The chapter as `make oldest` executed it with the oldest supported torch."""
    path = OLDEST / request.param.name
    if not (OLDEST.parent / ".done").exists() or not path.exists():
        message = "the oldest-torch run is missing: run `make oldest` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    return nbformat.read(path, as_version=4)


@pytest.mark.book
@pytest.mark.parametrize("executed_oldest", NOTEBOOKS, ids=IDS, indirect=True)
def test_executed_outputs_are_clean_on_the_oldest_torch(executed_oldest):
    first = "".join(t for _, t in output_texts(code_cells(executed_oldest)[0]))
    match = re.search(r"torch (\d+\.\d+)", first)
    problems = output_problems(executed_oldest)
    assert not problems, "\n".join(problems)
    assert match, "the setup cell's banner names the torch version it runs with"


@pytest.mark.book
@pytest.mark.parametrize("executed", NOTEBOOKS, ids=IDS, indirect=True)
def test_first_output_declares_the_hardware(executed):
    first = "".join(t for _, t in output_texts(code_cells(executed)[0]))
    assert "runs on" in first and "measurements are meant for" in first
    assert "Using device:" in first
