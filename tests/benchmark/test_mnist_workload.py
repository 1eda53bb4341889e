"""The ``mnist`` benchmark workload (chapter 5): a quick run on the CPU and its pieces."""

from __future__ import annotations

import math

import pytest
import torch

from bench import core
from bench import mnist as bench_mnist
from helpers.data import TensorBatches


def test_importing_the_module_registers_the_workload() -> None:
    assert core.WORKLOADS["mnist"].fn is bench_mnist.run
    assert core.WORKLOADS["mnist"].chapter == 5


def test_quick_run_on_cpu() -> None:
    figures = bench_mnist.run(torch.device("cpu"), quick=True)
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), names
    got = {f.name: f for f in figures}
    assert set(got) == {"cpu_tutorial_loader_images_per_s", "cpu_resident_images_per_s",
                        "cpu_resident_over_tutorial_loader"}
    for fig in figures:
        assert isinstance(fig, core.Figure)
        assert fig.device == "cpu"
        assert math.isfinite(fig.value) and fig.value > 0, fig
        assert fig.note.startswith("quick run"), fig
        assert f"{bench_mnist.QUICK_IMAGES:,} training images" in fig.note or fig.unit == "x"
    ratio = got["cpu_resident_images_per_s"].value / got["cpu_tutorial_loader_images_per_s"].value
    assert got["cpu_resident_over_tutorial_loader"].value == pytest.approx(ratio, rel=1e-12)
    assert got["cpu_resident_over_tutorial_loader"].unit == "x"


def test_tutorial_loader_is_the_tutorials_one() -> None:
    loader = bench_mnist.tutorial_loader(300)
    assert loader.batch_size == 128 and loader.num_workers == 0
    assert len(loader.dataset) == 300
    x, y = next(iter(loader))
    assert x.shape == (128, 1, 28, 28) and x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert y.dtype == torch.int64


def test_images_per_s_counts_every_image() -> None:
    x = torch.rand(300, 1, 28, 28)
    y = torch.randint(0, 10, (300,))
    rate, seconds = bench_mnist.train_images_per_s(TensorBatches(x, y, batch_size=128), "cpu",
                                                   warmup_batches=1)
    assert seconds > 0
    assert rate == pytest.approx(300 / seconds)


def test_time_to_accuracy_stops_at_the_target_or_the_limit() -> None:
    # An unreachable target on a small subset: stops after max_epochs, says it was not reached.
    out = bench_mnist.time_to_accuracy("cpu", target=1.01, max_epochs=1, train_subset=256,
                                         test_subset=256)
    assert out["epochs"] == 1 and out["reached"] is False
    assert out["seconds"] > 0 and 0.0 <= out["accuracy"] <= 1.0
    # A trivial target is reached after the first epoch.
    out = bench_mnist.time_to_accuracy("cpu", target=0.0, max_epochs=3, train_subset=256,
                                         test_subset=256)
    assert out["epochs"] == 1 and out["reached"] is True


def test_mnist_loaders_validate_on_held_out_training_images() -> None:
    # Chapter 5's split: the last 5,000 training images validate; the test set stays unseen.
    from helpers.data import MNIST_VAL_SIZE, mnist_loaders

    train, val = mnist_loaders(batch_size=64)
    assert len(train.dataset) == 60_000 - MNIST_VAL_SIZE and len(val.dataset) == MNIST_VAL_SIZE
    assert train.dataset.dataset.train and val.dataset.dataset.train
    assert set(train.dataset.indices).isdisjoint(val.dataset.indices)
    small_train, small_val = mnist_loaders(train_subset=100, val_subset=50, val_size=1_000)
    assert list(small_val.dataset.indices) == list(range(59_000, 59_050))
    assert list(small_train.dataset.indices) == list(range(100))
    with pytest.raises(ValueError, match="val_size"):
        mnist_loaders(val_size=60_000)


def test_the_benchmark_trains_with_the_books_epoch(monkeypatch) -> None:
    # Both paths go through helpers.training.train_epoch and its train_step, so they copy batches
    # the way the book's loop does (non_blocking on CUDA) and differ only in where the batches
    # come from.
    from helpers import training

    calls = []
    book_step = training.train_step

    def counting_step(*args, **kwargs):
        calls.append(len(args[2]))
        return book_step(*args, **kwargs)

    monkeypatch.setattr(training, "train_step", counting_step)
    x, y = torch.rand(300, 1, 28, 28), torch.randint(0, 10, (300,))
    bench_mnist.train_images_per_s(TensorBatches(x, y, batch_size=128), "cpu", warmup_batches=1)
    assert calls == [128, 128, 128, 44]  # one warm-up step, then the epoch's three batches


def _only_the_deliberate_read(monkeypatch, check_read):
    """Wrap the epoch's one deliberate read (helpers.training._read_once, all of an epoch's
    figures in one device-to-host copy) with ``check_read``; returns the list of its calls."""
    from helpers import training

    reads: list[object] = []
    real_read = training._read_once

    def deliberate_read(*values):
        result, note = check_read(real_read, *values)
        reads.append(note)
        return result

    monkeypatch.setattr(training, "_read_once", deliberate_read)
    return reads


def test_the_epoch_reads_values_back_only_in_its_deliberate_read(monkeypatch) -> None:
    """The CPU side of the GPU test below: every way the book's code (helpers/, bench/) could
    read a tensor's value back to Python in a step (each a wait for the GPU there) happens
    only inside the one deliberate read. (torch's own CPU Adam reads its step counts with
    .item(); the fused CUDA Adam the workload uses keeps them on the GPU.)"""
    import sys

    from tests.conftest import ROOT

    book_code = (str(ROOT / "helpers"), str(ROOT / "bench"))
    inside = {"read": False}
    outside: list[str] = []

    def watch(name):
        real = getattr(torch.Tensor, name)

        def watched(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not inside["read"] and caller.startswith(book_code):
                outside.append(f"{name} in {caller}")
            return real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, watched)

    def check_read(real_read, *values):
        inside["read"] = True
        try:
            return real_read(*values), len(values)
        finally:
            inside["read"] = False

    device = torch.device("cpu")
    model, optimizer = bench_mnist._model_and_optimizer(device)
    batches = [(torch.rand(16, 1, 28, 28), torch.randint(0, 10, (16,))) for _ in range(3)]
    reads = _only_the_deliberate_read(monkeypatch, check_read)
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        watch(name)
    assert bench_mnist._epoch(model, optimizer, batches, device) == 3 * 16
    assert outside == [], f"values read back during the epoch outside its one read: {outside}"
    assert reads == [1], "one read, of the loss sum alone (accuracy=False)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_dataloader_path_never_waits_for_the_gpu(monkeypatch) -> None:
    """Pageable batches copied with non_blocking, steps queued: nothing in the epoch waits for
    the GPU but its one deliberate read at the end, which waits exactly once."""
    from helpers.cuda_semantics import sync_debug

    device = torch.device("cuda", torch.cuda.current_device())
    model, optimizer = bench_mnist._model_and_optimizer(device)
    pageable = [(torch.rand(128, 1, 28, 28), torch.randint(0, 10, (128,))) for _ in range(3)]
    bench_mnist._epoch(model, optimizer, pageable[:1], device)  # warm-up: optimiser state
    torch.cuda.synchronize(device)

    def check_read(real_read, *values):
        with sync_debug(device, "warn") as waits:  # the epoch's one read may wait: count it
            result = real_read(*values)
        return result, len(waits)

    reads = _only_the_deliberate_read(monkeypatch, check_read)
    with sync_debug(device, "error"):  # any other wait for the GPU raises
        seen = bench_mnist._epoch(model, optimizer, pageable, device)
    assert seen == 3 * 128
    assert reads == [1], "one read at the epoch's end, waiting for the GPU exactly once"


def test_a_full_gpu_run_times_both_paths_on_gpu_images(monkeypatch) -> None:
    """The accelerator's branch of a full run, its measurements faked: the CPU's two paths on
    CPU_IMAGES, the accelerator's on GPU_IMAGES (a third of the epoch, named in the notes),
    then the time to the target accuracy on the whole set."""
    calls = []

    def fake_rate(batches, device, *, warmup_batches=5):
        calls.append((torch.device(device).type, len(batches.dataset)))
        return 1000.0, 1.0

    monkeypatch.setattr(bench_mnist, "train_images_per_s", fake_rate)
    monkeypatch.setattr(bench_mnist, "mnist_tensors",
                        lambda train, device, subset=None: (torch.zeros(subset or 60_000, 1),
                                                            torch.zeros(subset or 60_000)))
    monkeypatch.setattr(bench_mnist, "time_to_accuracy",
                        lambda device, **kw: {"seconds": 4.0, "epochs": 5, "accuracy": 0.986,
                                              "reached": True})
    figures = {f.name: f for f in bench_mnist.run(torch.device("meta"), quick=False)}
    assert bench_mnist.GPU_IMAGES == 20_000
    assert [c[0] for c in calls] == ["cpu", "cpu", "meta", "meta"]
    assert [c[1] for c in calls] == [bench_mnist.CPU_IMAGES] * 2 + [bench_mnist.GPU_IMAGES] * 2
    for name in ("tutorial_loader_images_per_s", "resident_images_per_s"):
        assert "over 20,000 training images" in figures[name].note, figures[name].note
    assert figures["seconds_to_target"].value == 4.0
