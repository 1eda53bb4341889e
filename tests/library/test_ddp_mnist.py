"""The DDP training script of chapter 7, run for real: two gloo processes on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from helpers import ddp_mnist, launch
from helpers.checkpoints import load_checkpoint
from helpers.models import MnistCNN
from tests.support import check_buffer_and_sync_bn_facts

# VAL is odd on purpose: two ranks cannot split it evenly, and every image must still be
# counted exactly once.
TRAIN, VAL, EPOCHS, BATCH = 512, 201, 2, 16


def _torchrun(out: Path, nproc: int, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    program = ["-m", "helpers.ddp_mnist", "--backend", "gloo", "--out", str(out),
               "--train-subset", str(TRAIN), "--val-subset", str(VAL), "--epochs", str(EPOCHS),
               "--batch-size", str(BATCH), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("BOOK_DEVICE", None)
    with tempfile.TemporaryDirectory() as logs:
        return subprocess.run(launch.torchrun_command(nproc, program, log_dir=logs), env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    # Run from an unrelated folder: `-m helpers.ddp_mnist` must not depend on the cwd.
    result = _torchrun(out, 2, "--dropout", "0.1", "--ddp-facts",
                       cwd=tmp_path_factory.mktemp("elsewhere"))
    assert result.returncode == 0, result.stderr
    assert "warn" not in (result.stdout + result.stderr).lower(), result.stderr
    return out


def _ranks(out: Path, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.slow
def test_only_rank_zero_writes_the_checkpoint_and_summary(two_ranks: Path):
    files = sorted(p.name for p in two_ranks.iterdir())
    assert files == ["mnist_ddp.pt", "rank0.json", "rank1.json", "summary.json"]
    assert [r["wrote_checkpoint"] for r in _ranks(two_ranks)] == [True, False]
    summary = json.loads((two_ranks / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert summary["global_batch"] == 2 * BATCH
    assert summary["train_examples"] == TRAIN and summary["val_examples"] == VAL
    assert [row["epoch"] for row in summary["history"]] == list(range(1, EPOCHS + 1))
    assert all(row["steps"] == TRAIN // (2 * BATCH) for row in summary["history"])
    assert all(row["val_counted"] == VAL for row in summary["history"]), "no padded duplicates"


@pytest.mark.slow
def test_both_ranks_end_with_identical_weights(two_ranks: Path):
    r0, r1 = _ranks(two_ranks)
    assert r0["weights"] == r1["weights"]
    # ... and they are the checkpoint's weights, saved without DDP's module. prefix.
    saved = torch.load(two_ranks / "mnist_ddp.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in saved["model"])
    model = MnistCNN()
    load_checkpoint(model, two_ranks / "mnist_ddp.pt")
    assert ddp_mnist.weights_fingerprint(model) == r0["weights"]


@pytest.mark.slow
def test_gradients_are_averaged_across_ranks(two_ranks: Path):
    for r in _ranks(two_ranks):
        check = r["grad_check"]
        assert check["max_diff_ddp_vs_hand_average"] < 1e-6
        assert check["max_diff_ddp_vs_local"] > 1e-5  # the ranks' local gradients differ


@pytest.mark.slow
def test_sampler_shards_are_disjoint_complete_and_reshuffled(two_ranks: Path):
    r0, r1 = _ranks(two_ranks)
    for epoch in range(EPOCHS):
        a, b = set(r0["indices"][epoch]), set(r1["indices"][epoch])
        assert not a & b
        assert a | b == set(range(TRAIN))
    assert r0["indices"][0] != r0["indices"][1], "set_epoch must change the order"


@pytest.mark.slow
def test_the_training_makes_progress(two_ranks: Path):
    history = json.loads((two_ranks / "summary.json").read_text())["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["val_acc"] > 0.2  # well above chance (0.1) after two short epochs


@pytest.mark.slow
def test_ddp_facts_load_buffers_and_sync_bn(two_ranks: Path):
    # What chapter 7's mp.spawn demonstration describes, recorded by the training run itself
    # (the mp.spawn code is run by tests/book/test_chapter07_shown_code.py).
    r0, r1 = _ranks(two_ranks)
    f0, f1 = r0["ddp_facts"], r1["ddp_facts"]
    # Rank 0 saved, a barrier, every rank loaded the same file onto its own device.
    assert f0["loaded"]["before"] != f1["loaded"]["before"]
    assert f0["loaded"]["after"] == f1["loaded"]["after"] == r0["weights"]
    assert f0["loaded"]["devices"] == f1["loaded"]["devices"] == ["cpu"]
    check_buffer_and_sync_bn_facts(f0, f1)


def test_ddp_facts_needs_gloo(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(SystemExit):
        ddp_mnist.parse_args(["--backend", "nccl", "--ddp-facts"])
    # With the backend left to the script, a machine with a GPU per process picks nccl,
    # and --ddp-facts stops the run before it joins a group.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit, match="--ddp-facts"):
        ddp_mnist.main(["--ddp-facts"])


def test_refuses_to_run_without_torchrun(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        ddp_mnist.main(["--backend", "gloo"])


def test_argument_checks():
    args = ddp_mnist.parse_args(["--epochs", "3", "--batch-size", "8"])
    assert args.epochs == 3 and args.batch_size == 8 and args.backend is None
    with pytest.raises(SystemExit):
        ddp_mnist.parse_args(["--epochs", "0"])
    with pytest.raises(SystemExit):
        ddp_mnist.parse_args(["--backend", "mpi"])


def test_weights_fingerprint_sees_any_change():
    torch.manual_seed(0)
    model = MnistCNN()
    before = ddp_mnist.weights_fingerprint(model)
    assert ddp_mnist.weights_fingerprint(model) == before
    with torch.no_grad():
        model.layers[0].bias[0] += 1e-6
    assert ddp_mnist.weights_fingerprint(model)["sha256"] != before["sha256"]


def test_mnist_split_holds_out_the_last_training_images():
    from helpers.data import MNIST_VAL_SIZE, mnist

    (train_x, train_y), (val_x, val_y) = ddp_mnist.mnist_split(train_subset=100, val_subset=7)
    assert len(train_x) == len(train_y) == 100 and len(val_x) == len(val_y) == 7
    full = mnist(train=True)
    start = len(full) - MNIST_VAL_SIZE
    # Validation is the start of chapter 5's held-out block, never a test image.
    assert torch.equal(val_y, full.targets[start:start + 7])
    assert torch.equal((val_x[:, 0] * 255).round().to(torch.uint8), full.data[start:start + 7])
    assert torch.equal(train_y, full.targets[:100])
    (all_train, _), (all_val, _) = ddp_mnist.mnist_split()
    assert len(all_train) + len(all_val) == len(full) and len(all_val) == MNIST_VAL_SIZE
    with pytest.raises(SystemExit):
        ddp_mnist.parse_args(["--val-subset", "0"])
