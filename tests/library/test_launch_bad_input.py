"""Bad input for helpers.launch (chapter 7's launcher, used again in chapter 10).

Each case is what a user could really pass, written from the signatures and docstrings:
it ends in an error that names the bad value and says what to do, before any process
starts where the input alone is wrong, and leaves no process and no temporary folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import launch as L
from tests.support import alive, assert_clear_error


@pytest.fixture(autouse=True)
def _own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Temporary folders go to a folder of this test, so leftovers can be counted, and no
    child process may outlive a case."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    # Children from before the case are not its own (multiprocessing's resource tracker,
    # started by an earlier mp.spawn test, lives as long as this process).
    before = set(L._children(os.getpid()))
    yield tmp
    assert sorted(p.name for p in tmp.iterdir()) == [], "a temporary folder was left behind"

    def new_children() -> list[int]:
        return [pid for pid in L._children(os.getpid()) if pid not in before]

    deadline = time.monotonic() + 5
    while new_children() and time.monotonic() < deadline:
        time.sleep(0.1)  # a child that has exited may take a moment to be reaped
    left = [pid for pid in new_children() if alive(pid)]
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def script(tmp_path: Path):
    def write(body: str, name: str = "prog.py") -> Path:
        path = tmp_path / name
        path.write_text(body)
        return path
    return write


# (function, args, kwargs, exception, words the message must contain)
REFUSED_BEFORE_STARTING = [
    ("launch", (0, ["x.py"]), {}, ValueError, ["nproc", "at least 1", "0"]),
    ("launch", (-1, ["x.py"]), {}, ValueError, ["nproc", "-1"]),
    ("launch", ("2", ["x.py"]), {}, TypeError, ["nproc", "'2'", "whole number"]),
    ("launch", (1.5, ["x.py"]), {}, TypeError, ["nproc", "1.5"]),
    ("launch", (True, ["x.py"]), {}, TypeError, ["nproc", "True"]),
    ("launch", (1, []), {}, ValueError, ["program is empty", "-m"]),
    ("launch", (1, "train.py"), {}, TypeError, ["list of arguments", "['train.py']"]),
    ("launch", (1, ["-m"]), {}, ValueError, ["-m", "no module name"]),
    ("launch", (1, ["no_such_script.py"]), {}, FileNotFoundError,
     ["no_such_script.py", "not found", "Python file"]),
    ("launch", (1, ["-m", "x"]), {"timeout": 0}, ValueError, ["timeout", "positive", "0"]),
    ("launch", (1, ["-m", "x"]), {"timeout": -5}, ValueError, ["timeout", "-5"]),
    ("launch", (1, ["-m", "x"]), {"timeout": float("nan")}, ValueError, ["timeout", "nan"]),
    ("launch", (1, ["-m", "x"]), {"timeout": "60"}, TypeError, ["timeout", "'60'", "seconds"]),
    ("launch", (1, ["-m", "x"]), {"grace": -1}, ValueError, ["grace", "-1"]),
    ("launch", (1, ["-m", "x"]), {"env": {"OMP_NUM_THREADS": 1}}, TypeError,
     ["env", "OMP_NUM_THREADS", "strings"]),
    ("launch", (1, ["-m", "x"]), {"env": ["A=1"]}, TypeError, ["env", "dict"]),
    ("launch", (1, ["-m", "x"]), {"cwd": "/no/such/folder"}, NotADirectoryError,
     ["cwd", "/no/such/folder", "not a folder"]),
    ("torchrun_command", (0, ["x.py"]), {}, ValueError, ["nproc", "0"]),
    ("torchrun_command", ("2", ["x.py"]), {}, TypeError, ["nproc", "'2'"]),
    ("torchrun_command", (2, []), {}, ValueError, ["program", "non-empty"]),
    ("torchrun_command", (2, "x.py"), {}, ValueError, ["program", "'x.py'", "list"]),
    ("run_for_results", ([],), {}, ValueError, ["program is empty"]),
    ("run_for_results", ("bench.py",), {}, TypeError, ["list of arguments", "bench.py"]),
    ("run_for_results", (["-m", "x"],), {"nproc": 0}, ValueError, ["nproc", "0"]),
    ("run_for_results", (["-m", "x"],), {"nproc": "2"}, TypeError, ["nproc", "'2'", "None"]),
    ("run_for_results", (["-m", "x"],), {"timeout": 0}, ValueError, ["timeout"]),
    ("run_for_results", (["missing.py"],), {}, FileNotFoundError, ["missing.py"]),
    ("run_ddp", (0, "gloo", "out"), {}, ValueError, ["nproc", "0"]),
    ("run_ddp", ("2", "gloo", "out"), {}, TypeError, ["nproc", "'2'"]),
    ("run_ddp", (2, "mpi", "out"), {}, ValueError, ["'mpi'", "gloo", "nccl"]),
    ("run_ddp", (2, "GLOO", "out"), {}, ValueError, ["'GLOO'", "gloo"]),
    ("run_ddp", (2, "", "out"), {}, ValueError, ["''", "gloo"]),
    ("run_ddp", (2, "gloo", "out"), {"timeout": -1}, ValueError, ["timeout", "-1"]),
    ("run_ddp", (2, "gloo", "out", "--epochs", 0), {}, ValueError,
     ["--epochs", "at least 1", "0"]),
    ("run_ddp", (2, "gloo", "out", "--lr", "-0.1"), {}, ValueError, ["--lr", "-0.1"]),
    ("run_ddp", (2, "gloo", "out", "--epoks", 2), {}, ValueError, ["--epoks"]),
    ("run_ddp", (2, "gloo", "out", "--dropout", 1), {}, ValueError, ["--dropout", "below 1"]),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "error", "words"), REFUSED_BEFORE_STARTING,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED_BEFORE_STARTING)])
def test_refused_before_any_process_starts(name, args, kwargs, error, words, tmp_path,
                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = []

    def refuse(*a, **k):
        started.append(a)
        raise AssertionError(f"a process was started: {a}")

    monkeypatch.setattr(L.subprocess, "Popen", refuse)
    # Nothing written for a refused call: no "out" folder, no file at all.
    assert_clear_error(lambda: getattr(L, name)(*args, **kwargs), error, words, folder=tmp_path)
    assert started == [], "nothing may start on input that is wrong by itself"


def test_nccl_needs_a_gpu_per_process(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"2 processes, 1 GPU\(s\).*at most 1.*'gloo'"):
        L.run_ddp(2, "nccl", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_run_ddp_out_is_a_file(tmp_path):
    out = tmp_path / "results"
    out.write_text("not a folder")
    with pytest.raises(ValueError, match=r"--out .*results is a file: give a folder"):
        L.run_ddp(2, "gloo", out)
    assert out.read_text() == "not a folder", "the file is left as it was"


def test_run_ddp_out_inside_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match=r"cannot write into out folder .*file/sub"):
        L.run_ddp(2, "gloo", tmp_path / "file" / "sub")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_run_ddp_read_only_out(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match=r"cannot write into out folder .*ro"):
            L.run_ddp(2, "gloo", out)
    finally:
        out.chmod(0o700)
    assert list(out.iterdir()) == []


def test_torchrun_command_log_dir_is_a_file(tmp_path):
    f = tmp_path / "logs"
    f.write_text("")
    with pytest.raises(NotADirectoryError, match="log_dir .*logs.* is a file"):
        L.torchrun_command(2, ["x.py"], log_dir=f)


def test_torchrun_command_accepts_paths(tmp_path):
    command = L.torchrun_command(2, [tmp_path / "x.py", 3], log_dir=tmp_path)
    assert command[-4:] == ["--log-dir", str(tmp_path), str(tmp_path / "x.py"), "3"]


# Runs of real processes: one plain process each (no torchrun), so they take a second.
def test_a_script_that_fails(script):
    prog = script("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    with pytest.raises(L.LaunchError, match="failed with exit code 3") as caught:
        L.run_for_results([prog])
    assert "about to fail" in str(caught.value), "the output's end is in the message"


def test_a_script_that_hangs_is_stopped(script, tmp_path):
    prog = script("import os, sys, time\n"
                  "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                  "time.sleep(3600)\n")
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(L.LaunchError, match="time limit of 3 s"):
        L.run_for_results([prog, pid_file], timeout=3)
    assert time.monotonic() - start < 60
    assert not alive(int(pid_file.read_text())), "the hanging process was stopped"


def test_a_script_that_writes_no_result(script):
    prog = script("print('done, but no file')\n")
    with pytest.raises(L.LaunchError, match="wrote no result file into its --out folder"):
        L.run_for_results([prog])


def test_a_script_that_writes_bad_json(script):
    prog = script("import sys, pathlib\n"
                  "pathlib.Path(sys.argv[sys.argv.index('--out') + 1], 'r.json')"
                  ".write_text('{not json')\n")
    with pytest.raises(L.LaunchError, match="wrote r.json, which is not JSON"):
        L.run_for_results([prog])


def test_a_script_without_out_option(script):
    prog = script("import argparse\nargparse.ArgumentParser().parse_args()\n")
    with pytest.raises(L.LaunchError, match="exit code 2") as caught:
        L.run_for_results([prog])
    assert "unrecognized arguments: --out" in str(caught.value)


def test_a_correct_script_returns_its_results(script):
    prog = script("import json, sys, pathlib\n"
                  "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
                  "(out / 'b.json').write_text(json.dumps({'n': 2}))\n"
                  "(out / 'a.json').write_text(json.dumps({'n': 1}))\n")
    assert L.run_for_results([prog, "--flag"]) == [{"n": 1}, {"n": 2}]


def test_python_module_program(tmp_path, monkeypatch):
    (tmp_path / "mod_for_test.py").write_text(
        "import json, sys, pathlib\n"
        "pathlib.Path(sys.argv[-1], 'r.json').write_text(json.dumps(sys.argv[1:-2]))\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert L.run_for_results(["-m", "mod_for_test", "a", 1]) == [["a", "1"]]


@pytest.mark.slow
def test_launch_a_rank_that_fails(script):
    # Also test_launch.py's crashed-rank case (it started a torchrun run of its own for the
    # same failure with one process): the error names the cause and the command, and, since
    # nothing was echoed, carries the output with the ranks' own words.
    prog = script("raise SystemExit('rank failed on purpose')\n")
    with pytest.raises(L.LaunchError, match="failed with exit code") as caught:
        L.launch(2, [prog], timeout=300, echo=False)
    assert "a rank crashed" in str(caught.value)
    assert f"--nproc-per-node 2 {prog}" in str(caught.value)
    assert "rank failed on purpose" in str(caught.value)


def test_python_is_this_one():
    assert L.torchrun_command(1, ["x.py"])[0] == sys.executable
