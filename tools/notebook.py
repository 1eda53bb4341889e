"""Write and normalise the book's chapter notebooks.

Chapters are stored as .ipynb without outputs. Authors may write a chapter as a percent-format
Python file (``# %%`` code cells, ``# %% [markdown]`` cells, ``# %% tags=["raises-exception"]``
for tagged cells) and convert it; or edit the notebook directly and normalise it.

    python tools/notebook.py build  draft.py chapters/05_mnist.ipynb --chapter 5 --needs cpu --best-on gpu
    python tools/notebook.py dump   chapters/05_mnist.ipynb draft.py
    python tools/notebook.py normalize chapters/*.ipynb
    python tools/notebook.py trim-errors _executed/chapters/*.ipynb

Normalising strips outputs and execution counts and sets the metadata every chapter carries:
the Python 3 kernel, Colab's request for a GPU runtime, and the hardware the chapter declares
(``book.needs`` / ``book.best_on``), which its setup cell repeats.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

HARDWARE = ("cpu", "gpu", "multi-gpu")
_CELL = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


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


def from_percent(text: str) -> nbformat.NotebookNode:
    """Cells from percent-format source."""
    nb = nbformat.v4.new_notebook()
    kind, tags, lines = None, [], []

    def flush() -> None:
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(re.sub(r"^# ?", "", ln) for ln in body.split("\n"))
            cell = nbformat.v4.new_markdown_cell(body)
        else:
            cell = nbformat.v4.new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)

    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    return nb


def to_percent(nb: nbformat.NotebookNode) -> str:
    """Percent-format source of a notebook (the inverse of :func:`from_percent`)."""
    out = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        tag = f" tags={json.dumps(tags)}" if tags else ""
        if cell.cell_type == "markdown":
            body = "\n".join(("# " + ln).rstrip() for ln in cell.source.split("\n"))
            out.append(f"# %% [markdown]{tag}\n{body}\n")
        else:
            out.append(f"# %%{tag}\n{cell.source}\n")
    return "\n".join(out)


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
