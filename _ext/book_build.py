"""A Sphinx extension of the book: a plain `jupyter-book build .` points to `make book`.

The chapters are stored without outputs. `make book` executes each one once (nbmake, in the
scratch copy `_executed/`), trims the tracebacks of the cells that fail on purpose to the
message a reader compares with their screen, and builds from those copies. A plain
`jupyter-book build .` does not execute anything (`execute_notebooks: "off"` in _config.yml),
so its pages would show code without outputs: this extension says so at the start of the build,
as a warning (an error with `-W`).
"""

from __future__ import annotations

import json
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

HINT = ("the chapters in {where} have no outputs: build the book with `make book`, which "
        "executes every chapter once and builds from the executed copies in _executed/ "
        "(a plain `jupyter-book build .` executes nothing)")


def unexecuted_chapters(srcdir: str | Path) -> list[Path]:
    """The chapter notebooks under ``srcdir/chapters`` none of whose code cells has an output."""
    missing = []
    for path in sorted(Path(srcdir, "chapters").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        code = [c for c in cells if c.get("cell_type") == "code"]
        if code and not any(c.get("outputs") for c in code):
            missing.append(path)
    return missing


def _check(app: Sphinx) -> None:
    if unexecuted_chapters(app.srcdir):
        logger.warning(HINT.format(where=Path(app.srcdir, "chapters")), type="book", subtype="build")


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
