from pathlib import Path

import pytest
import torch

from helpers import data
from helpers.data import (
    MNIST_FILES,
    DataError,
    TensorBatches,
    make_regression,
    mnist,
    mnist_loaders,
    mnist_tensors,
    verify_mnist,
)


def test_real_mnist_is_verified(real_root):
    raw = verify_mnist(real_root)
    assert sorted(p.name for p in raw.iterdir() if p.name in MNIST_FILES) == sorted(MNIST_FILES)


def test_data_dir_environment_override(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_DATA_DIR", str(tmp_path))
    assert data.data_dir() == tmp_path.resolve()


def test_truncated_file_is_named(copy_root):
    path = copy_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte is truncated.*make data"):
        verify_mnist(copy_root)


def test_corrupt_file_is_named(copy_root):
    path = copy_root / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte is corrupt"):
        verify_mnist(copy_root)


def test_damaged_copy_is_not_silently_downloaded_over(copy_root):
    (copy_root / "MNIST" / "raw" / "t10k-images-idx3-ubyte").write_bytes(b"oops")
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte"):
        mnist(train=False, root=copy_root)


def test_missing_data_without_network_says_what_to_run(tmp_path, monkeypatch):
    import torchvision.datasets

    def no_network(*args, **kwargs):
        raise RuntimeError("no network here")

    monkeypatch.setattr(torchvision.datasets, "MNIST", no_network)
    with pytest.raises(DataError, match=r"make data.*download attempt failed"):
        mnist(train=True, root=tmp_path)


def test_mnist_dataset_and_loaders(real_root):
    ds = mnist(train=False)
    assert len(ds) == 10_000
    x, y = ds[0]
    assert x.shape == (1, 28, 28) and 0 <= x.min() and x.max() <= 1 and isinstance(y, int)
    train, val = mnist_loaders(batch_size=64, train_subset=256, val_subset=128)
    assert len(train.dataset) == 256 and len(val.dataset) == 128
    xb, yb = next(iter(train))
    assert xb.shape == (64, 1, 28, 28) and yb.shape == (64,)


def test_mnist_tensors_match_the_dataset(real_root):
    images, labels = mnist_tensors(train=False, subset=100)
    assert images.shape == (100, 1, 28, 28) and images.dtype == torch.float32
    assert labels.shape == (100,) and labels.dtype == torch.int64
    x0, y0 = mnist(train=False)[0]
    assert torch.allclose(images[0], x0) and labels[0].item() == y0


def test_mnist_tensors_on_another_device(real_root):
    images, labels = mnist_tensors(train=False, subset=10, device="meta")
    assert images.device.type == "meta" and labels.device.type == "meta"


def test_tensor_batches_cover_everything_once():
    x, y = torch.arange(10).float().unsqueeze(1), torch.arange(10)
    batches = TensorBatches(x, y, batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
    assert len(batches) == 3
    seen = torch.cat([yb for _, yb in batches])
    assert sorted(seen.tolist()) == list(range(10))
    for xb, yb in batches:
        assert torch.equal(xb.squeeze(1).long(), yb)  # rows stay paired
    assert len(TensorBatches(x, y, batch_size=4, drop_last=True)) == 2
    first = next(iter(TensorBatches(x, y, batch_size=4)))
    assert first[1].tolist() == [0, 1, 2, 3]


def test_tensor_batches_reject_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        TensorBatches(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="different devices"):
        TensorBatches(torch.zeros(3), torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match="batch_size"):
        TensorBatches(torch.zeros(3), batch_size=0)


def test_make_regression_shapes_and_truth():
    x, y = make_regression(n=200_000, seed=1)
    assert x.shape == (200_000, 2) and y.shape == (200_000, 1)
    # Least squares on the generated data recovers the true parameters.
    design = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    coef = torch.linalg.lstsq(design, y).solution.squeeze()
    assert torch.allclose(coef, torch.tensor([2.0, -3.0, 10.0]), atol=0.02)
    residual = y - design @ coef.unsqueeze(1)
    assert residual.var().item() == pytest.approx(4.0, rel=0.02)


def test_make_regression_is_seeded_and_checks_n():
    assert torch.equal(make_regression(10, seed=3)[1], make_regression(10, seed=3)[1])
    with pytest.raises(ValueError):
        make_regression(0)


def test_a_relative_book_data_dir_is_resolved_against_the_book(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_DATA_DIR", "some/data")
    monkeypatch.chdir(tmp_path)  # where a notebook would run
    book = Path(data.__file__).resolve().parents[1]
    assert data.data_dir() == book / "some" / "data"
