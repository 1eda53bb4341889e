"""A Colab-like run: a clean environment that has torch (as Colab does) but not `helpers`,
a working directory outside the repository, and a chapter executed from its first cell, whose
setup cell installs `helpers` from a built package (not from the repository folder)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest

from tests.conftest import ROOT


def _wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

CHAPTER = ROOT / "chapters" / "01_devices.ipynb"
FAKE = ROOT / "tests" / "fixtures" / "fake-gpu-result.json"

pytestmark = pytest.mark.slow

RUNNER = r"""
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[3])
"""


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.skipif(not CHAPTER.exists(), reason="chapter 1 is not written yet")
def test_chapter_runs_where_helpers_must_be_installed(tmp_path):
    # 1. Build the package the way a user gets it: a wheel, not the source folder; built from
    #    a copy of the sources whose results/ also holds a fake GPU machine's result file.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "helpers", source / "helpers", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "results", source / "results", ignore=shutil.ignore_patterns("pages"))
    shutil.copy(FAKE, source / "results" / FAKE.name)
    dist = tmp_path / "dist"
    wheel = _wheelhouse().build_helpers_wheel(dist, source=source)
    assert [p.name for p in dist.iterdir()] == [wheel.name]

    # 2. A clean environment: its own interpreter, torch & co. visible as Colab's are
    #    pre-installed, but no helpers (the project's editable install is not carried over).
    env_dir = tmp_path / "env"
    # --without-pip: pip (like torch) comes from the pre-installed packages, as on Colab; a
    # fresh pip/setuptools in the venv would shadow the newer setuptools torch requires.
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    py = env_dir / "bin" / "python"
    env_site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                    .stdout.strip())
    (env_site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "colab"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOK_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({
        "PATH": f"{env_dir / 'bin'}:{env.get('PATH', '')}",
        "BOOK_HELPERS_SPEC": str(wheel),
        "PIP_NO_INDEX": "1",  # everything it needs is already there, as on Colab
        "JUPYTER_PATH": str(tmp_path / "jupyter"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
        "MPLBACKEND": "agg",
    })
    probe = subprocess.run([str(py), "-c", "import helpers"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0, "helpers must not be importable before the setup cell runs"
    run([str(py), "-c", "import torch, nbclient, ipykernel"], cwd=work, env=env)

    # 3. Execute the chapter from outside the repository.
    notebook = work / CHAPTER.name
    shutil.copy(CHAPTER, notebook)
    out = work / "executed.ipynb"
    run([str(py), "-c", RUNNER, str(notebook), str(work), str(out)], cwd=work, env=env)

    installed = list(env_site.glob("helpers/__init__.py"))
    assert installed, "the setup cell did not install helpers into the clean environment"
    # every subpackage travels with the wheel (the chapters import bench.*)
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "helpers").rglob("*.py")}
    got = {p.relative_to(env_site).as_posix() for p in (env_site / "helpers").rglob("*.py")}
    assert shipped <= got, f"missing from the package: {sorted(shipped - got)}"
    # the committed result files travel with the package, so the chapters show them on Colab
    committed = sorted(p.name for p in (source / "results").glob("*.json"))
    assert FAKE.name in committed
    assert sorted(p.name for p in (env_site / "helpers" / "_results").glob("*.json")) == committed
    seen = run([str(py), "-c", "from helpers.results import load_results, results_dir; "
                "print(results_dir()); print(*sorted(d['_path'].rsplit('/', 1)[1] "
                "for d in load_results()))"], cwd=work, env=env).stdout.splitlines()
    assert seen[0] == str(env_site / "helpers" / "_results")
    assert seen[1].split() == committed
    # and the chapters' table shows the GPU machine's figures from the installed copy
    shown = run([str(py), "-c", "import helpers.results as r; r.show_committed('matmul')"],
                cwd=work, env=env).stdout
    fake = json.loads(FAKE.read_text())
    assert "Fake GPU for tests x1" in shown and "driver 000.00-fake" in shown
    matmul = [f for f in fake["figures"] if f["workload"] == "matmul"]
    assert all(f"{f['name']} [{f['unit']}] on {f['device']}" in shown for f in matmul)
    assert any(f"{f['value']:g}" in shown or f"{f['value']}" in shown for f in matmul), shown
    nb = nbformat.read(out, as_version=4)
    setup_cell = next(c for c in nb.cells if c.cell_type == "code")
    setup_output = "".join(o.get("text", "") for o in setup_cell.outputs
                           if o.get("output_type") == "stream")
    assert "Using device:" in setup_output
    errors = [o for c in nb.cells if c.cell_type == "code"
              and "raises-exception" not in c.metadata.get("tags", [])
              for o in c.outputs if o.get("output_type") == "error"]
    assert not errors


def test_the_wheel_is_built_from_a_clean_copy(tmp_path):
    # A source tree whose build/ still holds a module deleted from helpers/ since the last build.
    source = tmp_path / "book"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "helpers", source / "helpers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    ghost = source / "build" / "lib" / "helpers" / "deleted_module.py"
    ghost.parent.mkdir(parents=True)
    ghost.write_text("GHOST = True\n")
    before = sorted(p.relative_to(source) for p in source.rglob("*"))

    wheel = _wheelhouse().build_helpers_wheel(tmp_path / "dist", source=source)

    names = zipfile.ZipFile(wheel).namelist()
    assert "helpers/deleted_module.py" not in names
    shipped = {n for n in names if n.startswith("helpers/") and n.endswith(".py")}
    expected = {p.relative_to(source).as_posix() for p in (source / "helpers").rglob("*.py")}
    assert shipped == expected
    assert any(n.startswith("helpers/_results/") and n.endswith(".json") for n in names)
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before, \
        "building the wheel wrote into the source tree"
