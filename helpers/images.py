"""A folder of image files described by a CSV file, and a Dataset that reads it.

Introduced in chapter 6 (Your own image dataset on the GPU). The chapter writes the Dataset
by hand first; this module holds the finished version, for two reasons: DataLoader worker
processes started with ``spawn`` (the default on macOS and Windows) must be able to *import*
the Dataset class, which a class defined inside a notebook is not; and it checks every row of
the CSV file, so a bad row fails with a message that names it.

:func:`write_mnist_pngs` makes such a folder from MNIST images, so the chapter has real
image files to decode without downloading anything else.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = ["CSV_HEADER", "CsvImageDataset", "ImageRowError", "write_mnist_pngs"]

#: The header line every CSV file read by :class:`CsvImageDataset` starts with.
CSV_HEADER = ("path", "label")


class ImageRowError(ValueError):
    """A row of an image CSV file is malformed or names an unreadable file (chapter 6).

    The message names the CSV file and the line number, as a text editor counts them.
    """


def write_mnist_pngs(
    folder: str | Path,
    n: int = 3000,
    *,
    train: bool = False,
    start: int = 0,
    csv_name: str = "labels.csv",
    root: str | Path | None = None,
) -> Path:
    """Write ``n`` MNIST images (from index ``start``) as PNG files plus a CSV of
    ``path,label`` rows (chapter 6); return the CSV file's path.

    Images go to ``folder/images/<index>.png`` as 8-bit greyscale; paths in the CSV are
    relative to ``folder``. Reads the test split unless ``train`` is true.
    """
    from PIL import Image

    from .data import mnist

    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    ds = mnist(train, root)
    if start < 0 or start + n > len(ds.data):
        raise ValueError(f"images {start}..{start + n - 1} do not exist: the split holds {len(ds.data)}")
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    pixels = ds.data[start:start + n].numpy()
    labels = ds.targets[start:start + n].tolist()
    csv_path = folder / csv_name
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_HEADER)
        for offset, (image, label) in enumerate(zip(pixels, labels, strict=True)):
            rel = Path("images") / f"{start + offset:05d}.png"
            Image.fromarray(image).save(folder / rel)
            writer.writerow([rel.as_posix(), label])
    return csv_path


class CsvImageDataset(Dataset):
    """Images listed in a CSV file of ``path,label`` rows, decoded on access (chapter 6).

    ``path`` is relative to ``root`` (by default the CSV file's folder); ``label`` is a
    non-negative integer below ``num_classes`` when that is given. Every row is checked when
    the dataset is made, so a malformed row fails at once with :class:`ImageRowError` naming
    its line; a file that is missing or cannot be decoded fails when it is read, with the
    same kind of message. Images are opened with PIL, converted to ``mode`` ("L" for
    greyscale) and passed through ``transform`` (by default ``ToTensor()``: a float tensor
    ``[C, H, W]`` in [0, 1]).
    """

    def __init__(
        self,
        csv_file: str | Path,
        *,
        root: str | Path | None = None,
        transform: Callable[[Any], Any] | None = None,
        mode: str = "L",
        num_classes: int | None = None,
    ) -> None:
        self.csv_file = Path(csv_file)
        self.root = Path(root) if root is not None else self.csv_file.parent
        self.transform = transform
        self.mode = mode
        self.samples: list[tuple[str, int]] = []
        self.lines: list[int] = []
        with self.csv_file.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
                raise ImageRowError(
                    f"{self.csv_file}, line 1: expected the header 'path,label', got {header!r}"
                )
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue  # blank lines are allowed, e.g. at the end of the file
                self.samples.append(self._parse(row, line, num_classes))
                self.lines.append(line)
        if not self.samples:
            raise ImageRowError(f"{self.csv_file} lists no images")

    def _parse(self, row: list[str], line: int, num_classes: int | None) -> tuple[str, int]:
        where = f"{self.csv_file}, line {line}"
        if len(row) != 2:
            raise ImageRowError(f"{where}: expected 2 fields (path,label), got {len(row)}: {row!r}")
        path, label_text = row[0].strip(), row[1].strip()
        if not path:
            raise ImageRowError(f"{where}: the path is empty: {row!r}")
        try:
            label = int(label_text)
        except ValueError:
            raise ImageRowError(f"{where}: the label {label_text!r} is not an integer") from None
        if label < 0:
            raise ImageRowError(f"{where}: the label {label} is negative")
        if num_classes is not None and label >= num_classes:
            raise ImageRowError(f"{where}: the label {label} is not below num_classes={num_classes}")
        return path, label

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image, UnidentifiedImageError

        path, label = self.samples[index]
        full = self.root / path
        where = f"{self.csv_file}, line {self.lines[index]}"
        try:
            with Image.open(full) as img:
                image = img.convert(self.mode)
        except FileNotFoundError:
            raise ImageRowError(f"{where}: the image file {full} does not exist") from None
        except (UnidentifiedImageError, OSError) as exc:
            raise ImageRowError(f"{where}: cannot decode {full}: {exc}") from None
        if self.transform is not None:
            image = self.transform(image)
        else:
            from torchvision.transforms.functional import to_tensor

            image = to_tensor(image)
        return image, label

    def labels(self) -> torch.Tensor:
        """All labels, in order, without decoding any image."""
        return torch.tensor([label for _, label in self.samples])
