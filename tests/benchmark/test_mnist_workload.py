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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_dataloader_path_never_waits_for_the_gpu() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    model, optimizer = bench_mnist._model_and_optimizer(device)
    pageable = [(torch.rand(128, 1, 28, 28), torch.randint(0, 10, (128,))) for _ in range(3)]
    bench_mnist._epoch(model, optimizer, pageable[:1], device)  # warm-up: optimiser state
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")  # a blocking copy or .item() below raises
    try:
        seen = bench_mnist._epoch(model, optimizer, pageable, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert seen == 3 * 128
