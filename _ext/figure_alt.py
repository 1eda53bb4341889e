"""A Sphinx extension of the book: every figure a notebook shows gets its alt text on the page.

A chapter's figure is a PNG output of a code cell. MyST-NB writes it to a file named by the
SHA-256 of its bytes and makes an ``<img>`` whose alt text, with none given, is that file's
path: a screen reader reads a hash. ``helpers.plotting`` puts the figure's alt text in the
output's metadata (``{"image/png": {"alt": "..."}}``), which MyST-NB does not read (it takes
only ``width`` and ``height`` from there). This extension does: for each notebook page it maps
the hash of every PNG output to that output's alt text, and sets it on the page's image.
"""

from __future__ import annotations

import hashlib
import json
from binascii import a2b_base64
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx


def png_alt_texts(notebook: dict) -> dict[str, str]:
    """``{sha256 of the PNG bytes: alt text}`` for the notebook's PNG outputs that have one."""
    found = {}
    for cell in notebook.get("cells", []):
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            alt = out.get("metadata", {}).get("image/png", {}).get("alt")
            if png is None or not isinstance(alt, str) or not alt.strip():
                continue
            text = "".join(png) if isinstance(png, list) else png
            found[hashlib.sha256(a2b_base64(text)).hexdigest()] = alt.strip()
    return found


def set_alt_texts(doctree: nodes.document, alts: dict[str, str]) -> int:
    """Give each image whose file is named by a hash in ``alts`` its alt text (unless it has
    one); returns how many it set."""
    count = 0
    for image in doctree.findall(nodes.image):
        alt = alts.get(Path(str(image.get("uri", ""))).stem)
        if alt and not image.get("alt"):
            image["alt"] = alt
            count += 1
    return count


def _on_doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".ipynb" or not source.is_file():
        return
    alts = png_alt_texts(json.loads(source.read_text(encoding="utf-8")))
    if alts:
        set_alt_texts(doctree, alts)


def setup(app: Sphinx) -> dict:
    app.connect("doctree-read", _on_doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
