"""The notebook tool (tools/notebook.py): percent-format drafts, and what the GPU report uses."""

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


def test_what_the_gpu_report_uses_works_without_jupytext(tmp_path):
    # A GPU server installs the report's wheelhouse, which has no jupytext: trimming errors
    # and the output checks must not need it (only the drafts do).
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x"),
                                         nbformat.v4.new_code_cell("y")])
    nb.cells[0].metadata.tags = ["raises-exception"]
    nb.cells[0].outputs = [nbformat.v4.new_output(
        "error", ename="ValueError", evalue="on purpose", traceback=["long", "traceback"])]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text="UserWarning: stray\n")]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    code = ("import sys; sys.modules['jupytext'] = None\n"  # import jupytext now fails
            "import nbformat\n"
            "from tools import notebook\n"
            f"nb = nbformat.read({str(path)!r}, as_version=4)\n"
            "print(notebook.trim_errors(nb), nb.cells[0].outputs[0].traceback,\n"
            "      notebook.output_problems(nb))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.startswith("1 ['ValueError: on purpose'] [\"code cell 1 shows a warning"), \
        done.stdout
