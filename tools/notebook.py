"""Write and normalise the book's chapter notebooks.

Chapters are stored as .ipynb without outputs. Authors may write a chapter as a percent-format
Python file (``# %%`` code cells, ``# %% [markdown]`` cells, ``# %% tags=["raises-exception"]``
for tagged cells) and convert it; or edit the notebook directly and normalise it.

    python tools/notebook.py build  draft.py chapters/05_mnist.ipynb --chapter 5 --needs cpu --best-on gpu
    python tools/notebook.py dump   chapters/05_mnist.ipynb draft.py
    python tools/notebook.py normalize chapters/*.ipynb
    python tools/notebook.py trim-errors _executed/chapters/*.ipynb

The percent format is jupytext's (the library reads and writes it); ``trim-errors`` stays
ours: IPython's ``%xmode Minimal`` would shorten every traceback of the build, so a real failure
in CI would lose the frames that locate it, while this trims only the cells meant to fail.

Normalising strips outputs and execution counts, sets the metadata every chapter carries (the
Python 3 kernel, Colab's request for a GPU runtime, and the hardware the chapter declares,
``book.needs`` / ``book.best_on``) and writes the setup cell, the first code cell, from
:data:`SETUP_CELL` with the repository address of ``_config.yml``. The tests check that every
stored chapter is exactly what ``normalize`` makes of it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

HARDWARE = ("cpu", "gpu", "multi-gpu")
ROOT = Path(__file__).resolve().parents[1]

#: Every chapter's first code cell. The repository address comes from _config.yml, its one
#: definition; `normalize` writes the cell, so no chapter carries an address of its own.
SETUP_CELL = """\
# Setup: import the book's helpers; where they are missing (Colab), install them first.
import importlib
import os

# BOOK_HELPERS_SPEC lets the book's tests install a locally built package instead.
HELPERS_SPEC = os.environ.get(
    "BOOK_HELPERS_SPEC", "git+{url}")
try:
    import helpers
except ImportError:
    %pip install --quiet {{HELPERS_SPEC}}
    importlib.invalidate_caches()
    import helpers

device = helpers.chapter_setup(chapter={chapter}, needs="{needs}", best_on="{best_on}")"""


def repository_url(root: Path = ROOT) -> str:
    """The book's repository address, from _config.yml (``repository.url``)."""
    import yaml

    url = (yaml.safe_load((root / "_config.yml").read_text()) or {}).get("repository", {}).get("url")
    if not url:
        raise SystemExit(f"{root / '_config.yml'} names no repository.url")
    return url


def setup_cell(chapter: int | str, needs: str, best_on: str, url: str | None = None) -> str:
    """The setup cell of a chapter (the first code cell of every notebook)."""
    return SETUP_CELL.format(url=url or repository_url(), chapter=repr(chapter), needs=needs,
                             best_on=best_on)


def _metadata(chapter: int | str, needs: str, best_on: str) -> dict:
    return {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",
        "colab": {"gpuType": "T4", "provenance": []},
        "book": {"chapter": chapter, "needs": needs, "best_on": best_on},
    }


def normalize(nb: nbformat.NotebookNode, chapter=None, needs=None, best_on=None) -> nbformat.NotebookNode:
    """Strip outputs and set the standard metadata (keeping the declared hardware if not given)."""
    book = nb.metadata.get("book", {})
    chapter = chapter if chapter is not None else book.get("chapter")
    needs = needs or book.get("needs", "cpu")
    best_on = best_on or book.get("best_on", "gpu")
    if chapter is None:
        raise SystemExit("the notebook declares no chapter: pass --chapter")
    nb.metadata = nbformat.from_dict(_metadata(chapter, needs, best_on))
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code:
        raise SystemExit("the notebook has no code cell: its first code cell is the setup cell")
    code[0].source = setup_cell(chapter, needs, best_on)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:03d}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        tags = cell.metadata.get("tags", [])
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def trim_errors(nb: nbformat.NotebookNode) -> int:
    """Shorten the error outputs of executed ``raises-exception`` cells to the final
    ``ErrorType: message`` line, the part a reader compares with their own screen.

    The frames inside PyTorch teach nothing and bury the message; the message itself is kept
    exactly as PyTorch printed it. Returns how many outputs were trimmed.
    """
    trimmed = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "raises-exception" not in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out['ename']}: {_ANSI.sub('', out['evalue'])}"]
                trimmed += 1
    return trimmed


# Executed outputs ------------------------------------------------------------------------

def code_cells(nb):
    """The notebook's code cells."""
    return [c for c in nb.cells if c.cell_type == "code"]


WARNING_PATTERNS = [
    re.compile(r"\b[A-Z][A-Za-z]*Warning\b"),        # UserWarning, FutureWarning, ...
    re.compile(r"warnings\.warn"),
    re.compile(r"^[WE]\d{4} \d\d:\d\d:\d\d", re.M),  # glog-style lines from torch's C++ side
    re.compile(r"\bWARNING\b"),
    re.compile(r"deprecated", re.I),
]


def output_texts(cell) -> list[tuple[str, str]]:
    """Each output of ``cell`` as (stdout, stderr, data or error; its text)."""
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
    nothing). Used for every executed copy: the book's, the oldest-torch run's (the tests) and
    recorded pages (the GPU report writes none with a problem).
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


def from_percent(text: str) -> nbformat.NotebookNode:
    """Cells from percent-format source (``# %%`` code cells, ``# %% [markdown]`` prose, with
    ``tags=[...]``), read by jupytext."""
    import jupytext  # only the drafts need it: a GPU server's wheelhouse does not have it

    nb = jupytext.reads(text, fmt="py:percent")
    return nbformat.from_dict(json.loads(jupytext.writes(nb, fmt="ipynb")))


def to_percent(nb: nbformat.NotebookNode) -> str:
    """Percent-format source of a notebook (the inverse of :func:`from_percent`), by jupytext,
    without its header of notebook metadata (the build step sets the metadata)."""
    import jupytext
    from jupytext.config import JupytextConfiguration

    config = JupytextConfiguration(notebook_metadata_filter="-all", cell_metadata_filter="tags")
    return jupytext.writes(nb, fmt="py:percent", config=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="percent-format .py -> normalised .ipynb")
    b.add_argument("source", type=Path)
    b.add_argument("target", type=Path)
    d = sub.add_parser("dump", help=".ipynb -> percent-format .py")
    d.add_argument("source", type=Path)
    d.add_argument("target", type=Path)
    t = sub.add_parser("trim-errors", help="shorten tagged error outputs, in place")
    t.add_argument("notebooks", type=Path, nargs="+")
    n = sub.add_parser("normalize", help="strip outputs, set metadata, in place")
    n.add_argument("notebooks", type=Path, nargs="+")
    for p in (b, n):
        p.add_argument("--chapter")
        p.add_argument("--needs", choices=HARDWARE)
        p.add_argument("--best-on", choices=HARDWARE)
    args = parser.parse_args(argv)

    def chapter_value(text):
        return int(text) if text is not None and text.isdigit() else text

    if args.cmd == "build":
        nb = from_percent(args.source.read_text())
        nb = normalize(nb, chapter_value(args.chapter), args.needs, args.best_on)
        nbformat.validate(nb)
        args.target.write_text(nbformat.writes(nb) + "\n")
    elif args.cmd == "dump":
        args.target.write_text(to_percent(nbformat.read(args.source, as_version=4)))
    elif args.cmd == "trim-errors":
        for path in args.notebooks:
            nb = nbformat.read(path, as_version=4)
            trim_errors(nb)
            nbformat.write(nb, path)
    else:
        for path in args.notebooks:
            nb = nbformat.read(path, as_version=4)
            nb = normalize(nb, chapter_value(args.chapter), args.needs, args.best_on)
            nbformat.validate(nb)
            path.write_text(nbformat.writes(nb) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
