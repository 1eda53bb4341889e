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
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

__all__ = ["CSV_HEADER", "MODES", "CsvImageDataset", "ImageRowError", "write_mnist_pngs"]

#: The header line every CSV file read by :class:`CsvImageDataset` starts with.
CSV_HEADER = ("path", "label")
#: Image modes the dataset converts to (PIL's names): greyscale, colour, colour with alpha.
MODES = ("L", "RGB", "RGBA", "LA", "F", "I")
# PIL's modes for images of more than 8 bits per channel, which convert("L") would clip.
_HIGH_DEPTH = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535}


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

    for name, value in (("n", n), ("start", start)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a whole number, got {value!r}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not isinstance(csv_name, str) or not csv_name.endswith(".csv") \
            or Path(csv_name).name != csv_name:
        raise ValueError(f"csv_name must be a plain file name ending in .csv, such as "
                         f"'labels.csv', got {csv_name!r}")
    if not isinstance(folder, str | os.PathLike) or not str(folder).strip():
        raise TypeError(f"folder must be a folder's path (a str or pathlib.Path), got {folder!r}")
    folder = Path(folder)
    for path in (folder, folder / "images"):
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"{path} is a file, not a folder: write the images "
                                     "into another folder, or move that file away")
    ds = mnist(train, root)
    if start < 0 or start + n > len(ds.data):
        raise ValueError(f"images {start}..{start + n - 1} do not exist: the split holds {len(ds.data)}")
    try:
        (folder / "images").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create {folder / 'images'}: {exc.strerror or exc}. Pass a "
                      "folder you can write to") from None
    pixels = ds.data[start:start + n].numpy()
    labels = ds.targets[start:start + n].tolist()
    csv_path = folder / csv_name
    # The CSV is written under a temporary name and renamed at the end: a failure half way
    # (a full disk, a read-only folder) leaves no CSV that lists images never written.
    partial = folder / f".{csv_name}.{os.getpid()}.partial"
    try:
        with partial.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(CSV_HEADER)
            for offset, (image, label) in enumerate(zip(pixels, labels, strict=True)):
                rel = Path("images") / f"{start + offset:05d}.png"
                Image.fromarray(image).save(folder / rel)
                writer.writerow([rel.as_posix(), label])
        os.replace(partial, csv_path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OSError(f"cannot write the images and {csv_path}: {exc.strerror or exc}. "
                      "Pass a folder you can write to, with room for the files") from None
    return csv_path


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _read_csv_text(csv_file: Path) -> str:
    """The CSV file's text, with Excel's byte-order mark removed; a file that is not UTF-8 or
    holds a NUL byte is reported with its name and line."""
    data = csv_file.read_bytes()
    nul = data.find(b"\x00")
    if nul != -1:
        raise ImageRowError(
            f"{csv_file}, line {_line_of(data, nul)}: the file contains a NUL byte, so it is not "
            "a text CSV file (a UTF-16 export, or a binary file?). Save it as 'CSV UTF-8'.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImageRowError(
            f"{csv_file}, line {_line_of(data, exc.start)}: the file is not UTF-8 (byte "
            f"{data[exc.start:exc.start + 1]!r} cannot be decoded; a Latin-1 or Windows-1252 "
            "export?). Save it as 'CSV UTF-8'.") from None


def _to_8_bit(image: Any, maximum: int) -> Any:
    """A 16-bit greyscale image scaled to 8 bits (0..65535 onto 0..255), instead of PIL's
    convert("L"), which clips every value above 255 to white."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.rint(pixels * (255 / maximum)).astype(np.uint8), mode="L")


class CsvImageDataset(Dataset):
    """Images listed in a CSV file of ``path,label`` rows, decoded on access (chapter 6).

    ``path`` is relative to ``root`` (by default the CSV file's folder) and must stay inside
    it; ``label`` is a non-negative integer below ``num_classes`` when that is given. Every
    row is checked when the dataset is made, so a malformed row fails at once with
    :class:`ImageRowError` naming its line; a file that is missing, cannot be decoded or has
    the wrong size fails when it is read, with the same kind of message. Images are opened with
    PIL, converted to ``mode`` (one of :data:`MODES`; "L" for greyscale; 16-bit greyscale files
    are scaled down to 8 bits, not clipped) and passed through ``transform`` (by default
    ``ToTensor()``: a float tensor ``[C, H, W]`` in [0, 1]). ``size`` is the ``(width,
    height)`` every image must have; by default the size of the first listed image, and
    ``None`` accepts any size (for a transform that resizes). The CSV file is UTF-8, with or
    without the byte-order mark Excel writes. A symbolic link that leads out of the folder is
    refused unless ``follow_links`` is true.
    """

    def __init__(
        self,
        csv_file: str | Path,
        *,
        root: str | Path | None = None,
        transform: Callable[[Any], Any] | None = None,
        mode: str = "L",
        num_classes: int | None = None,
        size: tuple[int, int] | Literal["first"] | None = "first",
        follow_links: bool = False,
    ) -> None:
        if not isinstance(csv_file, str | os.PathLike):
            raise TypeError(f"csv_file must be the CSV file's path, got {csv_file!r}")
        csv_path = Path(csv_file)
        if csv_path.is_dir():
            raise IsADirectoryError(f"{csv_path} is a folder: pass the CSV file inside it "
                                    "that lists the images (path,label rows)")
        if not csv_path.is_file():
            raise FileNotFoundError(f"the CSV file {csv_path} does not exist: check the path "
                                    f"(relative paths start in {Path.cwd()})")
        if root is not None and not Path(root).is_dir():
            raise NotADirectoryError(f"root {root} is not a folder: pass the folder the "
                                     "CSV's paths are relative to, or leave it out")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (such as transforms.ToTensor()), "
                            f"got {transform!r}")
        if num_classes is not None and (isinstance(num_classes, bool) or
                                        not isinstance(num_classes, int) or num_classes < 1):
            raise ValueError(f"num_classes must be a positive whole number or None, "
                             f"got {num_classes!r}")
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one the dataset converts images to: use one of "
                             f"{', '.join(map(repr, MODES))} ('L' for greyscale, 'RGB' for colour)")
        if size is not None and size != "first" and (
                len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size)):
            raise ValueError(f"size must be (width, height) in pixels, 'first' or None, got {size!r}")
        self.csv_file = Path(csv_file)
        self.root = Path(root) if root is not None else self.csv_file.parent
        self.transform = transform
        self.mode = mode
        self.size = size
        self.follow_links = follow_links
        self.samples: list[tuple[str, int]] = []
        # The paths checked here; an image is opened only while its path still resolves so.
        self._resolved: list[str] = []
        self.lines: list[int] = []
        self._root_resolved = self.root.resolve()
        reader = csv.reader(io.StringIO(_read_csv_text(self.csv_file), newline=""), strict=True)
        try:
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
        except csv.Error as exc:
            raise ImageRowError(f"{self.csv_file}, line {reader.line_num}: {exc}") from None
        if not self.samples:
            raise ImageRowError(f"{self.csv_file} lists no images")

    def _parse(self, row: list[str], line: int, num_classes: int | None) -> tuple[str, int]:
        where = f"{self.csv_file}, line {line}"
        if len(row) != 2:
            raise ImageRowError(f"{where}: expected 2 fields (path,label), got {len(row)}: {row!r}")
        path, label_text = row[0].strip(), row[1].strip()
        if not path:
            raise ImageRowError(f"{where}: the path is empty: {row!r}")
        # Decided before any image is opened, with one message whether or not such a file
        # exists, so the CSV cannot be used to probe the disk outside the dataset's folder.
        root = str(self._root_resolved)
        lexical = os.path.normpath(os.path.join(root, path))
        if Path(path).is_absolute() or os.path.commonpath([lexical, root]) != root:
            raise ImageRowError(
                f"{where}: the path {path!r} leaves the dataset's folder {self.root}; paths must "
                "be relative to it, with no '..' that climbs out of it")
        resolved = os.path.realpath(lexical)
        if not self.follow_links and os.path.commonpath([resolved, root]) != root:
            raise ImageRowError(
                f"{where}: the path {path!r} leads out of the dataset's folder {self.root} "
                f"through a symbolic link (to {resolved}); pass follow_links=True if the "
                "folder's links are meant to be followed")
        self._resolved.append(resolved)
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

    def _open(self, index: int) -> Any:
        from PIL import Image, UnidentifiedImageError

        full = self.root / self.samples[index][0]
        where = f"{self.csv_file}, line {self.lines[index]}"
        resolved = self._resolved[index]
        if not self.follow_links and os.path.realpath(resolved) != resolved:
            raise ImageRowError(f"{where}: {full} became a symbolic link after the dataset was "
                                "made; pass follow_links=True if links are meant to be followed")
        try:
            with Image.open(resolved) as img:
                # Pillow before 10.3 opens a 16-bit greyscale PNG as mode "I", not "I;16".
                depth = _HIGH_DEPTH.get(img.mode) or (
                    65535 if img.mode == "I" and img.format == "PNG" else None)
                if depth and self.mode in ("L", "RGB", "RGBA", "LA"):
                    return _to_8_bit(img, depth).convert(self.mode)
                return img.convert(self.mode)
        except FileNotFoundError:
            raise ImageRowError(f"{where}: the image file {full} does not exist") from None
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ImageRowError(f"{where}: cannot decode {full}: {exc}") from None

    def _expected_size(self) -> tuple[int, int] | None:
        if self.size != "first":
            return self.size
        if not hasattr(self, "_first_size"):
            self._first_size = self._open(0).size
        return self._first_size

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self._open(index)
        expected = self._expected_size()
        if expected is not None and image.size != tuple(expected):
            where = f"{self.csv_file}, line {self.lines[index]}"
            origin = (f"the size of the first image, line {self.lines[0]}" if self.size == "first"
                      else "the size the dataset was given")
            raise ImageRowError(
                f"{where}: {self.root / self.samples[index][0]} is {image.size[0]}x{image.size[1]} "
                f"pixels, but the dataset's images are {expected[0]}x{expected[1]} ({origin}). "
                "Resize the file, or pass size=None with a transform that resizes.")
        if self.transform is not None:
            image = self.transform(image)
        else:
            from torchvision.transforms.functional import to_tensor

            image = to_tensor(image)
        return image, self.samples[index][1]

    def labels(self) -> torch.Tensor:
        """All labels, in order, without decoding any image."""
        return torch.tensor([label for _, label in self.samples])
