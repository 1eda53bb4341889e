"""The ``fast_mnist`` benchmark workload (chapter 14): registration and a quick run on the CPU."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from bench import core
from bench import fast_mnist as bench_fast
from helpers.fast_mnist import STEPS


@pytest.fixture(scope="module")
def quick() -> dict[str, core.Figure]:
    figures = bench_fast.run(torch.device("cpu"), quick=True)
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), names
    return {f.name: f for f in figures}


def test_importing_the_module_registers_the_workload() -> None:
    assert core.WORKLOADS["fast_mnist"].fn is bench_fast.run
    assert core.WORKLOADS["fast_mnist"].chapter == 14


def test_quick_run_reports_every_step_and_every_seed(quick) -> None:
    expected = {f"{r.key}_{what}" for r in STEPS
                for what in ("images_per_s", "train_s", "test_accuracy", "prepare_s")}
    # a quick run's seeds: the full run's first two (a mean and a spread need two)
    assert bench_fast.QUICK_SEEDS == bench_fast.SEEDS[:2]
    expected |= {f"final_seed{s}_{what}" for s in bench_fast.QUICK_SEEDS
                 for what in ("test_accuracy", "train_s")}
    expected |= {"final_mean_test_accuracy", "final_max_train_s", "last_over_tutorial"}
    assert set(quick) == expected  # no busy share: the CPU has no CUDA kernels to profile
    for fig in quick.values():
        assert isinstance(fig, core.Figure) and fig.device == "cpu"
        assert math.isfinite(fig.value) and fig.value >= 0, fig
        assert fig.note.startswith(f"quick run on {bench_fast.QUICK_IMAGES:,} training and "
                                   f"{bench_fast.QUICK_TEST:,} test images"), fig
        if fig.unit == "fraction":
            assert 0 <= fig.value <= 1


def test_quick_run_figures_agree_with_each_other(quick) -> None:
    for r in STEPS:
        rate, seconds = quick[f"{r.key}_images_per_s"].value, quick[f"{r.key}_train_s"].value
        images = r.epochs * (bench_fast.QUICK_IMAGES // r.batch_size) * r.batch_size
        assert rate == pytest.approx(images / seconds, rel=1e-9)
    accuracies = [quick[f"final_seed{s}_test_accuracy"].value for s in bench_fast.QUICK_SEEDS]
    assert quick["final_mean_test_accuracy"].value == pytest.approx(statistics.fmean(accuracies))
    assert quick["final_mean_test_accuracy"].spread == pytest.approx(statistics.stdev(accuracies))
    assert accuracies[0] == quick[f"{STEPS[-1].key}_test_accuracy"].value
    times = [quick[f"final_seed{s}_train_s"].value for s in bench_fast.QUICK_SEEDS]
    assert quick["final_max_train_s"].value == max(times)
    ratio = quick[f"{STEPS[-1].key}_images_per_s"].value / quick["tutorial_images_per_s"].value
    assert quick["last_over_tutorial"].value == pytest.approx(ratio, rel=1e-12)


def test_the_tutorial_loader_is_the_tutorials() -> None:
    loader = bench_fast.tutorial_loader(300)
    assert loader.batch_size == 128 and loader.num_workers == 0 and len(loader.dataset) == 300
