"""Bad input for helpers.images (chapter 6): each case ends in an error that names the bad
value and what to do, or a correct result; nothing half-written is left behind."""

from __future__ import annotations

import pytest

from helpers.images import CsvImageDataset, ImageRowError, write_mnist_pngs
from tests.support import assert_clear_error


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pngs")
    write_mnist_pngs(root, n=3)
    return root


@pytest.mark.parametrize("make,error,words", [
    (lambda root: root / "no-such.csv", FileNotFoundError, ["no-such.csv", "does not exist"]),
    (lambda root: root, IsADirectoryError, ["is a folder", "CSV file inside it"]),
    (lambda root: 3, TypeError, ["csv_file", "3"]),
])
def test_the_csv_path_is_checked(folder, make, error, words):
    assert_clear_error(lambda: CsvImageDataset(make(folder)), error, words)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"root": "/no/such/folder"}, NotADirectoryError, ["/no/such/folder"]),
    ({"transform": "ToTensor"}, TypeError, ["callable"]),
    ({"mode": "CMYK"}, ValueError, ["'CMYK'", "'RGB'"]),
    ({"num_classes": 0}, ValueError, ["num_classes", "0"]),
    ({"num_classes": "10"}, ValueError, ["'10'"]),
    ({"size": (28,)}, ValueError, ["(width, height)"]),
    ({"size": (28, -1)}, ValueError, ["(width, height)"]),
])
def test_the_options_are_checked(folder, kwargs, error, words):
    assert_clear_error(lambda: CsvImageDataset(folder / "labels.csv", **kwargs), error, words)


@pytest.mark.parametrize("body,words", [
    ("", ["line 1", "header"]),
    ("path,label\n", ["lists no images"]),
    ("path,label\nimages/00000.png\n", ["line 2", "2 fields"]),
    ("path,label\nimages/00000.png,7,extra\n", ["line 2", "2 fields"]),
    ("path,label\n,7\n", ["line 2", "path is empty"]),
    ("path,label\nimages/00000.png,-1\n", ["line 2", "negative"]),
    ("path,label\nimages/00000.png,3.5\n", ["line 2", "'3.5'"]),
    ("path,label\nimages/00000.png,\"7\n", ["line 2"]),
    ("label,path\n7,images/00000.png\n", ["line 1", "path,label"]),
])
def test_a_csv_with_bad_rows_names_file_and_line(folder, body, words):
    bad = folder / "bad.csv"
    bad.write_text(body)
    assert_clear_error(lambda: CsvImageDataset(bad), ImageRowError, ["bad.csv", *words])


def test_a_folder_where_an_image_should_be_names_the_line(folder):
    (folder / "images" / "dir.png").mkdir(exist_ok=True)
    odd = folder / "odd.csv"
    odd.write_text("path,label\nimages/00000.png,7\nimages/dir.png,1\n")
    ds = CsvImageDataset(odd)
    assert ds[0][0].shape == (1, 28, 28)
    with pytest.raises(ImageRowError, match="line 3"):
        ds[1]


def test_odd_but_valid_paths_are_read(folder):
    odd = folder / "spaces.csv"
    odd.write_text("path,label\n  images/00000.png , 7 \n./images/00001.png,2\n")
    ds = CsvImageDataset(odd)
    assert [label for _, label in ds.samples] == [7, 2]
    assert ds[1][0].shape == (1, 28, 28)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"n": 0}, ValueError, ["n must be positive"]),
    ({"n": 2.5}, TypeError, ["2.5"]),
    ({"start": -1}, ValueError, ["-1"]),
    ({"n": 5, "start": 9_999}, ValueError, ["do not exist"]),
    ({"csv_name": "sub/labels.csv"}, ValueError, ["'sub/labels.csv'"]),
    ({"csv_name": "labels.txt"}, ValueError, [".csv"]),
])
def test_write_mnist_pngs_arguments(tmp_path, kwargs, error, words):
    assert_clear_error(lambda: write_mnist_pngs(tmp_path / "out", **kwargs), error, words,
                       folder=tmp_path)


def test_write_mnist_pngs_into_a_file_is_named(tmp_path):
    file = tmp_path / "taken"
    file.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        write_mnist_pngs(file, n=2)


def test_a_failure_half_way_leaves_no_csv(tmp_path, monkeypatch):
    from PIL import Image

    calls = []

    def failing_save(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return original(self, path, *args, **kwargs)

    original = Image.Image.save
    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(OSError, match="No space left on device"):
        write_mnist_pngs(tmp_path, n=3)
    assert list(tmp_path.glob("*.csv")) == [] and list(tmp_path.glob(".*partial")) == []
