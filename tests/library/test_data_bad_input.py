"""Bad input for the reading side of helpers.data (chapter 5): each case ends in an error
that names the bad value and what to do, or a correct result."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from helpers import data
from helpers.data import DataError, TensorBatches
from tests.support import assert_clear_error


@pytest.mark.parametrize("value,error,words", [
    ("   ", DataError, ["blank", "BOOK_DATA_DIR"]),
    ("~no-such-user-here/mnist", DataError, ["~no-such-user-here", "full path"]),
])
def test_bad_book_data_dir_is_named(monkeypatch, value, error, words):
    monkeypatch.setenv(data.DATA_ENV_VAR, value)
    assert_clear_error(data.data_dir, error, words)


def test_a_book_data_dir_that_is_a_file_is_named(monkeypatch, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("x")
    monkeypatch.setenv(data.DATA_ENV_VAR, str(file))
    with pytest.raises(DataError, match="is a file, not a folder"):
        data.verify_mnist()


def test_a_missing_book_data_dir_names_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.setenv(data.DATA_ENV_VAR, str(tmp_path / "nowhere"))
    assert_clear_error(data.verify_mnist, DataError, ["nowhere", "make data"])


def test_an_empty_book_data_dir_means_the_default(monkeypatch):
    monkeypatch.setenv(data.DATA_ENV_VAR, "")
    monkeypatch.delenv(data.DATA_ENV_VAR)
    default = data.data_dir()
    monkeypatch.setenv(data.DATA_ENV_VAR, "")
    assert data.data_dir() == default


@pytest.mark.parametrize("root,error,words", [
    (3, TypeError, ["root", "3"]),
    ("", ValueError, ["empty"]),
])
def test_verify_mnist_names_a_bad_root(root, error, words):
    assert_clear_error(lambda: data.verify_mnist(root), error, words)


def test_a_read_only_empty_folder_is_named_and_left_empty(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setattr("torchvision.datasets.MNIST.download", lambda self: None)
    try:
        with pytest.raises(DataError, match="writable|cannot write"):
            data.mnist(root=ro)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"train": "no"}, TypeError, ["train", "'no'"]),
    ({"transform": "ToTensor"}, TypeError, ["callable"]),
    ({"root": 7}, TypeError, ["root"]),
])
def test_mnist_arguments(kwargs, error, words):
    assert_clear_error(lambda: data.mnist(**kwargs), error, words)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"device": "gpu"}, ValueError, ["did you mean"]),
    ({"device": "cuda:9"}, ValueError, ["cuda:9"]),
    ({"subset": 0}, ValueError, ["subset", "0"]),
    ({"subset": -5}, ValueError, ["-5"]),
    ({"subset": 2.5}, TypeError, ["2.5"]),
    ({"dtype": torch.int64}, TypeError, ["floating-point", "int64"]),
    ({"dtype": "float16"}, TypeError, ["'float16'"]),
])
def test_mnist_tensors_arguments(kwargs, error, words):
    if "cuda" in str(kwargs.get("device", "")) and torch.cuda.device_count() > 9:
        pytest.skip("this machine has ten GPUs")
    assert_clear_error(lambda: data.mnist_tensors(**kwargs), error, words)


def test_mnist_tensors_subset_beyond_the_split_is_the_whole_split():
    images, labels = data.mnist_tensors(train=False, subset=10**9)
    assert images.shape == (10_000, 1, 28, 28) and labels.shape == (10_000,)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"batch_size": 0}, ValueError, ["batch_size"]),
    ({"batch_size": "128"}, TypeError, ["'128'"]),
    ({"num_workers": -1}, ValueError, ["num_workers"]),
    ({"train_subset": 0}, ValueError, ["train_subset"]),
    ({"val_subset": -1}, ValueError, ["val_subset"]),
    ({"val_size": "5"}, TypeError, ["val_size"]),
    ({"val_size": 60_000}, ValueError, ["val_size", "59999"]),
])
def test_mnist_loaders_arguments(kwargs, error, words):
    assert_clear_error(lambda: data.mnist_loaders(**kwargs), error, words)


@pytest.mark.parametrize("args,kwargs,error,words", [
    ((), {}, ValueError, ["at least one tensor"]),
    (([1, 2, 3],), {}, TypeError, ["list", "torch.as_tensor"]),
    ((torch.tensor(3.0),), {}, ValueError, ["0-d"]),
    ((torch.zeros(0, 2),), {}, ValueError, ["no examples"]),
    ((torch.zeros(4), torch.zeros(5)), {}, ValueError, ["[4, 5]"]),
    ((torch.zeros(4), torch.zeros(4, device="meta")), {}, ValueError, ["meta"]),
    ((torch.zeros(4),), {"batch_size": 0}, ValueError, ["batch_size"]),
    ((torch.zeros(4),), {"batch_size": 1.5}, ValueError, ["1.5"]),
    ((torch.zeros(4),), {"generator": 5}, TypeError, ["torch.Generator"]),
])
def test_tensor_batches_arguments(args, kwargs, error, words):
    assert_clear_error(lambda: TensorBatches(*args, **kwargs), error, words)


def test_tensor_batches_odd_sizes_give_every_example_once():
    x = torch.arange(7)
    batches = TensorBatches(x, batch_size=3, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
    seen = torch.cat([b for (b,) in batches])
    assert len(batches) == 3 and sorted(seen.tolist()) == list(range(7))
    assert len(TensorBatches(x, batch_size=3, drop_last=True)) == 2
