"""tools/nbmake_kernel.py: the chapters' nbmake runs get a kernel as Jupyter starts it."""

from __future__ import annotations

import re
import sys

import nbformat

from tests.conftest import ROOT
from tests.support import run_command


def test_a_chapter_run_shows_what_cpp_code_writes_to_stderr_and_its_kernel_is_killed(tmp_path):
    """Under plain nbmake the kernel inherits PYTEST_CURRENT_TEST, and ipykernel then leaves
    the process's stderr alone: torch's profiler wrote "profiler_start" there on every profile
    (torch 2.14), which Jupyter shows and the book's CI never saw. With the plugin, a write to
    file descriptor 2 is an output of its cell, and the kernel is killed after the last cell:
    an exit handler never runs."""
    exited = tmp_path / "exited"
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os\nprint('PYTEST_CURRENT_TEST' in os.environ)\n"
                                  "os.write(2, b'written by C++\\n')"),
        nbformat.v4.new_code_cell("import atexit, pathlib\n"
                                  f"atexit.register(pathlib.Path({str(exited)!r}).touch)")]),
        path)
    run_command([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                 "tools.nbmake_kernel", "-q", "--nbmake", "--overwrite", str(path)],
                timeout=300, cwd=ROOT)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert outputs[0]["text"] == "False\n"
    assert any(o.get("name") == "stderr" and "written by C++" in o["text"] for o in outputs), \
        outputs
    assert not exited.exists(), "killed after its last cell, not shut down"


def test_every_chapter_run_of_the_makefile_uses_the_plugin():
    makefile = (ROOT / "Makefile").read_text()
    (flags,) = re.findall(r"^NBMAKE := (.*(?:\\\n.*)*)", makefile, re.M)
    assert "-p tools.nbmake_kernel" in flags
    runs = re.findall(r"-m pytest (.*?)\$@", makefile)
    nbmake_runs = [r for r in runs if "nbmake" in r or "$(NBMAKE)" in r]
    assert len(nbmake_runs) == 2 and all(r.strip() == "$(NBMAKE)" for r in nbmake_runs), runs
    for rule in ("$(STAGE)/chapters/%.ipynb:", "$(OLDEST)/chapters/%.ipynb:"):
        prerequisites = makefile.split(rule, 1)[1].split("|", 1)[0]
        assert "tools/nbmake_kernel.py" in prerequisites, rule
