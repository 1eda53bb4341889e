"""Tests for helpers.images: the PNG + CSV writer and the CSV image Dataset (chapter 6)."""

from __future__ import annotations

import csv
import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.data import mnist
from helpers.images import CsvImageDataset, ImageRowError, write_mnist_pngs


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pngs")
    write_mnist_pngs(root, n=20, start=5)
    return root


def test_writer_makes_one_png_and_row_per_image(folder):
    rows = list(csv.reader((folder / "labels.csv").open()))
    assert rows[0] == ["path", "label"]
    assert len(rows) == 21
    assert len(list((folder / "images").glob("*.png"))) == 20
    assert rows[1][0] == "images/00005.png"


def test_png_round_trip_is_lossless(folder):
    ds = CsvImageDataset(folder / "labels.csv")
    test = mnist(train=False)
    for i in (0, 7, 19):
        image, label = ds[i]
        assert image.shape == (1, 28, 28) and image.dtype == torch.float32
        expected = test.data[5 + i].float() / 255
        assert torch.equal(image[0], expected)
        assert label == int(test.targets[5 + i])
    assert torch.equal(ds.labels(), test.targets[5:25])


def test_transform_is_applied(folder):
    ds = CsvImageDataset(folder / "labels.csv", transform=lambda img: img.size)
    assert ds[0][0] == (28, 28)


def test_writer_rejects_bad_ranges(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        write_mnist_pngs(tmp_path, n=0)
    with pytest.raises(ValueError, match="do not exist"):
        write_mnist_pngs(tmp_path, n=10, start=9995)


def _write(tmp_path, text):
    path = tmp_path / "labels.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("body", "line", "what"),
    [
        ("a.png,3\nb.png\n", 3, "expected 2 fields"),
        ("a.png,3\nb.png,seven\n", 3, "not an integer"),
        ("a.png,3\n,4\n", 3, "path is empty"),
        ("a.png,3\nb.png,-1\n", 3, "negative"),
        ("a.png,3,x\n", 2, "expected 2 fields"),
    ],
)
def test_malformed_row_names_its_line(tmp_path, body, line, what):
    path = _write(tmp_path, "path,label\n" + body)
    with pytest.raises(ImageRowError, match=rf"line {line}: .*{what}"):
        CsvImageDataset(path)


def test_label_bound_and_header_and_empty(tmp_path):
    with pytest.raises(ImageRowError, match="line 2: the label 10 is not below num_classes=10"):
        CsvImageDataset(_write(tmp_path, "path,label\na.png,10\n"), num_classes=10)
    with pytest.raises(ImageRowError, match="line 1: expected the header"):
        CsvImageDataset(_write(tmp_path, "file,y\na.png,1\n"))
    with pytest.raises(ImageRowError, match="lists no images"):
        CsvImageDataset(_write(tmp_path, "path,label\n\n"))


def test_blank_lines_are_skipped_and_line_numbers_stay_right(folder, tmp_path):
    text = "path,label\n\nimages/00005.png,1\nimages/missing.png,2\n"
    ds = CsvImageDataset(_write(tmp_path, text), root=folder)
    assert len(ds) == 2
    assert ds[0][0].shape == (1, 28, 28)
    with pytest.raises(ImageRowError, match=r"line 4: the image file .*missing\.png does not exist"):
        ds[1]


def test_undecodable_file_names_its_line(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    ds = CsvImageDataset(_write(tmp_path, "path,label\nbad.png,1\n"))
    with pytest.raises(ImageRowError, match="line 2: cannot decode"):
        ds[0]


def test_dataset_pickles_and_works_with_spawned_workers(folder):
    ds = CsvImageDataset(folder / "labels.csv")
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[3][0], ds[3][0])
    loader = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    images, labels = next(iter(loader))
    assert images.shape == (8, 1, 28, 28)
    assert torch.equal(labels, ds.labels()[:8])
