"""A Colab-like run: a clean environment that has torch (as Colab does) but not `helpers`,
a working directory outside the repository, and a chapter executed from its first cell, whose
setup cell installs `helpers` from a built package (not from the repository folder). The
chapter is the appendix: the cheapest page to execute (no training, no subprocess of its own)
with the same setup cell as every chapter, and the page that reads the most of what the
package carries (every committed result file, from the installed copy).

Chapter 10 runs in such an environment too, without torchkeras and Lightning (Colab ships
Accelerate only): its install cell must install them through the helpers package's
``trainers`` extra, and every trainer must run."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
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
from tests.support import run_command
from tools import wheelhouse

CHAPTER = ROOT / "chapters" / "appendix_results.ipynb"
TRAINERS_CHAPTER = ROOT / "chapters" / "10_trainers.ipynb"
#: What Colab lacks of the trainers extra (it ships Accelerate), as distributions.
NOT_ON_COLAB = ("torchkeras", "lightning", "pytorch-lightning")
FAKE = ROOT / "tests" / "fixtures" / "fake-gpu-result.json"

pytestmark = pytest.mark.slow

#: Executes a notebook in a kernel as Colab's Jupyter starts it (tools/nbmake_kernel.py, which
#: this environment does not have): without pytest's variable, killed after the last cell.
RUNNER = r"""
import os, sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
NotebookClient(nb, timeout=900, kernel_name="python3", shutdown_kernel="immediate",
               resources={"metadata": {"path": sys.argv[2]}}).execute(env=env)
nbformat.write(nb, sys.argv[3])
"""

#: Prints which of the modules named in its arguments import (one interpreter for them all).
_IMPORTABLE = """\
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    print(name)"""

#: Run in the chapter's kernel after its last cell (a cell the test appends to its copy).
PROBE_TAG = "colab-test-probe"
PROBE = """\
from helpers.results import load_results, results_dir, show_committed

print(results_dir())
print(*sorted(d["_path"].rsplit("/", 1)[1] for d in load_results()))
show_committed("matmul")"""


def _build_wheel(tmp_path: Path) -> tuple[Path, Path]:
    """Build the package the way a user gets it: a wheel, not the source folder; built from
    a copy of the sources whose results/ also holds a fake GPU machine's result file."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "helpers", source / "helpers", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "results", source / "results", ignore=shutil.ignore_patterns("pages"))
    shutil.copy(FAKE, source / "results" / FAKE.name)
    dist = tmp_path / "dist"
    wheel = wheelhouse.build_helpers_wheel(dist, source=source)
    assert [p.name for p in dist.iterdir()] == [wheel.name]
    return wheel, source


def _preinstalled_view(tmp_path: Path, hide: tuple[str, ...]) -> Path:
    """The packages of this interpreter, less the distributions named in ``hide``: a folder
    of links to every entry of site-packages except those distributions' files."""
    site = Path(sysconfig.get_paths()["purelib"])
    hidden = set()
    for name in hide:
        dist = importlib.metadata.distribution(name)
        hidden |= {Path(str(f)).parts[0] for f in dist.files or ()}
    view = tmp_path / "preinstalled"
    view.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden:
            (view / entry.name).symlink_to(entry)
    return view


def _wheel_from_installed(name: str, out: Path) -> Path:
    """A wheel of an installed pure-Python distribution, rebuilt from its RECORD: the exact
    version this interpreter tested, installable without an index."""
    dist = importlib.metadata.distribution(name)
    info = next(str(f).split("/")[0] for f in dist.files if str(f).endswith(".dist-info/WHEEL"))
    tags = [line.split(": ", 1)[1] for line in dist.read_text("WHEEL").splitlines()
            if line.startswith("Tag: ")]
    assert "Root-Is-Purelib: true" in dist.read_text("WHEEL"), f"{name} is not pure Python"
    wheel = out / f"{info.removesuffix('.dist-info')}-{tags[0]}.whl"  # name-version-tag
    skip = {f"{info}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files:
            rel = str(f)
            # console scripts live outside site-packages; the installer rewrites them
            if rel.startswith("..") or rel in skip or "__pycache__" in rel:
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            zf.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{rel},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def _clean_environment(tmp_path: Path, wheel: Path, hide: tuple[str, ...] = (),
                       find_links: Path | None = None,
                       present: tuple[str, ...] = ()) -> tuple[Path, dict, Path, Path]:
    """A clean environment: its own interpreter, torch & co. visible as Colab's are
    pre-installed (less ``hide``; the modules ``present`` names importable too, checked in
    the same interpreter as torch's), but no helpers (the project's editable install is
    not carried over). Returns its python, environment variables, site-packages and a
    working folder outside the repository."""
    env_dir = tmp_path / "env"
    # --without-pip: pip (like torch) comes from the pre-installed packages, as on Colab; a
    # fresh pip/setuptools in the venv would shadow the newer setuptools torch requires.
    run_command([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    py = env_dir / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    env_site = Path(run_command([str(py), "-c", purelib]).stdout.strip())
    preinstalled = _preinstalled_view(tmp_path, hide) if hide else sysconfig.get_paths()["purelib"]
    (env_site / "preinstalled.pth").write_text(f"{preinstalled}\n")

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
    if find_links is not None:
        env["PIP_FIND_LINKS"] = str(find_links)
    probe = subprocess.run([str(py), "-c", "import helpers"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0, "helpers must not be importable before the setup cell runs"
    # one interpreter for every module that must be there: each start imports torch anew
    run_command([str(py), "-c", f"import {', '.join(('torch', 'nbclient', 'ipykernel', *present))}"],
                cwd=work, env=env)
    return py, env, env_site, work


@pytest.mark.skipif(not CHAPTER.exists(), reason="the appendix is not written yet")
def test_chapter_runs_where_helpers_must_be_installed(tmp_path):
    # 1. The package as a user gets it.
    wheel, source = _build_wheel(tmp_path)

    # 2. A clean environment with torch & co. but no helpers.
    py, env, env_site, work = _clean_environment(tmp_path, wheel)

    # 3. Execute the chapter from outside the repository.
    notebook = work / CHAPTER.name
    nb = nbformat.read(CHAPTER, as_version=4)
    # After the chapter, in its kernel (no second interpreter to start): where the installed
    # library looks for result files, and the table the chapters show.
    nb.cells.append(nbformat.v4.new_code_cell(PROBE, metadata={"tags": [PROBE_TAG]}))
    nbformat.write(nb, notebook)
    out = work / "executed.ipynb"
    run_command([str(py), "-c", RUNNER, str(notebook), str(work), str(out)], cwd=work, env=env)
    nb = nbformat.read(out, as_version=4)
    *chapter_cells, probe = nb.cells
    assert probe.metadata["tags"] == [PROBE_TAG] and probe.source == PROBE
    assert len(chapter_cells) == len(nbformat.read(CHAPTER, as_version=4).cells)

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
    seen = "".join(o.get("text", "") for o in probe.outputs
                   if o.get("output_type") == "stream").splitlines()
    assert len(seen) == 2, probe.outputs
    assert seen[0] == str(env_site / "helpers" / "_results")
    assert seen[1].split() == committed
    # and the chapters' table shows the GPU machine's figures from the installed copy
    (shown,) = [o["data"]["text/plain"] for o in probe.outputs
                if o.get("output_type") == "display_data"]
    fake = json.loads(FAKE.read_text())
    assert "Fake GPU for tests x1" in shown and "driver 000.00-fake" in shown
    matmul = [f for f in fake["figures"] if f["workload"] == "matmul"]
    # the fixture predates schema 3, whose figure names the library shows in their place
    from helpers.results import RENAMED_FIGURES

    named = [RENAMED_FIGURES.get(f["name"], f["name"]) for f in matmul]
    assert all(f"{name} [{f['unit']}] on {f['device']}" in shown
               for name, f in zip(named, matmul, strict=True)), shown
    assert any(f"{f['value']:g}" in shown or f"{f['value']}" in shown for f in matmul), shown
    setup_cell = next(c for c in chapter_cells if c.cell_type == "code")
    setup_output = "".join(o.get("text", "") for o in setup_cell.outputs
                           if o.get("output_type") == "stream")
    assert "Using device:" in setup_output
    # the page itself read every committed file from the installed copy, the fake GPU's too
    page = "".join(o.get("text", "") + o.get("data", {}).get("text/html", "")
                   for c in chapter_cells if c.cell_type == "code" for o in c.outputs)
    assert f"{len(committed)} result file(s) in _results/:" in page, page[:2000]
    assert all(f"  {name}: " in page for name in committed), page[:2000]
    assert "Fake GPU for tests x1" in page
    errors = [o for c in nb.cells if c.cell_type == "code"
              and "raises-exception" not in c.metadata.get("tags", [])
              for o in c.outputs if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.skipif(not TRAINERS_CHAPTER.exists(), reason="chapter 10 is not written yet")
def test_trainers_chapter_installs_what_colab_lacks_and_runs_every_trainer(tmp_path):
    """What it proves: in an environment that has Accelerate but neither torchkeras nor
    Lightning, chapter 10's install cell installs them through the helpers package's
    ``trainers`` extra (the spec the setup cell uses, so the extra's names and bounds resolve),
    and the chapter then trains with all four trainers, skipping none. What it does not: pip
    resolves the extra offline, against wheels of the versions this interpreter has (those
    requirements.txt pins), not against PyPI's newest releases."""
    wheel, _ = _build_wheel(tmp_path)
    links = tmp_path / "links"  # stands for PyPI: the tested versions, rebuilt as wheels
    links.mkdir()
    for name in NOT_ON_COLAB:
        _wheel_from_installed(name, links)
    py, env, env_site, work = _clean_environment(tmp_path, wheel, hide=NOT_ON_COLAB,
                                                 find_links=links, present=("accelerate",))
    env["BOOK_DATA_DIR"] = str(ROOT / "data")  # stands for Colab's MNIST download
    # pip byte-compiles every file it installs; the kernel compiles what it imports anyway.
    # PIP_COMPILE=0, not PIP_NO_COMPILE=1: pip gives a --no-* option's variable to its
    # destination as it is, so PIP_NO_COMPILE=1 means compile=True (pip 26.3 compiles then)
    env["PIP_COMPILE"] = "0"
    missing = ("torchkeras", "lightning", "pytorch_lightning")
    probe = run_command([str(py), "-c", _IMPORTABLE, *missing], cwd=work, env=env).stdout
    assert probe.split() == [], f"{probe.split()} must be missing before the chapter runs"

    notebook = work / TRAINERS_CHAPTER.name
    shutil.copy(TRAINERS_CHAPTER, notebook)
    out = work / "executed.ipynb"
    run_command([str(py), "-c", RUNNER, str(notebook), str(work), str(out)], cwd=work, env=env)

    # the install cell put the tested versions into the clean environment itself
    where = run_command([str(py), "-c", "import importlib.metadata as m, sys\n"
                         "for name in sys.argv[1:]:\n"
                         "    d = m.distribution(name); print(name, d.version, d.locate_file(''))",
                         *NOT_ON_COLAB], cwd=work, env=env).stdout.splitlines()
    assert [line.split() for line in where] == [
        [name, importlib.metadata.version(name), str(env_site)] for name in NOT_ON_COLAB], where

    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code if "raises-exception" not in c.metadata.get("tags", [])
              for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors

    def shown(cell) -> str:
        return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                       for o in cell.outputs)

    install = shown(code[1])
    for name in ("accelerate", "torchkeras", "lightning"):
        assert f"{name} {importlib.metadata.version(name)}" in install, install
    everything = "".join(shown(c) for c in code)
    assert "not installed" not in everything and "is skipped" not in everything
    summary = next(c for c in code if "summary = pd.DataFrame(results)" in c.source)
    for trainer in ("hand-written loop", "Accelerate", "torchkeras KerasModel",
                    "Lightning Trainer"):
        assert trainer in shown(summary), f"{trainer} did not run:\n{shown(summary)}"


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

    wheel = wheelhouse.build_helpers_wheel(tmp_path / "dist", source=source)

    names = zipfile.ZipFile(wheel).namelist()
    assert "helpers/deleted_module.py" not in names
    shipped = {n for n in names if n.startswith("helpers/") and n.endswith(".py")}
    expected = {p.relative_to(source).as_posix() for p in (source / "helpers").rglob("*.py")}
    assert shipped == expected
    assert any(n.startswith("helpers/_results/") and n.endswith(".json") for n in names)
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before, \
        "building the wheel wrote into the source tree"
