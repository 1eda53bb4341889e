"""The three rooms (CONTRIBUTING.md): chapters and the reader's library never import the
benchmark or the maintainers' tools, and the wheel a reader installs holds neither."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from tests.conftest import ROOT

UPSTAIRS = {"bench", "tools"}


def imported_roots(source: str) -> set[str]:
    """Top-level package names a piece of Python source imports (magics and shell lines skipped)."""
    code = "\n".join("" if re.match(r"\s*[%!]", line) else line for line in source.splitlines())
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                roots.add(str(node.args[0].value).split(".")[0])
    return roots


def test_imported_roots_sees_every_form():
    assert imported_roots("import bench.core\nfrom tools import x\n%pip install y\n") == \
        {"bench", "tools"}
    assert imported_roots("importlib.import_module('bench.matmul')") == {"bench"}
    assert imported_roots("from . import devices\nfrom helpers.data import mnist") == {"helpers"}


@pytest.mark.parametrize("path", sorted((ROOT / "helpers").glob("*.py")), ids=lambda p: p.name)
def test_the_library_imports_neither_benchmark_nor_tools(path: Path):
    assert not imported_roots(path.read_text()) & UPSTAIRS


@pytest.mark.parametrize("path", sorted((ROOT / "chapters").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_chapters_import_neither_benchmark_nor_tools(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not imported_roots(cell.source) & UPSTAIRS, cell.source[:200]
            assert not re.search(r"helpers\.bench", cell.source), "the benchmark is not in helpers"
        else:
            assert not re.search(r"\b(bench|tools)\.\w+\.\w+\(", cell.source), \
                "prose that teaches a benchmark or tool function as a reader's API"


@pytest.mark.slow
def test_the_wheel_a_reader_installs_holds_only_the_library(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"helpers"}, tops
    assert any(n.startswith("helpers/_results/") and n.endswith(".json") for n in names), \
        "the committed result files travel with the library"
    assert "helpers/matmul.py" in names and "helpers/launch.py" in names
