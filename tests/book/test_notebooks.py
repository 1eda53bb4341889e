"""The notebook conventions of CONTRIBUTING.md, checked for every chapter in _toc.yml, and the
executed outputs that `make book` produced (no warnings, no stray tracebacks)."""

from __future__ import annotations

import copy
import re
import statistics
from pathlib import Path

import nbformat
import pytest

from tests.conftest import OLDEST, ROOT, STAGE
from tests.support import code_cells, output_problems, output_texts, toc_files
from tools import notebook as notebook_tool

HARDWARE = {"cpu", "gpu", "multi-gpu"}


def toc_notebooks() -> list[Path]:
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


NOTEBOOKS = toc_notebooks()
IDS = [p.stem for p in NOTEBOOKS]


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
def test_stored_as_normalize_writes_it(path):
    # One check for what `tools/notebook.py normalize` guarantees: no outputs, the standard
    # metadata (Colab's GPU runtime, the declared hardware) and the setup cell written from
    # _config.yml's repository address, the address's one definition.
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    book = nb.metadata.get("book", {})
    assert book.get("needs") in HARDWARE and book.get("best_on") in HARDWARE, book
    normal = notebook_tool.normalize(copy.deepcopy(nb))
    assert nbformat.writes(normal) == nbformat.writes(nb), (
        f"{path.name} is not stored as `python tools/notebook.py normalize` writes it: run it")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        "a chapter opens with its title"


GITHUB_FILE = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+)/(?:blob|tree)/[\w.-]+/"
                         r"([^\s)#\"']+)")


def test_links_to_the_books_files_use_its_one_address():
    # _config.yml's repository address is its one definition: a page linking to a file of
    # the book (helpers/launch.py, ...) must use it, or a fork's pages point elsewhere.
    address = notebook_tool.repository_url().removeprefix("https://github.com/")
    pages = [ROOT / "intro.md", *sorted((ROOT / "chapters").glob("*.md")), *NOTEBOOKS]
    links = [(page.name, repo, path) for page in pages
             for repo, path in GITHUB_FILE.findall(page.read_text())
             if (ROOT / path).exists()]
    assert len(links) >= 2, "chapter 7 links the launcher and the DDP script"
    wrong = [link for link in links if link[1] != address]
    assert not wrong, f"links to the book's files under another address than {address}: {wrong}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_sys_path_hacks(path):
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):
        assert "sys.path" not in cell.source, "helpers must be installed, not found via sys.path"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_ends_with_exercises(path):
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and last.source.lstrip().startswith("## Exercises")


# ---- pages written for the reader -----------------------------------------------------------

HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-cell", "hide-input"}
BRANCH = re.compile(r"^\s*(if|elif)\b.*(device\.type|on_cuda|on_gpu|is_available\(\)|\.type\s*==|"
                    r"device_count\(\)|has_gpu)")
NARRATION = re.compile(r"on an? (?:CUDA )?GPU,? this cell|this cell would", re.I)


def visible_code(nb) -> list[list[str]]:
    """The non-blank lines of each code cell a reader of the built page sees."""
    return [[line for line in c.source.splitlines() if line.strip()] for c in code_cells(nb)
            if not HIDDEN_TAGS & set(c.metadata.get("tags", []))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_visible_cells_are_lessons(path):
    cells = visible_code(nbformat.read(path, as_version=4))
    sizes = [len(c) for c in cells]
    assert max(sizes) <= 25, f"visible code cells over 25 lines: {[s for s in sizes if s > 25]}"
    assert statistics.median(sizes) <= 12, f"median visible cell {statistics.median(sizes)} lines"
    lines = [line for cell in cells for line in cell]
    checks = [line for line in lines if line.lstrip().startswith("assert") or BRANCH.match(line)]
    assert len(checks) <= 0.04 * len(lines), (
        f"{len(checks)} of {len(lines)} visible lines are asserts or device branches (at most "
        f"4%): move checks into hidden check cells: {checks[:5]}")


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def fenced_code(markdown: str) -> list[str]:
    """The lines of the code blocks a markdown cell shows (```python and the like); quoted
    messages (```text, which wrap on the page) and directives (```{dropdown}) are not code."""
    lines, fence = [], None
    for line in markdown.splitlines():
        found = FENCE.match(line)
        if fence is None:
            if found and not found[3].strip().startswith(("{", "text")) and found[3].strip():
                fence, indent = found[2], len(found[1])
            continue
        if found and found[2].startswith(fence) and not found[3].strip():
            fence = None
        else:
            lines.append(line[indent:])
    return lines


def test_fenced_code_reads_only_language_blocks():
    md = ("```{dropdown} Going deeper\n"
          "  ```python\n  x = 1\n  ```\n"
          "```text\nRuntimeError: a long message\n```\n```\n")
    assert fenced_code(md) == ["x = 1"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_code_fits_88_columns_and_never_narrates_a_gpu(path):
    # 88 columns is what a code box shows without a sideways scroll in a 1280-pixel window
    # (_static/book.css; tests/book/test_browser.py measures it).
    nb = nbformat.read(path, as_version=4)
    shown = [line for c in code_cells(nb) for line in c.source.splitlines()]
    shown += [line for c in nb.cells if c.cell_type == "markdown"
              for line in fenced_code(c.source)]
    wide = [line for line in shown if len(line) > 88]
    assert not wide, f"code lines over 88 columns: {wide[:3]}"
    narrating = [c.source[:80] for c in code_cells(nb) if NARRATION.search(c.source)]
    assert not narrating, f"cells that print what a GPU would show: {narrating}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_check_cells_say_what_they_check(path):
    # In Colab tags hide nothing: a check cell opens with a comment that says it checks the page.
    nb = nbformat.read(path, as_version=4)
    def body(source: str) -> str:  # a GPU-only check cell opens with its magic
        lines = source.lstrip().splitlines()
        return "\n".join(lines[1:] if lines and lines[0].startswith("%%gpu_only") else lines)

    silent = [c.source[:60] for c in code_cells(nb)[1:]
              if "remove-cell" in c.metadata.get("tags", []) and "assert" in c.source
              and not body(c.source).lstrip().startswith("#")]
    assert not silent, f"hidden check cells without a first comment line: {silent}"


# ---- executed outputs (after `make book`) --------------------------------------------------

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
