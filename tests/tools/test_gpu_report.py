"""The GPU report (tools/gpu_report.py) end to end on the CPU at quick sizes, offline from a
wheelhouse, in a copy of the book without .git, as on a GPU server; the rule that decides which
outputs a page of the book shows; and the recorded pages' own checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import nbformat
import pytest

from bench import schema
from tests.conftest import ROOT
from tests.support import output_problems, run_command
from tools import gpu_report as report

REAL_EXECUTE = report.execute  # the lanes fixture stubs it


def taking_turns(fake):
    """``fake(path, timeout)`` as a stand-in for ``report.execute`` that keeps to its turn as
    the real one does: a chapter of the lane that runs alone 'starts its kernel' at once and
    runs when the lane says so (or never, if the run is stopped first: NotRun)."""
    def execute(path: Path, timeout: int, turn=None):
        if turn is not None:
            turn.warm_up = {"seconds": 0.0, "imports": []}
            turn.warmed.set()
            turn.wait()
        return fake(path, timeout)
    return execute

SCRIPT = ROOT / "tools" / "gpu_report.py"
CHAPTER = ROOT / "chapters" / "01_devices.ipynb"
RECORDED = sorted((ROOT / "results" / "pages").glob("*/*.ipynb"))
COMMIT = "feedc0ffee0123456789"
MNIST_NAMES = ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
               "train-labels-idx1-ubyte"]




def copy_of_the_book(target: Path) -> Path:
    """The book's tracked files (as they are now), without .git: what a GPU server gets."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for name in files:
        src = ROOT / name
        if not src.exists() and not src.is_symlink():
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target / name, follow_symlinks=False)
    return target


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The real command, on a copy of the book without .git, in a clean environment that has
    torch & co. (as a CUDA image does) but not the helpers, offline from a wheelhouse: chapter 1
    and two small chapters that fail (one raises, one warns), the quick matmul benchmark."""
    from bench.__main__ import machine_record
    from helpers.devices import best_device

    tmp = tmp_path_factory.mktemp("gpu-report")
    raw = tmp / "mnist-src"
    raw.mkdir()
    for name in MNIST_NAMES:
        (raw / name).write_bytes(name.encode() * 100)
    wheelhouse = tmp / "wheelhouse"
    # a tiny set: no downloads, the helpers wheel and the data
    run_command([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--out", str(wheelhouse),
                 "--packages", "", "--mnist", str(raw)], timeout=900)
    assert (wheelhouse / "mnist-raw.tar.xz").exists()
    assert (wheelhouse / "requirements.txt").read_text().split() == []

    book = copy_of_the_book(tmp / "book")
    assert not (book / ".git").exists()
    for stem, code in (("98_warns", "import warnings\nwarnings.warn('a warning the page must not show')"),
                       ("99_fails", "raise RuntimeError('this chapter fails')")):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T"),
                                                       nbformat.v4.new_code_cell(code)]),
                       book / "chapters" / f"{stem}.ipynb")
    slug = machine_record(best_device(None))["slug"]
    stale = book / "results" / "pages" / slug
    stale.mkdir(parents=True)
    for stem in ("98_warns", "99_fails"):  # pages of an earlier run that must not survive
        shutil.copy(CHAPTER, stale / f"{stem}.ipynb")

    env_dir = tmp / "env"
    run_command([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], timeout=900)
    py = env_dir / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run_command([str(py), "-c", purelib], timeout=900).stdout.strip())
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BOOK_", "PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "BOOK_COMMIT": COMMIT,
                "HOME": str(tmp / "home"), "JUPYTER_PATH": str(tmp / "jupyter"),
                "JUPYTER_DATA_DIR": str(tmp / "jupyter"), "MPLBACKEND": "agg"})
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    probe = subprocess.run([str(py), "-c", "import helpers"], cwd=elsewhere, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0, "helpers must not be importable before the report runs"
    proc = subprocess.run(
        [str(py), str(book / "tools" / "gpu_report.py"), "--wheelhouse", str(wheelhouse),
         "--allow-cpu", "--chapters", f"{CHAPTER.stem},98_warns,99_fails", "--quick",
         "--bench-only", "matmul"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    return {"tmp": tmp, "book": book, "site": site, "slug": slug, "proc": proc,
            "work": book / "_build" / "gpu-report", "pages": book / "results" / "pages"}


@pytest.mark.slow
def test_the_report_runs_offline_from_a_copy_and_writes_into_that_copy(recorded):
    proc, book, slug = recorded["proc"], recorded["book"], recorded["slug"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]  # two chapters fail on purpose
    assert "failed chapter(s) 98_warns, 99_fails" in proc.stderr, out[-3000:]
    assert f"{CHAPTER.stem}: passed" in proc.stdout, out[-3000:]
    # everything lands in the book's copy: never in site-packages, home or the current folder
    assert sorted(p.name for p in (recorded["pages"] / slug).iterdir()) == [CHAPTER.name]
    assert not list(recorded["site"].rglob("*.ipynb")) and not (recorded["site"] / "helpers").exists()
    assert not (recorded["tmp"] / "home" / ".cache" / "pytorch-on-the-gpu").exists()
    assert not any((recorded["tmp"] / "elsewhere").iterdir())
    assert sorted(p.name for p in (book / "data" / "MNIST" / "raw").iterdir()) == MNIST_NAMES
    summary = json.loads((recorded["work"] / "report.json").read_text())
    assert "warning" in summary["chapters"]["98_warns"]["error"]
    assert "this chapter fails" in summary["chapters"]["99_fails"]["error"]
    # no page, log, summary or result file names a folder of the machine (issue 27, item 4)
    written = [p for folder in (recorded["work"], recorded["pages"] / slug)
               for p in folder.rglob("*") if p.suffix in (".ipynb", ".log", ".json", ".xml")]
    assert any(p.name == f"{slug}.json" for p in written), "the quick benchmark's result file"
    for path in written:
        assert str(recorded["tmp"]) not in path.read_text(errors="replace"), path


@pytest.mark.slow
def test_the_report_writes_a_result_file_and_stamped_pages(recorded):
    work, slug = recorded["work"], recorded["slug"]
    (result,) = (work / "bench").glob("*.json")
    assert schema.validate_file(result) == []
    doc = json.loads(result.read_text())
    assert doc["quick"] is True and "--only matmul" in doc["command"]
    assert doc["machine"]["slug"] == slug
    page_path = recorded["pages"] / slug / CHAPTER.name
    assert (work / "chapters" / CHAPTER.name).exists(), "the executed notebook is kept"
    page = nbformat.read(page_path, as_version=4)
    run = page.metadata["book"]["recorded_run"]
    import torch

    assert run["torch"] == str(torch.__version__)
    assert run["code_hash"] == report.code_hash(nbformat.read(CHAPTER, as_version=4))
    for key in ("device", "driver", "cuda", "date", "slug"):
        assert key in run, key
    # a copy without .git names its commit with BOOK_COMMIT, in the pages and the result file
    assert run["book_commit"] == doc["machine"]["book_commit"] == COMMIT
    stamp = page.cells[1]
    assert report.STAMP_TAG in stamp.metadata["tags"]
    assert f"torch {run['torch']}" in stamp.source and run["date"][:10] in stamp.source
    assert COMMIT[:10] in stamp.source
    assert "CI also runs this page on a CPU-only machine" in stamp.source
    assert output_problems(page) == []


@pytest.mark.slow
def test_a_page_shows_the_recorded_run_only_while_its_code_matches(recorded, tmp_path):
    pages = tmp_path / "pages"
    # Only this run's pages: a GPU page committed for the same code would be chosen first.
    shutil.copytree(recorded["pages"] / recorded["slug"], pages / recorded["slug"])
    executed = tmp_path / "cpu-executed"
    executed.mkdir()
    cpu = nbformat.read(recorded["work"] / "chapters" / CHAPTER.name, as_version=4)
    cpu.metadata["book"]["from"] = "the CPU build"  # tells the CPU copy apart
    first_code = next(c for c in cpu.cells if c.cell_type == "code")
    first_code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="CPU build\n")]
    prose = next(c for c in cpu.cells if c.cell_type == "markdown")
    prose.source += "\n\nA sentence added after the recorded run."
    nbformat.write(cpu, executed / CHAPTER.name)
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    shutil.copy(CHAPTER, chapters / CHAPTER.name)

    def staged() -> nbformat.NotebookNode:
        out = tmp_path / "staged"
        shutil.rmtree(out, ignore_errors=True)
        assert report.main(["stage", "--executed", str(executed), "--out", str(out),
                            "--chapter-dir", str(chapters), "--pages", str(pages)]) == 0
        return nbformat.read(out / CHAPTER.name, as_version=4)

    current = staged()
    recorded_page = nbformat.read(pages / recorded["slug"] / CHAPTER.name, as_version=4)
    assert current.metadata["book"]["recorded_run"] == recorded_page.metadata["book"]["recorded_run"]
    assert report.STAMP_TAG in current.cells[1].metadata["tags"]
    # the recorded outputs, in the current chapter's prose
    shown = next(c for c in current.cells if c.cell_type == "code")
    recorded_code = next(c for c in recorded_page.cells if c.cell_type == "code")
    assert shown.outputs == recorded_code.outputs and "CPU build" not in str(shown.outputs)
    assert any("A sentence added after the recorded run." in c.source for c in current.cells)
    assert output_problems(current) == []

    edited = nbformat.read(chapters / CHAPTER.name, as_version=4)
    code = next(c for c in edited.cells if c.cell_type == "code" and c.source.strip())
    code.source += "\n# changed"
    nbformat.write(edited, chapters / CHAPTER.name)
    stale = staged()
    assert stale.metadata["book"]["from"] == "the CPU build"
    assert "recorded_run" not in stale.metadata["book"]
    assert report.CPU_NOTE_TAG in stale.cells[1].metadata["tags"]
    assert "earlier version of this page's code" in stale.cells[1].source

    shutil.rmtree(pages)
    none = staged()
    assert "no run of this page on a GPU is recorded yet" in none.cells[1].source


def _fake_page(folder: Path, slug: str, chapter, gpu_count: int, date: str, code_hash: str):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T")])
    nb.metadata["book"] = {"recorded_run": {"slug": slug, "gpu_count": gpu_count, "date": date,
                                            "code_hash": code_hash, "machine_label": slug}}
    (folder / slug).mkdir(parents=True)
    nbformat.write(nb, folder / slug / "x.ipynb")


def test_the_newest_matching_gpu_run_is_chosen(tmp_path):
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    h = report.code_hash(chapter)
    _fake_page(tmp_path, "gpu-a-x1", chapter, 1, "2026-01-01T00:00:00+00:00", h)
    _fake_page(tmp_path, "gpu-b-x1", chapter, 1, "2026-02-01T00:00:00+00:00", h)
    _fake_page(tmp_path, "gpu-c-x1", chapter, 1, "2026-03-01T00:00:00+00:00", "other")
    _fake_page(tmp_path, "cpu-d-2c", chapter, 0, "2026-04-01T00:00:00+00:00", h)
    page, stale = report.choose_page(chapter, tmp_path, "x")
    assert page.metadata["book"]["recorded_run"]["slug"] == "gpu-b-x1"
    assert [r["slug"] for r in stale] == ["gpu-c-x1"]
    # markdown edits keep a recorded page current; code edits do not
    chapter.cells.append(nbformat.v4.new_markdown_cell("more prose"))
    assert report.code_hash(chapter) == h


@pytest.mark.parametrize("path", RECORDED, ids=[f"{p.parent.name}/{p.stem}" for p in RECORDED])
def test_recorded_pages_are_clean_and_stamped(path):
    page = nbformat.read(path, as_version=4)
    assert output_problems(page) == []
    run = page.metadata["book"]["recorded_run"]
    assert run["slug"] == path.parent.name
    assert (ROOT / "chapters" / path.name).exists(), "a recorded page of a chapter that is gone"
    assert any(report.STAMP_TAG in c.metadata.get("tags", []) for c in page.cells)


def _marked(text: str, workload: str = "matmul"):
    """An output as helpers.results.show_committed marks it."""
    from helpers.results import DISPLAY_KEY

    return nbformat.v4.new_output("display_data", data={"text/plain": text},
                                  metadata={DISPLAY_KEY: workload})


def test_a_recorded_page_keeps_the_current_prose_and_the_books_committed_tables():
    code = "print('live')\ncommitted = helpers.results.show_committed('matmul')"
    cpu = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title\n\nProse as it is now."),
        nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("x = 1")])
    cpu.metadata["book"] = {"chapter": 3}
    cpu.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="live on cpu\n"),
                            _marked("every machine committed now")]
    gpu = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title\n\nProse as it was."),
        nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("x = 1")])
    gpu.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="live on cuda\n"),
                            _marked("the machines committed back then")]
    gpu.cells[1].execution_count = 7
    gpu.metadata["book"] = {"recorded_run": {"slug": "gpu-x1"}}
    gpu.metadata["widgets"] = {"state": "recorded"}

    page = report.splice(cpu, gpu)
    assert page.cells[0].source.endswith("Prose as it is now.")
    assert [o.get("text") or o["data"]["text/plain"] for o in page.cells[1].outputs] == \
        ["live on cuda\n", "every machine committed now"]
    assert page.cells[1].execution_count == 7
    assert page.metadata["book"] == {"chapter": 3, "recorded_run": {"slug": "gpu-x1"}}
    assert page.metadata["widgets"] == {"state": "recorded"}
    assert cpu.cells[1].outputs[0]["text"] == "live on cpu\n", "the CPU copy is left alone"
    gpu.cells.append(nbformat.v4.new_code_cell("y = 2"))
    with pytest.raises(ValueError, match="code cells"):
        report.splice(cpu, gpu)


def test_the_appendix_is_never_recorded_nor_replaced(tmp_path):
    names = [p.stem for p in report.chosen_chapters("")]
    assert "appendix_results" not in names and CHAPTER.stem in names
    with pytest.raises(SystemExit, match="never recorded"):
        report.chosen_chapters("appendix_results")
    with pytest.raises(SystemExit, match="no such chapter"):
        report.chosen_chapters("00_nothing")
    # even a recorded appendix with the current code hash is not shown
    chapters, executed, pages = tmp_path / "c", tmp_path / "e", tmp_path / "p"
    for folder in (chapters, executed, pages / "gpu-x1"):
        folder.mkdir(parents=True)
    appendix = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A"),
                                               nbformat.v4.new_code_cell("print(1)")])
    nbformat.write(appendix, chapters / "appendix_results.ipynb")
    nbformat.write(appendix, executed / "appendix_results.ipynb")
    gpu = nbformat.v4.new_notebook(cells=appendix.cells)
    gpu.metadata["book"] = {"recorded_run": {"slug": "gpu-x1", "gpu_count": 1, "date": "2026",
                                             "code_hash": report.code_hash(appendix)}}
    nbformat.write(gpu, pages / "gpu-x1" / "appendix_results.ipynb")
    assert report.main(["stage", "--executed", str(executed), "--out", str(tmp_path / "o"),
                        "--chapter-dir", str(chapters), "--pages", str(pages)]) == 0
    assert nbformat.read(tmp_path / "o" / "appendix_results.ipynb", as_version=4) == appendix


@pytest.fixture
def in_process(monkeypatch, tmp_path):
    """``report.main`` in this process: its environment changes are undone afterwards."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("BOOK_COMMIT", raising=False)
    monkeypatch.delenv("BOOK_DEVICE", raising=False)
    installs = []
    monkeypatch.setattr(report, "install_wheelhouse", installs.append)
    return installs


def test_an_old_torch_is_refused_before_anything_is_installed(in_process, monkeypatch, tmp_path):
    import helpers

    monkeypatch.setattr(helpers, "MIN_TORCH", "99.0")
    with pytest.raises(SystemExit, match="older than 99.0"):
        report.main(["--wheelhouse", str(tmp_path), "--allow-cpu", "--work", str(tmp_path)])
    assert in_process == []


def test_a_machine_without_an_accelerator_is_refused(in_process, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr("helpers.devices.best_device", lambda override=None: torch.device("cpu"))
    with pytest.raises(SystemExit, match="no GPU or other accelerator") as caught:
        report.main(["--chapters", CHAPTER.stem, "--work", str(tmp_path)])
    assert "--allow-cpu" in str(caught.value) and "REPORT_PY" in str(caught.value)
    assert not any(tmp_path.iterdir()), "nothing ran"


def test_a_full_run_needs_the_books_commit(in_process, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr("helpers.devices.best_device", lambda override=None: torch.device("cpu"))
    from bench import core

    real_book_commit = core.book_commit
    monkeypatch.setattr(core, "book_commit", lambda: "unknown")
    with pytest.raises(SystemExit, match="BOOK_COMMIT="):
        report.main(["--allow-cpu", "--work", str(tmp_path)])
    monkeypatch.setenv("BOOK_COMMIT", "abc123")
    assert real_book_commit() == "abc123"


def test_gpu_only_cells_show_a_recorded_runs_output_for_the_same_code(tmp_path) -> None:
    new = nbformat.v4
    gpu_cell = "%%gpu_only\nprint(torch.cuda.get_device_name(device))"
    page = new.new_notebook(cells=[
        new.new_code_cell("x = 1", outputs=[]),
        new.new_code_cell(gpu_cell, outputs=[new.new_output(
            "stream", name="stdout", text="This cell needs a CUDA GPU; this run uses cpu.\n")]),
        new.new_code_cell("%%gpu_only\nprint('changed since the run')", outputs=[]),
    ])
    recorded = new.new_notebook(cells=[
        new.new_code_cell("x = 2", outputs=[]),
        new.new_code_cell(gpu_cell, outputs=[new.new_output("stream", name="stdout",
                                                            text="NVIDIA H100\n")]),
    ])
    recorded.metadata["book"] = {"recorded_run": {"machine_label": "NVIDIA H100 x1",
                                                  "torch": "2.11.0", "date": "2026-11-20T00"}}
    assert report.splice_gpu_only(page, [(tmp_path / "a.ipynb", recorded)]) == 1
    texts = ["".join(o["text"]) for o in page.cells[1].outputs]
    assert texts == ["[recorded on NVIDIA H100 x1, torch 2.11.0, 2026-11-20]\n", "NVIDIA H100\n"]
    assert page.cells[2].outputs == [] and page.cells[0].outputs == []
    assert report.splice_gpu_only(page, []) == 0


def test_a_report_in_parts_keeps_what_each_part_recorded_and_resume_completes_it(
        in_process, monkeypatch, tmp_path):
    # A short time on a GPU: each part records as it goes, a part out of time says what it
    # left, and --resume runs only what is missing. Executing a chapter is stubbed here.
    import torch

    monkeypatch.setattr("helpers.devices.best_device", lambda override=None: torch.device("cpu"))
    monkeypatch.setenv("BOOK_COMMIT", COMMIT)
    ran: list[str] = []

    def fake_execute(path: Path, timeout: int):
        ran.append(path.stem)
        return True, ""

    monkeypatch.setattr(report, "execute", taking_turns(fake_execute))
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    two = ["01_a", "02_b"]
    for stem in two:
        nbformat.write(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell(f"# {stem}"), nbformat.v4.new_code_cell("x = 1")]),
            chapters / f"{stem}.ipynb")
    monkeypatch.setattr(report, "CHAPTERS", chapters)
    common = ["--allow-cpu", "--no-bench", "--work", str(tmp_path / "w"), "--results",
              str(tmp_path / "r"), "--chapters", ",".join(two)]
    assert report.main([*common, "--budget", "0"]) == 1, "out of time: not complete"
    summary = json.loads((tmp_path / "w" / "report.json").read_text())
    assert summary["not_run"] == two and ran == []
    assert report.main([*common[:-2], "--chapters", two[0]]) == 0
    assert ran == [two[0]]
    pages = list((tmp_path / "r" / "pages").glob("*/*.ipynb"))
    assert [p.stem for p in pages] == [two[0]]
    assert report.main([*common, "--resume"]) == 0
    assert ran == [two[0], two[1]], "--resume runs only the chapter not yet recorded"
    assert sorted(p.stem for p in (tmp_path / "r" / "pages").glob("*/*.ipynb")) == two


def test_the_chapters_that_need_a_gpu_most_run_first():
    names = [p.stem for p in report.chosen_chapters("")]
    first = [n for n in report.FIRST if (ROOT / "chapters" / f"{n}.ipynb").exists()]
    assert names[:len(first)] == first
    assert names[len(first):] == sorted(names[len(first):])


def _wheels(folder: Path, *names: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / report.WHEELHOUSE_REQUIREMENTS).write_text("")
    for name in names:
        (folder / f"{name}-py3-none-any.whl").write_bytes(b"w")


def test_a_wheel_of_a_package_the_server_has_in_another_version_stops_the_install(
        monkeypatch, tmp_path):
    _wheels(tmp_path, "numpy-2.4.6", "ipykernel-7.4.0", "Jupyter_Client-8.10.0")
    pip = []
    monkeypatch.setattr(report.subprocess, "run", lambda cmd, **kw: pip.append(cmd))
    monkeypatch.setattr(report, "installed_versions",
                        lambda: {"numpy": "2.5.2", "jupyter-client": "8.9.0", "torch": "2.11"})
    with pytest.raises(SystemExit, match="would replace") as caught:
        report.install_wheelhouse(tmp_path)
    said = str(caught.value)
    assert "numpy (the wheelhouse has 2.4.6, this machine 2.5.2)" in said
    assert "jupyter-client (the wheelhouse has 8.10.0, this machine 8.9.0)" in said
    assert "ipykernel" not in said and "Nothing was installed" in said and pip == []


def test_the_wheelhouse_installs_only_what_is_missing_without_dependencies(
        monkeypatch, tmp_path, capsys):
    _wheels(tmp_path, "numpy-2.5.2", "ipykernel-7.4.0", "pytorch_on_the_gpu_helpers-0.1.0")
    pip = []
    # pip check before the install (the server's own conflict), then after it: what the
    # install left unmet, and a server package it broke (whatever the line's first name)
    own = "scipy 1.0 has requirement numpy<2, but you have numpy 2.5.2.\n"
    checks = iter([own, own + "ipykernel 7.4.0 requires debugpy, which is not installed.\n"
                   "jupyterlab 3.0 has requirement ipykernel<7, but you have ipykernel 7.4.0.\n"])

    def run(cmd, **kw):
        pip.append(cmd)
        out = next(checks) if cmd[-2:] == ["pip", "check"] else ""
        return subprocess.CompletedProcess(cmd, 0, stdout=out)

    monkeypatch.setattr(report.subprocess, "run", run)
    monkeypatch.setattr(report, "installed_versions", lambda: {"numpy": "2.5.2"})
    report.install_wheelhouse(tmp_path)
    before, install, after = pip
    assert install[install.index("install"):install.index("install") + 4] == [
        "install", "--quiet", "--no-index", "--no-deps"]
    assert [Path(a).name for a in install if a.endswith(".whl")] == [
        "ipykernel-7.4.0-py3-none-any.whl"]  # not numpy (the same version), not the helpers
    assert before[-2:] == after[-2:] == ["pip", "check"]
    out = capsys.readouterr()
    assert "Already here in the same version: numpy 2.5.2" in out.out
    assert "requires debugpy" in out.err and "jupyterlab 3.0 has requirement ipykernel<7" \
        in out.err and "--server-has" in out.err
    assert "scipy" not in out.err, "the server's own conflicts are not the install's"


def test_a_wheelhouse_pip_cannot_install_stops_the_report_saying_why(monkeypatch, tmp_path):
    _wheels(tmp_path, "ipykernel-7.4.0")
    (tmp_path / "wheelhouse.json").write_text('{"python": "3.9"}')

    def run(cmd, **kw):
        if "install" in cmd:
            raise subprocess.CalledProcessError(1, cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(report.subprocess, "run", run)
    monkeypatch.setattr(report, "installed_versions", lambda: {})
    with pytest.raises(SystemExit, match=r"built for Python 3\.9, this is 3\.\d+.*"
                                         r"WHEEL_PYTHON"):
        report.install_wheelhouse(tmp_path)


def test_an_install_that_mends_the_machines_requirements_reports_nothing(
        monkeypatch, tmp_path, capsys):
    _wheels(tmp_path, "nbformat-5.11.1")
    checks = iter(["nbclient 0.11 requires nbformat, which is not installed.\n",
                   "No broken requirements found.\n"])
    monkeypatch.setattr(report.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 0, stdout=next(checks) if cmd[-1] == "check" else ""))
    monkeypatch.setattr(report, "installed_versions", lambda: {})
    report.install_wheelhouse(tmp_path)
    assert "pip check" not in capsys.readouterr().err
    assert next(checks, None) is None, "pip check ran before and after the install"


def test_the_installed_versions_are_read_by_normalised_name():
    found = report.installed_versions()
    import nbformat as nbf

    assert found["nbformat"] == nbf.__version__ and "typing-extensions" in found


# The lanes ---------------------------------------------------------------------------------

#: What measures time in a chapter's code: the book's timers and claims, Python's clocks,
#: CUDA events, IPython's timing magics, a helper's measured seconds read out.
TIMING = re.compile(r"perf_counter|\bmonotonic\(|\btime\.time\(|helpers\.timing|\bbenchmark\("
                    r"|\btimed\(|Timer\(|expect\(|enable_timing|elapsed_time\(|^%%?time"
                    r"|\[[\"']seconds[\"']\]", re.M)
GPUS = re.compile(r"^%%gpu_only\b.*--gpus[ =](\d+)")


def timed_but_not_alone(runs_alone) -> list[str]:
    """Each chapter cell that measures time (:data:`TIMING`) where ``runs_alone(stem,
    gpu_count)`` says its chapter does not run alone on a machine that runs the cell (a
    ``%%gpu_only --gpus N`` cell runs on N GPUs or more)."""
    wrong = []
    for stem in sorted(p.stem for p in report.chosen_chapters("")):
        nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
        for i, cell in enumerate(nb.cells):
            gpus = GPUS.match(cell.source)
            if cell.cell_type == "code" and TIMING.search(cell.source) and not \
                    runs_alone(stem, int(gpus.group(1)) if gpus else 1):
                wrong.append(f"{stem} cell {i}")
    return wrong


def test_every_chapter_that_times_something_runs_alone_and_the_table_names_real_chapters():
    stems = {p.stem for p in report.chosen_chapters("")}
    assert set(report.RUN_ALONE) <= stems and set(report.RUN_ALONE_FROM_GPUS) <= stems
    assert timed_but_not_alone(report.runs_alone) == [], "add these chapters to RUN_ALONE"
    side_by_side = sorted(s for s in stems if not report.runs_alone(s, 1))
    assert side_by_side == ["01_devices", "07_data_parallel", "08_device_pitfalls"]
    assert report.runs_alone("07_data_parallel", 2)  # its two-GPU cell prints seconds


@pytest.mark.parametrize("left_out", [*report.RUN_ALONE, *report.RUN_ALONE_FROM_GPUS])
def test_the_guard_finds_a_timing_chapter_left_out_of_the_table(monkeypatch, left_out):
    monkeypatch.delitem(report.RUN_ALONE, left_out, raising=False)
    monkeypatch.delitem(report.RUN_ALONE_FROM_GPUS, left_out, raising=False)
    assert any(w.startswith(f"{left_out} cell") for w in timed_but_not_alone(report.runs_alone))


@pytest.fixture
def lanes(in_process, monkeypatch, tmp_path):
    """The report with executing stubbed: each chapter 'runs' 0.3 s; when each ran is kept."""
    import threading
    import time

    import torch

    monkeypatch.setattr("helpers.devices.best_device", lambda override=None: torch.device("cpu"))
    monkeypatch.setenv("BOOK_COMMIT", COMMIT)
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def fake_execute(path: Path, timeout: int):
        start = time.monotonic()
        time.sleep(0.3)
        with lock:
            spans[path.stem] = (start, time.monotonic())
        return True, ""

    monkeypatch.setattr(report, "execute", taking_turns(fake_execute))
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    stems = ["01_devices", "03_matmul", "05_mnist", "07_data_parallel", "08_device_pitfalls"]
    for stem in stems:
        nbformat.write(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell(f"# {stem}"), nbformat.v4.new_code_cell("x = 1")]),
            chapters / f"{stem}.ipynb")
    monkeypatch.setattr(report, "CHAPTERS", chapters)
    return {"spans": spans, "stems": stems, "tmp": tmp_path,
            "args": ["--allow-cpu", "--no-bench", "--work", str(tmp_path / "w"), "--results",
                     str(tmp_path / "r"), "--chapters", ",".join(stems)]}


def test_chapters_that_time_something_run_alone_and_the_others_side_by_side(lanes):
    assert report.main([*lanes["args"], "--workers", "3"]) == 0
    spans = lanes["spans"]
    alone, beside = ["03_matmul", "05_mnist"], ["01_devices", "07_data_parallel",
                                                "08_device_pitfalls"]
    for stem in alone:  # nothing else runs while a timing chapter does
        start, end = spans[stem]
        assert all(spans[o][1] <= start or spans[o][0] >= end for o in spans if o != stem)
    assert max(spans[s][0] for s in beside) < min(spans[s][1] for s in beside), "overlapped"
    pages = lanes["tmp"] / "r" / "pages"
    for stem in lanes["stems"]:
        (page,) = pages.glob(f"*/{stem}.ipynb")
        nb = nbformat.read(page, as_version=4)
        ran = nb.metadata["book"]["recorded_run"]["ran"]
        stamp = nb.cells[1].source
        if stem in alone:
            assert ran == "alone" and "It ran alone on the machine." in stamp
        else:
            assert ran == "beside other chapters (3 at a time)"
            assert "It measures no time and ran beside other chapters (3 at a time)." in stamp
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["chapters"]["01_devices"]["ran"].startswith("beside")
    parts = summary["parts_seconds"]
    assert parts["chapters alone"] >= 0.6 and parts["chapters side by side"] < 0.9
    assert parts["total"] >= parts["chapters alone"] + parts["chapters side by side"] - 0.1


def test_with_one_worker_and_no_tests_every_chapter_runs_alone(lanes):
    assert report.main([*lanes["args"], "--workers", "1"]) == 0
    pages = sorted((lanes["tmp"] / "r" / "pages").glob("*/*.ipynb"))
    assert len(pages) == 5
    for page in pages:
        assert nbformat.read(page, as_version=4).metadata["book"]["recorded_run"]["ran"] == "alone"
    spans = sorted(lanes["spans"].values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_a_page_recorded_before_the_lanes_says_nothing_about_them():
    run = {"machine_label": "NVIDIA H200 x1", "device": "cuda:0", "date": "2026-11-28T06",
           "book_commit": COMMIT, "torch": "2.11.0", "cuda": "13.0", "driver": "580"}
    assert "It ran" not in report.stamp_text(run) and "measures no time" not in \
        report.stamp_text(run)


# One archive back --------------------------------------------------------------------------

def test_the_archive_holds_what_the_run_wrote_and_unpacks_into_a_checkout(lanes):
    archive = lanes["tmp"] / "out" / "run.tar.xz"
    assert report.main([*lanes["args"], "--workers", "2", "--archive", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    slug = next((lanes["tmp"] / "r" / "pages").iterdir()).name
    for stem in lanes["stems"]:
        assert f"results/pages/{slug}/{stem}.ipynb" in names
        assert f"_build/gpu-report/chapters/{stem}.ipynb" in names
    assert "_build/gpu-report/report.json" in names
    assert archive.stat().st_size < report.ARCHIVE_LIMIT
    # into a checkout: the same files, byte for byte
    root = lanes["tmp"] / "checkout"
    (root / "results" / "pages").mkdir(parents=True)
    unpacked = report.unpack(archive, root)
    assert sorted(unpacked) == sorted(names)
    page = f"results/pages/{slug}/01_devices.ipynb"
    assert (root / page).read_bytes() == (lanes["tmp"] / "r" / "pages" / slug /
                                          "01_devices.ipynb").read_bytes()
    # again: it replaces what a report wrote
    assert sorted(report.unpack(archive, root)) == sorted(names)
    assert not list((root / "_build").glob("unpack-*")), "no staging folder left"


def _tar(path: Path, members: dict[str, bytes], link: str | None = None) -> Path:
    import io

    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return path


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "results" / "pages" / "gpu-x1").mkdir(parents=True)
    (root / "chapters").mkdir()
    (root / "chapters" / "01_devices.ipynb").write_text("the chapter")
    recorded = nbformat.v4.new_notebook()
    recorded.metadata["book"] = {"recorded_run": {"slug": "gpu-x1"}}
    nbformat.write(recorded, root / "results" / "pages" / "gpu-x1" / "03_matmul.ipynb")
    (root / "results" / "pages" / "gpu-x1" / "05_mnist.ipynb").write_text('{"cells": []}')
    (root / "results" / "README.md").write_text("mine")
    return root


PAGE = json.dumps({"cells": [], "metadata": {"book": {"recorded_run": {}}}}).encode()


@pytest.mark.parametrize("members, link, why", [
    ({"../outside.json": b"{}"}, None, "outside the checkout"),
    ({"/tmp/abs.json": b"{}"}, None, "outside the checkout"),
    ({"results/pages/gpu-x1/../../../x.json": b"{}"}, None, "outside the checkout"),
    ({"chapters/01_devices.ipynb": PAGE}, None, "not a place a report writes"),
    ({"results/README.md": b"x"}, None, "not a place a report writes"),
    ({"results/a/b/c.json": b"{}"}, None, "not a place a report writes"),
    ({"results/pages/gpu-x1/05_mnist.ipynb": PAGE}, None, "would overwrite a file no report"),
    ({"_build/gpu-report/ok.log": b"x"}, "results/pages/gpu-x1/l.ipynb", "not a plain file"),
], ids=["parent", "absolute", "climbs", "a-chapter", "results-readme", "deep-results",
        "not-recorded", "symlink"])
def test_an_archive_that_would_write_outside_a_reports_files_unpacks_nothing(
        tmp_path, members, link, why):
    root = _checkout(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    archive = _tar(tmp_path / "a.tar.xz", {"results/pages/gpu-x1/03_matmul.ipynb": PAGE,
                                           "results/gpu-x1.json": b"{}", **members}, link)
    with pytest.raises(SystemExit, match=why) as caught:
        report.unpack(archive, root)
    assert "nothing" in str(caught.value)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_an_archive_over_the_limit_or_broken_unpacks_nothing(tmp_path):
    root = _checkout(tmp_path)
    archive = _tar(tmp_path / "a.tar.xz", {"results/gpu-x1.json": os.urandom(5000)})
    with pytest.raises(SystemExit, match="over the .* MiB an archive of a run may have"):
        report.unpack(archive, root, limit=1024)
    broken = tmp_path / "b.tar.xz"
    broken.write_bytes(archive.read_bytes()[:-100])
    with pytest.raises(SystemExit, match="nothing was"):
        report.unpack(broken, root)
    assert not (root / "results" / "gpu-x1.json").exists()


def test_a_move_that_fails_half_way_puts_everything_back(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    page = root / "results" / "pages" / "gpu-x1" / "03_matmul.ipynb"
    old = page.read_bytes()
    archive = _tar(tmp_path / "a.tar.xz", {"results/pages/gpu-x1/03_matmul.ipynb": PAGE,
                                           "results/gpu-x1.json": b"{}",
                                           "_build/gpu-report/tests.log": b"log"})
    real_move, moves = shutil.move, []

    def failing_move(src, dst):
        moves.append(dst)
        if str(dst).endswith("tests.log"):
            raise OSError("disk full")
        return real_move(src, dst)

    monkeypatch.setattr(report.shutil, "move", failing_move)
    with pytest.raises(SystemExit, match="disk full"):
        report.unpack(archive, root)
    assert page.read_bytes() == old
    assert not (root / "results" / "gpu-x1.json").exists()
    assert not (root / "_build" / "gpu-report").exists(), "the folders it made are removed"
    assert not list((root / "_build").glob("unpack-*")), "no staging folder left"


def test_a_file_that_cannot_be_put_back_is_kept_and_named(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    page = root / "results" / "pages" / "gpu-x1" / "03_matmul.ipynb"
    old = page.read_bytes()
    archive = _tar(tmp_path / "a.tar.xz", {"results/pages/gpu-x1/03_matmul.ipynb": PAGE,
                                           "_build/gpu-report/tests.log": b"log"})
    real_move = shutil.move

    def failing_move(src, dst):
        if str(dst).endswith("tests.log") or "old" in Path(src).parts:  # the move, the undo
            raise OSError("disk full")
        return real_move(src, dst)

    monkeypatch.setattr(report.shutil, "move", failing_move)
    with pytest.raises(SystemExit, match="could not be put back") as caught:
        report.unpack(archive, root)
    (staging,) = (root / "_build").glob("unpack-*")
    assert str(staging / "old") in str(caught.value) and "03_matmul.ipynb" in str(caught.value)
    (kept,) = (staging / "old").iterdir()
    assert kept.read_bytes() == old, "the checkout's file is kept where the message says"


def test_unpack_removes_the_page_of_a_chapter_the_run_found_failing(tmp_path, monkeypatch):
    """As the report does on its machine: no page of an earlier run survives a chapter that
    fails now (the checkout's other pages, and anything outside them, stay)."""
    root = _checkout(tmp_path)
    pages = root / "results" / "pages" / "gpu-x1"
    for stem in ("05_mnist", "11_cuda_semantics"):  # recorded by an earlier run
        shutil.copy(pages / "03_matmul.ipynb", pages / f"{stem}.ipynb")
    summary = {"run": {"slug": "gpu-x1"}, "chapters": {
        "03_matmul": {"ok": True}, "05_mnist": {"ok": False}, "01_devices": {"ok": False}}}
    archive = _tar(tmp_path / "a.tar.xz", {
        "results/pages/gpu-x1/03_matmul.ipynb": PAGE,
        "_build/gpu-report/report.json": json.dumps(summary).encode()})
    assert sorted(report.unpack(archive, root)) == [
        "_build/gpu-report/report.json", "results/pages/gpu-x1/03_matmul.ipynb"]
    assert not (pages / "05_mnist.ipynb").exists(), "failed now: its old page is gone"
    assert (pages / "11_cuda_semantics.ipynb").exists(), "not run now: its page stays"
    # a summary naming other places removes nothing there
    summary = {"run": {"slug": "../../chapters/x"}, "chapters": {"../01_devices": {"ok": False}}}
    evil = _tar(tmp_path / "e.tar.xz", {
        "_build/gpu-report/report.json": json.dumps(summary).encode()})
    report.unpack(evil, root)
    assert (root / "chapters" / "01_devices.ipynb").read_text() == "the chapter"
    for odd in ({"run": {"slug": "gpu-x1"}, "chapters": ["11_cuda_semantics"]},
                {"run": {"slug": ["gpu-x1"]}, "chapters": {}},
                {"run": {"slug": "gpu-x1"}, "chapters": {"11_cuda_semantics": "failed"}}):
        report.unpack(_tar(tmp_path / "o.tar.xz", {
            "_build/gpu-report/report.json": json.dumps(odd).encode()}), root)
    assert (pages / "11_cuda_semantics.ipynb").exists(), "a summary it cannot read removes none"
    # a removal is undone with the rest when a later move fails
    shutil.copy(pages / "03_matmul.ipynb", pages / "05_mnist.ipynb")
    real_move = shutil.move

    def failing_move(src, dst):
        if str(src).endswith("11_cuda_semantics.ipynb"):
            raise OSError("disk full")
        return real_move(src, dst)

    monkeypatch.setattr(report.shutil, "move", failing_move)
    failed = {"05_mnist": {"ok": False}, "11_cuda_semantics": {"ok": False}}
    with pytest.raises(SystemExit, match="disk full"):
        report.unpack(_tar(tmp_path / "b.tar.xz", {
            "results/pages/gpu-x1/03_matmul.ipynb": b"{}",
            "_build/gpu-report/report.json": json.dumps({"run": {"slug": "gpu-x1"},
                                                         "chapters": failed}).encode()}), root)
    assert (pages / "05_mnist.ipynb").exists() and (pages / "11_cuda_semantics.ipynb").exists()
    assert (pages / "03_matmul.ipynb").read_bytes() == PAGE


def test_an_archive_naming_a_file_twice_unpacks_nothing(tmp_path):
    import io

    root = _checkout(tmp_path)
    archive = tmp_path / "twice.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for data in (b"{}", b"[]"):
            info = tarfile.TarInfo("results/gpu-x1.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SystemExit, match="results/gpu-x1.json: twice in the archive"):
        report.unpack(archive, root)
    assert not (root / "results" / "gpu-x1.json").exists()


def test_an_archive_that_expands_past_the_limit_is_refused_before_it_is_read_through(
        tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    archive = _tar(tmp_path / "big.tar.xz", {f"_build/gpu-report/{i}.log": bytes(6000)
                                             for i in range(50)})
    assert archive.stat().st_size < 6000, "zeros compress: a small archive, a large content"
    monkeypatch.setattr(report, "UNPACKED_LIMIT", 10_000)
    read = []
    real_next = tarfile.TarFile.next
    monkeypatch.setattr(tarfile.TarFile, "next", lambda self: read.append(1) or real_next(self))
    with pytest.raises(SystemExit, match="over 0.00953674 MiB, more than a run writes"):
        report.unpack(archive, root)
    # of 50 members: the two that pass the limit (and tarfile.open's tries of each format)
    assert len(read) < 10, "it stops at the member that passes the limit"
    assert not (root / "_build" / "gpu-report").exists()


def test_an_archive_over_16_mib_is_not_written(tmp_path):
    work, results = tmp_path / "w", tmp_path / "r"
    work.mkdir()
    big = work / "tests.log"
    big.write_bytes(os.urandom(3000))
    with pytest.raises(SystemExit, match=r"over its .* _build/gpu-report/tests.log"):
        report.pack(tmp_path / "a.tar.xz", [big], results, work, limit=1000)
    assert not list(tmp_path.glob("a.tar.xz*"))
    with pytest.raises(ValueError, match="neither under"):
        report.archive_name(tmp_path / "x", results, work)


def test_the_unit_tests_are_a_part_of_their_own_beside_the_chapters_that_time_nothing(
        lanes, monkeypatch):
    import time

    calls = []

    def fake_run_logged(command, env, log, echo, stopper=None):
        calls.append((command, time.monotonic(), echo))
        time.sleep(0.5)
        log.write_text("5 passed in 0.5s\n")
        return 0

    monkeypatch.setattr(report, "run_logged", fake_run_logged)
    assert report.main([*lanes["args"], "--workers", "2", "--tests", "--test-workers", "6"]) == 0
    ((command, started, echo),) = calls
    assert command[command.index("-n") + 1] == "6" and "tests/library" in command
    assert echo is False, "beside chapters, the tests' output goes to their log only"
    spans = lanes["spans"]
    assert all(spans[s][1] <= started for s in ("03_matmul", "05_mnist")), "after those alone"
    assert spans["01_devices"][0] - started < 0.3, "the side-by-side chapters start with them"
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["tests"]["returncode"] == 0 and summary["parts_seconds"]["tests"] >= 0.5
    assert summary["chapters"]["08_device_pitfalls"]["ran"] == (
        "beside other chapters (2 at a time) and the unit tests")
    assert summary["chapters"]["03_matmul"]["ran"] == "alone"
    # the tests alone: one worker means no xdist, and their output shows as they run
    calls.clear()
    assert report.main([*lanes["args"], "--no-chapters", "--tests", "--test-workers", "1"]) == 0
    ((command, _, echo),) = calls
    assert "-n" not in command and echo is True


# Figures and paths, whatever the environment (issue 26 item 12, issue 27 item 4) ------------

def test_a_recorded_page_keeps_its_figures_when_mplbackend_is_agg(monkeypatch, tmp_path):
    """The report's own chapter execution, with MPLBACKEND=Agg set as on the H200 server:
    the figure plt.show() draws is still among the cell's outputs."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = tmp_path / "plots.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A figure"),
        nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\n"
                                  "plt.plot([0, 1], [1, 0])\nplt.show()")]), path)
    ok, error = report.execute(path, timeout=300)
    assert ok, error
    outputs = nbformat.read(path, as_version=4).cells[1].outputs
    assert any("image/png" in out.get("data", {}) for out in outputs), outputs
    assert os.environ["MPLBACKEND"] == "Agg", "the report's own environment is left alone"


def test_the_machines_folders_are_replaced_by_words_where_they_are_folders():
    home = str(Path.home())
    places = report.machine_places((Path("/srv/run/work"), "WORK"))
    text = (f"{report.ROOT}/helpers/x.py:3 | {home}/.cache/y | /srv/run/work/bench.log | "
            f"/srv/run/workshop | {sys.prefix}/bin/python")
    clean = report.without_places(text, places)
    assert clean.startswith("BOOK/helpers/x.py:3 | ~/.cache/y | WORK/bench.log | ")
    assert "/srv/run/workshop" in clean, "a folder's name inside another name stays"
    assert str(report.ROOT) not in clean
    if Path(sys.prefix).resolve() not in report.SHARED_FOLDERS:  # /usr stays (below)
        assert sys.prefix not in clean


def test_a_python_in_a_shared_folder_is_named_by_its_library_folders(monkeypatch):
    """The H200 server's venv is based on /usr (Ubuntu's python3): /usr itself stays, other
    programs live there (/usr/local/cuda), while Python's library folders become words. A
    folder's name at the end of a longer path is no folder of this machine (/tmp/home/ann);
    one right after a colour code is (a traceback's file)."""
    import sysconfig

    venv, site = "/opt/torch/.venv", "/opt/torch/.venv/lib/python3.12/site-packages"
    monkeypatch.setattr(sys, "prefix", venv)
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {
        "stdlib": "/usr/lib/python3.12", "platstdlib": "/usr/lib/python3.12",
        "purelib": site, "platlib": site})
    monkeypatch.setattr(Path, "home", lambda: Path("/home/ann"))
    text = (f"/usr/local/cuda-13.0/lib64 | /usr/lib/python3.12/warnings.py:1 | {venv}/bin/python"
            f" | {site}/torch/x.py | /tmp/home/ann/x | \x1b[32m/home/ann/x\x1b[0m")
    assert report.without_places(text, report.machine_places()) == (
        "/usr/local/cuda-13.0/lib64 | STDLIB/warnings.py:1 | PYTHON/bin/python | SITE/torch/x.py"
        " | /tmp/home/ann/x | \x1b[32m~/x\x1b[0m")


def test_pages_logs_and_result_files_name_no_folder_of_the_machine(lanes, monkeypatch):
    """A chapter that prints this machine's folders (a warning's path, the home folder, a
    package's file) and tests whose log does: what the report writes names none of them, and
    the pages keep their images."""
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    leaks = [str(report.ROOT), str(Path.home()), site, str(lanes["tmp"])]
    text = (f"{site}/torch/cuda/__init__.py:1270: a note\n"
            f"saved to {Path.home()}/.cache/book/model.pt\nfrom {report.ROOT}/helpers/x.py\n")

    def printing_execute(path: Path, timeout: int):
        nb = nbformat.read(path, as_version=4)
        nb.cells[1].outputs = [
            nbformat.v4.new_output("stream", name="stdout", text=text),
            nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=",
                                                         "text/plain": text})]
        nbformat.write(nb, path)
        return True, ""

    def logging_run(command, env, log, echo, stopper=None):
        log.write_text(text + f"{lanes['tmp']}/w/tests.xml\n5 passed in 0.5s\n")
        (lanes["tmp"] / "w" / "tests.xml").write_text(f'<testsuite file="{text}"/>')
        return 0

    monkeypatch.setattr(report, "execute", taking_turns(printing_execute))
    monkeypatch.setattr(report, "run_logged", logging_run)
    assert report.main([*lanes["args"], "--workers", "2", "--tests"]) == 0
    written = [p for folder in ("w", "r") for p in (lanes["tmp"] / folder).rglob("*")
               if p.is_file()]
    assert any(p.suffix == ".ipynb" and "pages" in p.parts for p in written)
    for path in written:
        content = path.read_text(errors="replace")
        for leak in leaks:
            assert leak not in content, f"{path.name} names {leak}"
    page = next(p for p in written if p.suffix == ".ipynb" and "pages" in p.parts)
    outputs = nbformat.read(page, as_version=4).cells[-1].outputs
    assert outputs[0]["text"].startswith("SITE/torch/cuda/__init__.py:1270")
    assert outputs[1]["data"]["image/png"] == "iVBORw0KGgo="


def test_the_benchmark_is_told_folders_inside_the_checkout_relative_to_it(lanes, monkeypatch):
    """Its result file records the command it was given: no folder of this machine there."""
    calls = []
    monkeypatch.setattr(report, "run_logged",
                        lambda command, env, log, echo, stopper=None: calls.append(command) or 0)
    args = [a for a in lanes["args"] if a != "--no-bench"]
    work = report.ROOT / "_build" / "gpu-report-test-paths"
    try:
        args[args.index("--work") + 1] = str(work)
        args[args.index("--results") + 1] = str(work / "results")
        assert report.main([*args, "--no-chapters", "--quick"]) == 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (bench,) = calls
    assert bench[bench.index("--parts") + 1] == "_build/gpu-report-test-paths/bench-parts"
    assert bench[bench.index("--out") + 1] == "_build/gpu-report-test-paths/results"


def test_tests_that_cannot_be_started_leave_a_summary_that_says_so(lanes, monkeypatch):
    def broken_run_logged(command, env, log, echo, stopper=None):
        raise OSError("no pytest here")

    monkeypatch.setattr(report, "run_logged", broken_run_logged)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's traceback
    assert report.main([*lanes["args"], "--workers", "2", "--tests"]) == 1
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["tests"]["returncode"] == -1
    assert all(c["ok"] for c in summary["chapters"].values()), "the chapters still ran"


def test_the_result_files_command_names_no_work_folder_outside_the_checkout(lanes, monkeypatch):
    """A --work outside the checkout is given to the benchmark as it is (--parts), and the
    result file records its command: the report writes WORK there instead."""
    import shlex

    import torch

    work = lanes["tmp"] / "w"
    result: list[Path] = []

    def bench(command, env, log, echo, stopper=None):
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        doc = {"schema_version": 1, "command": shlex.join(["python", "-m", *command[2:]]),
               "figures": [{"value": 1.5}]}
        from bench import __main__ as runner

        result.append(out / f"{runner.machine_record(torch.device('cpu'))['slug']}.json")
        result[0].write_text(json.dumps(doc, indent=1) + "\n")
        log.write_text("done\n")
        return 0

    monkeypatch.setattr(report, "run_logged", bench)
    args = [a for a in lanes["args"] if a != "--no-bench"]
    assert report.main([*args, "--no-chapters", "--quick"]) == 0
    doc = json.loads(result[0].read_text())
    assert str(lanes["tmp"]) not in doc["command"]
    assert "--parts WORK/bench-parts" in doc["command"], doc["command"]
    assert doc["figures"] == [{"value": 1.5}]
    assert "--parts" in doc["command"] and str(work) not in doc["command"]


# A run that must stop: the budget, a signal (issue 27, the second H200 run) ------------------

#: A stand-in for pytest under xdist: a leader that prints as it goes and, on SIGINT, its short
#: summary; a worker in its process group that ignores SIGINT (only the group's SIGTERM ends
#: it). Both write their pid into the folder given as argv[1].
FAKE_PYTEST = r"""
import os, signal, subprocess, sys, time
def summary(signum, frame):
    print("FAILED tests/library/test_x.py::test_y - AssertionError: boom")
    print("1 failed, 1 passed in 1.0s (interrupted)", flush=True)
    sys.exit(2)
signal.signal(signal.SIGINT, summary)  # first: a loaded machine may start it late
folder = sys.argv[1]
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"])
open(os.path.join(folder, "worker.pid"), "w").write(str(worker.pid))
print(".F", flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_log_is_on_disk_as_the_command_runs_and_a_stop_ends_its_process_group(tmp_path):
    """What killed the first tests.log (0 bytes after the outer timeout): written only when
    Python's buffer filled. Each line is on disk as it comes; a stop asks the leader first
    (SIGINT: pytest's summary), then ends its whole group (xdist's workers)."""
    import threading
    import time

    stopper = report.Stopper()
    stopper.GRACE = 1.0
    log = tmp_path / "tests.log"
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(report.run_logged(
        [sys.executable, "-c", FAKE_PYTEST, str(tmp_path)], dict(os.environ), log, echo=False,
        stopper=stopper)))
    thread.start()
    deadline = time.monotonic() + 60
    while ".F" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ".F" in log.read_text() and thread.is_alive(), "the line is there while it runs"
    stopper.stop("a test")
    thread.join(30)
    assert not thread.is_alive() and result == [2]
    assert "FAILED tests/library/test_x.py::test_y" in log.read_text(), "the leader's summary"
    worker = int((tmp_path / "worker.pid").read_text())
    deadline = time.monotonic() + 10
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(worker), "the worker that ignores SIGINT went with its group"


def _fake_tests(monkeypatch, tmp_path):
    monkeypatch.setattr(report, "tests_command", lambda work, workers: [
        sys.executable, "-c", FAKE_PYTEST, str(tmp_path)])
    monkeypatch.setattr(report.Stopper, "GRACE", 1.0)


def test_the_budget_bounds_the_tests_too_and_the_archive_is_still_written(lanes, monkeypatch):
    """The second H200 run: the tests started after the timed chapters and ran on until an
    outer timeout killed the report, leaving no archive. Past --budget the tests are stopped,
    their log keeps pytest's summary, the summary says so, and the archive is written."""
    import time

    _fake_tests(monkeypatch, lanes["tmp"])
    archive = lanes["tmp"] / "out" / "run.tar.xz"
    tic = time.monotonic()
    # one chapter, beside the tests: they start at once, well within the budget
    assert report.main([*lanes["args"], "--chapters", "01_devices", "--tests", "--budget", "3",
                        "--archive", str(archive)]) == 1
    assert time.monotonic() - tic < 30, "stopped near the budget, not after the tests' 120 s"
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["tests"]["cut_short"] == summary["stopped"] == (
        "the --budget of 3 s was spent")
    assert summary["chapters"]["01_devices"]["ok"] and summary["not_run"] == []
    assert "FAILED tests/library/test_x.py::test_y" in (lanes["tmp"] / "w" / "tests.log"
                                                        ).read_text()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {"_build/gpu-report/tests.log", "_build/gpu-report/report.json"} <= set(names)
    assert _gone(int((lanes["tmp"] / "worker.pid").read_text()))


def test_a_signal_stops_the_run_which_still_says_what_it_did_and_packs_it(lanes, monkeypatch):
    """SIGINT (an outer `timeout -s INT`) while a timed chapter runs: no chapter and no tests
    start after it, the summary names what did not run, the archive is written, and the
    report's own handlers are put back."""
    import signal

    _fake_tests(monkeypatch, lanes["tmp"])
    ran = []

    def interrupted_execute(path: Path, timeout: int):
        ran.append(path.stem)
        if path.stem == "03_matmul":
            os.kill(os.getpid(), signal.SIGINT)
            # the chapter ends once the run is stopped (a fixed sleep raced a loaded machine)
            assert report._stopper.event.wait(30)
        return True, ""

    monkeypatch.setattr(report, "execute", taking_turns(interrupted_execute))
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    archive = lanes["tmp"] / "run.tar.xz"
    assert report.main([*lanes["args"], "--workers", "2", "--tests",
                        "--archive", str(archive)]) == 1
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert ran == ["03_matmul"]
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["stopped"] == "SIGINT received"
    assert summary["tests"]["not_run"] == "SIGINT received"
    # in the lanes' order: the rest of the alone lane, then the others
    assert summary["not_run"] == ["05_mnist", "01_devices", "07_data_parallel",
                                  "08_device_pitfalls"]
    with tarfile.open(archive) as tar:
        assert "_build/gpu-report/report.json" in tar.getnames()


def test_the_summary_names_no_folder_of_the_machine_even_in_a_coloured_traceback(lanes,
                                                                                 monkeypatch):
    """The second H200 run's report.json named the checkout in three chapters' errors: a
    traceback's file comes right after a colour code, which JSON writes as \\u001b[32m."""
    home = str(Path.home())
    error = (f"\x1b[36mFile \x1b[39m\x1b[32m{report.ROOT}/helpers/checks.py:87\x1b[39m, in "
             f"expect\n\x1b[32m{home}/.cache/x.py:1\x1b[39m\nClaimNotMet: not here\n")
    monkeypatch.setattr(report, "execute", taking_turns(lambda path, timeout: (False, error)))
    assert report.main([*lanes["args"], "--chapters", "03_matmul"]) == 1
    text = (lanes["tmp"] / "w" / "report.json").read_text()
    assert str(report.ROOT) not in text and home not in text
    summary = json.loads(text)
    assert "\x1b[32mBOOK/helpers/checks.py:87" in summary["chapters"]["03_matmul"]["error"]
    assert "\x1b[32m~/.cache/x.py:1" in summary["chapters"]["03_matmul"]["error"]


def test_the_tests_name_their_failures_and_slowest_and_leave_out_pytest_benchmark(tmp_path):
    command = report.tests_command(tmp_path, 8)
    assert "-rfEs" in command and "--durations=15" in command
    assert command[command.index("-n") + 1] == "8"
    assert command[command.index("no:benchmark") - 1] == "-p"
    # -p no:benchmark where pytest-benchmark is not installed: pytest goes on (a file of one
    # test: collecting this one imports torch, 5 CPU seconds)
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:benchmark", "-p",
                           "no:cacheprovider", "--co", "-q", str(tmp_path / "test_one.py")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_kernel_runs_on_ipc_sockets_and_prints_no_warning(capfd, tmp_path):
    """ipykernel 7 warned on the report's console, for every chapter, that its kernel ran over
    TCP without encryption: the kernels run on Unix sockets in a private folder instead."""
    path = tmp_path / "sub" / "one.ipynb"
    path.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# One"),
        nbformat.v4.new_code_cell("import os\nprint(os.getcwd())")]), path)
    capfd.readouterr()
    ok, error = report.execute(path, timeout=120)
    assert ok, error
    err = capfd.readouterr().err
    assert "without encryption" not in err, err
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[1].outputs[0]["text"].strip() == str(path.parent), "run in its own folder"
    assert not list(path.parent.glob("*ipc*")), "no socket left beside the chapter"


# Kernels started before their turns (the lane of chapters that run alone) ---------------

def test_the_packages_warmed_up_are_those_a_chapter_imports_at_the_top_of_a_cell():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("try:\n    import helpers\nexcept ImportError:\n"
                                  "    %pip install x\n    import helpers"),
        nbformat.v4.new_code_cell("import pandas as pd\n"
                                  "from torch.utils.data import DataLoader\n"
                                  "import math, matplotlib.pyplot as plt\n"
                                  "from helpers.training import progress\n"
                                  "import helpers.timing\nfrom helpers.training import fit"),
        nbformat.v4.new_code_cell("%%gpu_only\nimport lightning"),
        nbformat.v4.new_code_cell("def f():\n    import accelerate\nif f:\n    import pandas"),
        nbformat.v4.new_markdown_cell("import torchvision"),
        nbformat.v4.new_code_cell("this is not python (")])
    # in the chapter's order (torchmetrics imports matplotlib.pyplot: imported first there, a
    # warning of pyplot's would point at torchmetrics and be hidden)
    assert report.warm_imports(nb) == ["helpers", "pandas", "torch", "matplotlib.pyplot",
                                       "helpers.training", "helpers.timing"]


@pytest.mark.parametrize("chapter", sorted((ROOT / "chapters").glob("[0-9]*.ipynb")),
                         ids=lambda p: p.stem)
def test_every_chapters_kernel_warms_up_with_the_helpers_its_setup_cell_imports(chapter):
    modules = report.warm_imports(nbformat.read(chapter, as_version=4))
    assert modules[0] == "helpers"
    assert all(m in report.WARM_IMPORTS or m.startswith("helpers.") for m in modules), modules


def _chapter(path: Path, *code: str) -> Path:
    """A one-page chapter at ``path``: a title, then a code cell for each of ``code``."""
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(f"# {path.stem}"),
        *(nbformat.v4.new_code_cell(source) for source in code)]), path)
    return path


def _waiting_with_a_stopper(monkeypatch, warm_chapter, path: Path):
    """A real chapter warmed and waiting for its turn under a report's Stopper: ``(stopper,
    its kernel's manager, (turn, thread, result))``."""
    stopper = report.Stopper()
    monkeypatch.setattr(report, "_stopper", stopper)
    started = warm_chapter(path, lambda: bool(stopper))
    (km,) = stopper._kernels
    return stopper, km, started


@pytest.fixture
def warm_chapter():
    """``start(path, stopped=None, warmed=True) -> (turn, thread, result)``: a real chapter
    whose kernel starts and warms up in a thread of its own (returned once it has, unless
    ``warmed=False``), then waits for ``turn.go()``. When the test
    ends, every such turn is stopped: a failed test leaves no kernel waiting."""
    import threading

    ended = threading.Event()
    threads: list[threading.Thread] = []

    def start(path: Path, stopped=None, *, warmed: bool = True):
        turn = report.Turn(lambda: ended.is_set() or bool(stopped and stopped()))
        result: list = []

        def run():
            try:
                result.append(REAL_EXECUTE(path, 300, turn))
            except report.NotRun as exc:
                result.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        threads.append(thread)
        thread.start()
        if warmed:
            assert turn.warmed.wait(120), "the kernel never warmed up"
        return turn, thread, result

    yield start
    ended.set()
    for thread in threads:
        thread.join(60)


def test_a_kernel_started_before_its_turn_has_imported_the_chapters_packages_silently(tmp_path, warm_chapter):
    """The chapter runs at its turn, in the kernel started before it: its packages are already
    imported, its first cell is still [1], and its seconds count from its turn."""
    import time

    path = tmp_path / "warm.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Warm"),
        nbformat.v4.new_code_cell("import sys\nprint([m for m in ('pandas', 'torch') "
                                  "if m in sys.modules], 'pandas' in globals())"),
        nbformat.v4.new_code_cell("import pandas\nimport os\nprint(os.getcwd())")]), path)
    turn, thread, result = warm_chapter(path)
    assert turn.warm_up["imports"] == ["pandas"] and turn.warm_up["seconds"] > 0
    assert "started_again_cold" not in turn.warm_up
    time.sleep(0.5)
    assert thread.is_alive() and turn.started is None, "it waits for its turn"
    go = time.perf_counter()
    turn.go()
    thread.join(120)
    ((ok, error),) = result
    assert ok, error
    assert turn.started >= go
    cells = nbformat.read(path, as_version=4).cells
    assert cells[1].outputs[0]["text"] == "['pandas'] False\n", \
        "imported before its turn, alone, binding no name in the chapter's namespace"
    assert [c.execution_count for c in cells[1:]] == [1, 2], "the warm-up used no count"
    assert cells[2].outputs[0]["text"].strip() == str(path.parent), "in the chapter's folder"


@pytest.mark.parametrize("warning", [
    "warnings.warn('noisy on import')",
    # shown by IPython only when it points at the notebook's own code (__main__): imported
    # through importlib, it pointed into importlib and vanished
    "warnings.warn('noisy on import', DeprecationWarning, stacklevel=2)"])
def test_a_warm_up_that_prints_is_undone_and_the_chapter_runs_in_a_fresh_kernel(
        monkeypatch, tmp_path, warm_chapter, warning):
    """An import that warns would have shown the warning under the chapter's own cell: that
    kernel is killed, and the chapter runs in a fresh one, which shows it where it belongs."""
    monkeypatch.setattr(report, "WARM_IMPORTS", (*report.WARM_IMPORTS, "noisy"))
    (tmp_path / "noisy.py").write_text(f"import warnings\n{warning}\n")
    path = _chapter(tmp_path / "cold.ipynb", "import sys\nprint('noisy' in sys.modules)",
                    "import noisy")
    turn, thread, result = warm_chapter(path)
    assert "noisy on import" in turn.warm_up["started_again_cold"]
    turn.go()
    thread.join(120)
    ((ok, error),) = result
    assert ok, error
    assert "noisy on import" in turn.warm_up["started_again_cold"], "the reason, kept"
    cells = nbformat.read(path, as_version=4).cells
    assert cells[1].outputs[0]["text"] == "False\n", "a fresh kernel"
    assert "noisy on import" in cells[2].outputs[0]["text"], "the warning under its cell"


def test_a_warm_up_that_changes_the_environment_is_undone(monkeypatch, tmp_path, warm_chapter):
    """`import lightning` sets PYTORCH_NVML_BASED_CUDA_CHECK: warmed, every cell before the
    chapter's own import would run with it. Only what the setup cell sets anyway (helpers'
    KINETO_LOG_LEVEL) and torch's default compile folder may change."""
    monkeypatch.setattr(report, "WARM_IMPORTS", (*report.WARM_IMPORTS, "setsenv"))
    (tmp_path / "setsenv.py").write_text(
        "import os\nos.environ['BOOK_TEST_SETTING'] = '1'\n"
        "os.environ['KINETO_LOG_LEVEL'] = '5'\n")  # changed, and allowed
    path = _chapter(tmp_path / "env.ipynb",
                    "import os\nprint(os.environ.get('BOOK_TEST_SETTING'))", "import setsenv")
    turn, thread, result = warm_chapter(path)
    undone = turn.warm_up["started_again_cold"]
    assert "changed the environment: BOOK_TEST_SETTING\n" in undone, undone
    turn.go()
    thread.join(120)
    assert result[0][0], result
    assert turn.warm_up["started_again_cold"] == undone, "the reason, kept"
    assert nbformat.read(path, as_version=4).cells[1].outputs[0]["text"] == "None\n"


def test_a_kernel_that_never_got_ready_is_replaced_at_the_turn(monkeypatch, tmp_path, warm_chapter):
    """nbclient ends a kernel that does not answer in time itself (its manager is gone then):
    the chapter still waits for its turn, and runs in a fresh kernel."""
    from nbclient import NotebookClient

    real = NotebookClient.async_start_new_kernel_client
    calls = []

    async def not_ready_once(self):
        calls.append(1)
        if len(calls) == 1:  # what nbclient does when wait_for_ready times out
            self.kc = self.km.client()  # its cleanup then drops the manager too
            await self._async_cleanup_kernel()
            raise RuntimeError("Kernel didn't respond in 60 seconds")
        return await real(self)

    from jupyter_core.utils import run_sync

    monkeypatch.setattr(NotebookClient, "async_start_new_kernel_client", not_ready_once)
    monkeypatch.setattr(NotebookClient, "start_new_kernel_client", run_sync(not_ready_once))
    path = _chapter(tmp_path / "late.ipynb", "print(6 * 7)")
    turn, thread, result = warm_chapter(path)
    assert "didn't respond" in turn.warm_up["started_again_cold"]
    assert thread.is_alive() and not result, "it waits for its turn"
    turn.go()
    thread.join(120)
    ((ok, error),) = result
    assert ok, error
    assert "didn't respond" in turn.warm_up["started_again_cold"], "the reason, kept"
    assert nbformat.read(path, as_version=4).cells[1].outputs[0]["text"] == "42\n"


def test_a_kernel_that_dies_while_it_waits_is_replaced_at_the_turn(monkeypatch, tmp_path,
                                                                    warm_chapter):
    """Idle kernels wait through the benchmark (the out-of-memory killer may take one): the
    chapter runs in a fresh kernel at its turn, and the summary says why."""
    import signal
    import time

    path = _chapter(tmp_path / "killed.ipynb", "print(6 * 7)")
    stopper, km, (turn, thread, result) = _waiting_with_a_stopper(monkeypatch, warm_chapter, path)
    pid = km.provisioner.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    # dead once waitable: its leader shows as a zombie while its other threads still exit
    while km.provisioner.process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    turn.go()
    thread.join(120)
    ((ok, error),) = result
    assert ok, (error, turn.warm_up)
    assert turn.warm_up["started_again_cold"] == "the kernel died while it waited for its turn"
    assert nbformat.read(path, as_version=4).cells[1].outputs[0]["text"] == "42\n"
    assert not stopper._kernels


def test_waiting_for_a_chapter_ends_when_it_raised_even_a_timeout_error():
    """concurrent.futures.TimeoutError is the builtin one (Python 3.11): a chapter's thread
    that raised it must not look like a wait that timed out, over and over."""
    from concurrent.futures import ThreadPoolExecutor

    def times_out():
        raise TimeoutError("a disk")

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(times_out)
        with pytest.raises(TimeoutError, match="a disk"):
            report._result(future)


def test_a_stop_during_the_warm_up_imports_ends_the_chapter_at_once(monkeypatch, tmp_path,
                                                                     warm_chapter):
    """jupyter_client's execute_interactive waits for a killed kernel until its timeout: the
    warm-up reads the kernel's messages in short steps, and sees the stop."""
    import time

    monkeypatch.setattr(report, "WARM_IMPORTS", (*report.WARM_IMPORTS, "slowimport"))
    marker = tmp_path / "importing"
    (tmp_path / "slowimport.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(300)\n")
    path = _chapter(tmp_path / "slow.ipynb", "import slowimport")
    stopper = report.Stopper()
    monkeypatch.setattr(report, "_stopper", stopper)
    turn, thread, result = warm_chapter(path, warmed=False)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, "the warm-up never reached the imports"
            time.sleep(0.1)
        assert not turn.warmed.is_set()
        tic = time.monotonic()
    finally:
        stopper.stop("a test")  # a failed test leaves no kernel behind either
    thread.join(60)
    assert not thread.is_alive() and time.monotonic() - tic < 15
    assert isinstance(result[0], report.NotRun) and turn.warmed.is_set()


def test_a_run_stopped_before_a_chapters_turn_kills_its_waiting_kernel(monkeypatch, tmp_path,
                                                                         warm_chapter):
    path = _chapter(tmp_path / "never.ipynb", "x = 1")
    stopper, km, (turn, thread, result) = _waiting_with_a_stopper(monkeypatch, warm_chapter, path)
    pid = km.provisioner.pid
    stopper.stop("a test")
    thread.join(60)
    assert not thread.is_alive() and isinstance(result[0], report.NotRun)
    assert _gone(pid) and not stopper._kernels
    assert nbformat.read(path, as_version=4).cells[1].outputs == [], "no cell ran"


def test_every_chapters_kernel_starts_before_the_benchmark(lanes, monkeypatch):
    """All at once, before the benchmark starts; each chapter's seconds count from its turn;
    --cold-kernels starts each at its turn instead."""
    import time

    events: list[tuple[str, float]] = []

    def bench(command, env, log, echo, stopper=None):
        events.append(("benchmark", time.monotonic()))
        return 0

    monkeypatch.setattr(report, "run_logged", bench)
    started: dict[str, float] = {}
    stub = report.execute

    def execute(path: Path, timeout: int, turn=None):
        started[path.stem] = time.monotonic()  # the kernel's start
        return stub(path, timeout, turn)

    monkeypatch.setattr(report, "execute", execute)
    args = [a for a in lanes["args"] if a != "--no-bench"]
    assert report.main([*args, "--quick", "--workers", "3"]) == 0
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    (benchmark,) = [at for what, at in events if what == "benchmark"]
    for stem in lanes["stems"]:
        chapter = summary["chapters"][stem]
        assert chapter["kernel_started_early"] == {"seconds": 0.0, "imports": []}
        assert started[stem] < benchmark < lanes["spans"][stem][0]
        start, end = lanes["spans"][stem]
        # from its turn: 05_mnist's kernel waited 0.3 s more, for 03_matmul's turn
        assert 0.3 <= chapter["seconds"] < end - start + 0.2, (stem, chapter["seconds"])
    assert summary["chapters"]["01_devices"]["ran"] == "beside other chapters (3 at a time)"
    assert "kernels started early" in summary["parts_seconds"]
    assert report.main([*args, "--quick", "--workers", "3", "--cold-kernels"]) == 0
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert "kernel_started_early" not in summary["chapters"]["03_matmul"]
    assert "kernels started early" not in summary["parts_seconds"]


def test_a_stop_kills_a_running_chapters_kernel_and_the_chapter_says_so(monkeypatch, tmp_path):
    import threading
    import time

    path = tmp_path / "slow.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Slow"),
        nbformat.v4.new_code_cell("print('started', flush=True)\nimport time\ntime.sleep(300)")]),
        path)
    stopper = report.Stopper()
    monkeypatch.setattr(report, "_stopper", stopper)
    result = []
    thread = threading.Thread(target=lambda: result.append(report.execute(path, 600)))
    tic = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 60
    while not stopper._kernels or not any(
            getattr(getattr(km, "provisioner", None), "pid", None) for km in stopper._kernels):
        assert time.monotonic() < deadline, "the kernel never started"
        time.sleep(0.1)
    time.sleep(2)  # into the cell
    stopper.stop("a test")
    thread.join(120)
    assert not thread.is_alive() and time.monotonic() - tic < 120
    ((ok, error),) = result
    assert not ok and error.startswith("cut short (a test): "), error


def test_a_signal_during_a_real_chapter_stops_its_kernel_and_the_run(lanes, monkeypatch):
    """A chapter's kernel, really run, sends the report SIGINT and sleeps: nbclient must not
    take the signal over (in the main thread it does, and leaves Python's default handlers
    behind), the kernel is killed, no later part starts, and the archive is written."""
    import time

    _fake_tests(monkeypatch, lanes["tmp"])
    monkeypatch.setattr(report, "execute", REAL_EXECUTE)
    chapter = report.CHAPTERS / "03_matmul.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    nb.cells[1].source = "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(300)"
    nbformat.write(nb, chapter)
    archive = lanes["tmp"] / "run.tar.xz"
    tic = time.monotonic()
    assert report.main([*lanes["args"], "--tests", "--archive", str(archive)]) == 1
    assert time.monotonic() - tic < 120
    summary = json.loads((lanes["tmp"] / "w" / "report.json").read_text())
    assert summary["stopped"] == "SIGINT received"
    matmul = summary["chapters"]["03_matmul"]
    assert not matmul["ok"] and matmul["cut_short"] == "SIGINT received", matmul
    assert "05_mnist" in summary["not_run"] and summary["tests"]["not_run"]
    assert archive.exists()


def test_the_reports_signal_handlers_outlive_a_real_chapter(lanes, monkeypatch):
    """nbclient, run in the main thread, takes SIGINT and SIGTERM over for each chapter and
    then puts Python's defaults back: SIGTERM would then end the report with no archive."""
    import signal

    seen = {}

    def handlers(path: Path) -> None:
        seen[path.stem] = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

    def execute(path: Path, timeout: int, turn=None):
        if path.stem == "03_matmul":
            handlers(path)
            return REAL_EXECUTE(path, timeout, turn)
        # at its turn, after the real chapter
        return taking_turns(lambda path, timeout: handlers(path) or (True, ""))(
            path, timeout, turn)

    monkeypatch.setattr(report, "execute", execute)
    before = signal.getsignal(signal.SIGINT)
    assert report.main([*lanes["args"], "--chapters", "03_matmul,05_mnist"]) == 0
    assert seen["03_matmul"][0] is not before, "the report's own handler"
    assert seen["05_mnist"] == seen["03_matmul"], "still the report's after a real chapter"


def test_a_stop_that_comes_while_the_archive_is_packed_leaves_the_archive(lanes, monkeypatch):
    """An outer `timeout -s INT` may fire as the run ends, while the archive is packed: the
    report's own handlers still hold then, so the archive is written, not left half-packed."""
    import signal

    def outer(signum, frame):
        raise RuntimeError("the report's handlers were put back before packing")

    monkeypatch.setattr(report, "execute", taking_turns(lambda path, timeout: (False, "boom")))
    real_pack = report.pack

    def signalled_pack(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(report, "pack", signalled_pack)
    archive = lanes["tmp"] / "run.tar.xz"
    previous = signal.signal(signal.SIGINT, outer)
    try:
        assert report.main([*lanes["args"], "--chapters", "03_matmul",
                            "--archive", str(archive)]) == 1
        assert signal.getsignal(signal.SIGINT) is outer, "put back after packing"
    finally:
        signal.signal(signal.SIGINT, previous)
    with tarfile.open(archive) as tar:
        assert "_build/gpu-report/report.json" in tar.getnames()


def test_a_report_ended_during_the_benchmark_packs_its_log_scrubbed(lanes, monkeypatch):
    """Told twice to stop during the benchmark (KeyboardInterrupt), the report still packs
    the benchmark's log, and that log names no folder of this machine."""
    def ended_bench(command, env, log, echo, stopper=None):
        log.write_text(f"warning from {report.ROOT}/bench/core.py:1\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "run_logged", ended_bench)
    archive = lanes["tmp"] / "run.tar.xz"
    args = [a for a in lanes["args"] if a != "--no-bench"]
    with pytest.raises(KeyboardInterrupt):
        report.main([*args, "--archive", str(archive)])
    with tarfile.open(archive) as tar:
        log = tar.extractfile("_build/gpu-report/bench.log").read().decode()
    assert str(report.ROOT) not in log and "BOOK/bench/core.py:1" in log, log


def test_one_stop_sent_twice_counts_once_and_a_later_one_ends_the_wait(monkeypatch):
    """`timeout -s INT` signals its child, then their process group: the report, run as that
    child, gets SIGINT twice at once, which must stop the run once; a signal 5 s later means
    'stop waiting' (KeyboardInterrupt; the report still packs on its way out)."""
    import signal
    import time

    stopper = report.Stopper()
    previous = report.catch_signals(stopper)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert stopper.event.wait(30) and stopper.why == "SIGINT received"
        later = time.monotonic() + 6
        monkeypatch.setattr(report.time, "monotonic", lambda: later)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs as soon as the signal is in
    finally:
        report.restore_signals(previous)


def test_a_test_report_names_neither_pytests_temp_folder_nor_the_machine(tmp_path):
    """A failing test's message names its ``tmp_path`` (under ``<temp>/pytest-of-<user>``),
    and a JUnit report carries the machine's name: both are replaced in what the report
    writes, the rest of the report kept."""
    temp = report.pytest_temp()
    assert tmp_path.is_relative_to(temp), (tmp_path, temp)  # the folder pytest really uses
    log, xml = tmp_path / "tests.log", tmp_path / "tests.xml"
    log.write_text(f"E   FileNotFoundError: {tmp_path}/data.bin\n")
    xml.write_text('<testsuites><testsuite name="pytest" errors="0" hostname="gpu-17.lab.example"'
                   ' time="1.0"><testcase name="t" time="0.1"/></testsuite></testsuites>')
    places = report.machine_places()
    for path in (log, xml):
        report.scrub_file(path, places)
    relative = tmp_path.relative_to(temp).as_posix()
    assert log.read_text() == f"E   FileNotFoundError: PYTEST_TMP/{relative}/data.bin\n"
    assert xml.read_text() == ('<testsuites><testsuite name="pytest" errors="0" '
                               'hostname="GPU-SERVER" time="1.0"><testcase name="t" '
                               'time="0.1"/></testsuite></testsuites>')
