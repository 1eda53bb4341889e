"""The package as a whole: chapter_setup, lazy submodules, the notebook tool."""

import subprocess
import sys

import nbformat

from tests.conftest import ROOT


def test_notebook_tool_round_trip(tmp_path):
    draft = tmp_path / "draft.py"
    draft.write_text('# %% [markdown]\n# # Title\n#\n# Text.\n\n# %%\nx = 1\n\n'
                     '# %% tags=["raises-exception"]\nraise ValueError("on purpose")\n')
    nb_path = tmp_path / "n.ipynb"
    subprocess.run([sys.executable, str(ROOT / "tools" / "notebook.py"), "build", str(draft),
                    str(nb_path), "--chapter", "7", "--needs", "cpu", "--best-on", "multi-gpu"], check=True)
    nb = nbformat.read(nb_path, as_version=4)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"]
    assert nb.cells[0].source == "# Title\n\nText."
    assert nb.cells[2].metadata.tags == ["raises-exception"]
    assert nb.metadata.book == {"chapter": 7, "needs": "cpu", "best_on": "multi-gpu"}
    assert nb.metadata.accelerator == "GPU" and nb.metadata.colab.gpuType == "T4"
    back = tmp_path / "back.py"
    subprocess.run([sys.executable, str(ROOT / "tools" / "notebook.py"), "dump", str(nb_path),
                    str(back)], check=True)
    assert 'tags=["raises-exception"]' in back.read_text()
