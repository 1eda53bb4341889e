"""Chapter 7 shows some code in "Going deeper" dropdowns and runs it in hidden cells: the
code a reader sees there is exactly the code the page runs and checks."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "07_data_parallel.ipynb"
HIDDEN_NOTE = re.compile(r"\A# .*\(hidden in the book\)\n")
MAGIC = re.compile(r"\A%%gpu_only.*\n")

# dropdown title -> how many hidden code cells after it run the code it shows, in order
SHOWN = {
    "Going deeper: the four steps by hand": 1,
    "Going deeper: the code of models A and B": 2,
    "Going deeper: mp.spawn, a rank-0 checkpoint, buffers and SyncBatchNorm": 1,
}


@pytest.mark.parametrize("title", SHOWN)
def test_the_dropdown_shows_the_code_the_page_runs(title):
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (at,) = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and f"````{{dropdown}} {title}\n" in "".join(c["source"])]
    (shown,) = re.findall(r"```python\n(.*?)\n```\n", "".join(cells[at]["source"]),
                          flags=re.S)
    run = []
    for cell in cells[at + 1:at + 1 + SHOWN[title]]:
        assert cell["cell_type"] == "code" and "remove-cell" in cell["metadata"]["tags"]
        source = "".join(cell["source"])
        source = MAGIC.sub("", source)  # %%gpu_only runs the code where the GPUs exist
        assert HIDDEN_NOTE.match(source), "the hidden cell says it runs the dropdown's code"
        run.append(HIDDEN_NOTE.sub("", source))
    assert shown == "\n\n".join(run)
