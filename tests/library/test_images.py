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


# ---- failing loudly: paths outside the folder, 16-bit files, sizes, modes, encodings --------

def _csv(folder, text: str, name: str = "rows.csv", encoding: str = "utf-8"):
    path = folder / name
    path.write_text(text, encoding=encoding)
    return path


@pytest.mark.parametrize("bad", ["../outside.png", "images/../../outside.png", "/etc/passwd"])
def test_paths_that_leave_the_folder_are_refused_with_the_row(folder, tmp_path, bad):
    (folder.parent / "outside.png").write_bytes((folder / "images" / "00005.png").read_bytes())
    csv_path = _csv(folder, f"path,label\nimages/00005.png,1\n{bad},3\n", name="escape.csv")
    with pytest.raises(ImageRowError, match=r"escape\.csv, line 3: the path .* leaves") as info:
        CsvImageDataset(csv_path)
    assert "exist" not in str(info.value), "the message must not say whether the file exists"
    # The same words whether or not a file is there.
    missing = _csv(folder, f"path,label\n{bad.replace('outside', 'nowhere')},3\n", name="m.csv")
    with pytest.raises(ImageRowError, match=r"line 2: the path .* leaves"):
        CsvImageDataset(missing)


def test_a_symlink_out_of_the_folder_is_named_and_can_be_allowed(tmp_path, folder):
    # A common layout: images/ is a link to a bigger disk.
    disk = tmp_path / "big-disk"
    disk.mkdir()
    (disk / "a.png").write_bytes((folder / "images" / "00005.png").read_bytes())
    book = tmp_path / "ds"
    book.mkdir()
    (book / "images").symlink_to(disk)
    csv_path = _csv(book, "path,label\nimages/a.png,1\n", name="link.csv")
    with pytest.raises(ImageRowError, match=r"link\.csv, line 2: the path 'images/a\.png' leads "
                                            r"out of .* through a symbolic link .*follow_links"):
        CsvImageDataset(csv_path)
    assert CsvImageDataset(csv_path, follow_links=True)[0][1] == 1


def test_a_link_made_after_the_dataset_is_not_followed(tmp_path, folder):
    ds_dir = tmp_path / "ds"
    (ds_dir / "images").mkdir(parents=True)
    target = ds_dir / "images" / "a.png"
    target.write_bytes((folder / "images" / "00005.png").read_bytes())
    ds = CsvImageDataset(_csv(ds_dir, "path,label\nimages/a.png,1\n"))
    elsewhere = tmp_path / "elsewhere.png"
    target.rename(elsewhere)
    target.symlink_to(elsewhere)
    with pytest.raises(ImageRowError, match=r"line 2: .*a\.png became a symbolic link"):
        ds[0]


def test_a_16_bit_png_opened_as_mode_i_is_scaled_too(tmp_path, monkeypatch):
    # Pillow before 10.3 opens 16-bit greyscale PNGs as mode "I".
    import numpy as np
    from PIL import Image

    ramp = (np.arange(28 * 28, dtype=np.uint32).reshape(28, 28) * 83).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    real_open = Image.open

    def open_as_old_pillow(path, *args, **kwargs):
        img = real_open(path, *args, **kwargs)
        old = img.convert("I")
        old.format = img.format
        return old

    monkeypatch.setattr(Image, "open", open_as_old_pillow)
    image, _ = CsvImageDataset(_csv(tmp_path, "path,label\ndeep.png,0\n"))[0]
    assert (image == 1.0).float().mean() < 0.01
    assert abs(image.max().item() - ramp.max() / 65535) < 1 / 255


def test_a_16_bit_png_is_scaled_not_saturated(tmp_path):
    import numpy as np
    from PIL import Image

    ramp = (np.arange(28 * 28, dtype=np.uint32).reshape(28, 28) * 83).astype(np.uint16)
    (tmp_path / "deep.png").write_bytes(b"")
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    ds = CsvImageDataset(_csv(tmp_path, "path,label\ndeep.png,0\n"))
    image, _ = ds[0]
    expected = torch.from_numpy(np.rint(ramp / 257.0)).float() / 255
    assert (image[0] - expected).abs().max() <= 1 / 255 + 1e-6
    assert (image == 1.0).float().mean() < 0.01  # convert("L") made 99% of them white


def test_an_image_of_the_wrong_size_names_its_row(folder):
    from PIL import Image

    Image.new("L", (32, 30)).save(folder / "images" / "big.png")
    csv_path = _csv(folder, "path,label\nimages/00005.png,1\nimages/big.png,2\n", name="size.csv")
    ds = CsvImageDataset(csv_path)
    with pytest.raises(ImageRowError, match=r"size\.csv, line 3: .*big\.png is 32x30 pixels, "
                                            r"but the dataset's images are 28x28"):
        ds[1]
    with pytest.raises(ImageRowError, match="line 3"):  # through a DataLoader too
        list(DataLoader(ds, batch_size=2))
    assert CsvImageDataset(csv_path, size=None)[1][0].shape == (1, 30, 32)
    with pytest.raises(ImageRowError, match="line 2: .* is 28x28 pixels, but the dataset's "
                                            r"images are 32x30 \(the size the dataset was given"):
        CsvImageDataset(csv_path, size=(32, 30))[0]


def test_an_unknown_mode_is_explained(folder):
    with pytest.raises(ValueError, match=r"mode 'grey' is not one .*'L' for greyscale"):
        CsvImageDataset(folder / "labels.csv", mode="grey")


def test_excels_byte_order_mark_is_accepted(folder):
    csv_path = _csv(folder, "path,label\nimages/00005.png,7\n", name="bom.csv", encoding="utf-8-sig")
    assert csv_path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert CsvImageDataset(csv_path).samples == [("images/00005.png", 7)]


def test_a_latin_1_csv_names_file_and_line(folder):
    csv_path = _csv(folder, "path,label\nimages/00005.png,1\nimages/caf\u00e9.png,2\n",
                    name="latin.csv", encoding="latin-1")
    with pytest.raises(ImageRowError, match=r"latin\.csv, line 3: the file is not UTF-8"):
        CsvImageDataset(csv_path)


def test_a_nul_byte_names_file_and_line(folder):
    path = folder / "nul.csv"
    path.write_bytes(b"path,label\nimages/00005.png,1\nimages/\x00.png,2\n")
    with pytest.raises(ImageRowError, match=r"nul\.csv, line 3: the file contains a NUL byte"):
        CsvImageDataset(path)
