"""The ``fast_mnist`` workload: chapter 5's MNIST loop taken to GPU speed (chapter 14).

Chapter 14 (Training at GPU speed) starts from the tutorial's DataLoader loop and changes one
thing at a time (:data:`helpers.fast_mnist.STEPS`): data on the device, batch 512 with a
one-cycle schedule, a conv net with batch norm, fused Adam, the step captured in a CUDA graph,
then bf16 (fp16 on a GPU without fast bf16) and channels_last. Each step is trained and timed
by :func:`helpers.fast_mnist.train`: a throw-away warm-up and any capture first (``prepare_s``),
then the training epochs with the device synchronised before and after; the test accuracy is
computed on the device after the clock stops.

Figures, per step ``<key>`` (``tutorial``, ``device_data``, ``one_cycle``, ``bn_net``,
``fused``, ``graph``, ``precision``): ``<key>_images_per_s``, ``<key>_train_s``,
``<key>_test_accuracy`` and ``<key>_prepare_s``. Then the last step over :data:`SEEDS` seeds:
``final_seed<k>_test_accuracy`` and ``final_seed<k>_train_s`` for each (a quick run: the
:data:`QUICK_SEEDS`), their ``final_mean_test_accuracy`` and ``final_max_train_s``;
``last_over_tutorial`` (the last step's images/s over the tutorial's); on CUDA, the
diagnostic: ``device_data_busy_share`` and ``precision_busy_share`` (the share of a step's
wall time the GPU is busy; left out, saying why, where the profiler cannot see the GPU).

On an accelerator the steps train on all 60,000 training images and test on all 10,000. On the
CPU (and with ``quick=True`` anywhere) every step runs a short version on
:data:`SHORT_IMAGES` training images and :data:`SHORT_TEST` test images (a quick run:
:data:`QUICK_IMAGES` and :data:`QUICK_TEST`, :data:`QUICK_WARMUP` warm-up step instead of
three), and each note says so: its accuracy is not the recipe's.
"""

from __future__ import annotations

import statistics
import sys

import torch
from torch.utils.data import DataLoader, Subset

from bench.core import Figure, workload
from helpers.data import mnist, mnist_tensors
from helpers.fast_mnist import STEPS, Recipe, TrainRun, busy_share, train
from helpers.recipes import NoGpuWorkProfiled

__all__ = ["QUICK_IMAGES", "QUICK_SEEDS", "QUICK_TEST", "QUICK_WARMUP", "SEEDS", "SHORT_IMAGES",
           "SHORT_TEST", "run", "run_steps"]

#: Seeds of the last step's accuracy and time (the first is the one the steps use).
SEEDS = (0, 1, 2, 3, 4)
#: A quick run's seeds: two, enough for a mean and a spread.
QUICK_SEEDS = SEEDS[:2]
#: Training images of each step's short version (the CPU), and of a quick run (one batch of
#: 512 a step, four of the tutorial's 128).
SHORT_IMAGES = 2_048
QUICK_IMAGES = 512
#: Test images of the short versions, and of a quick run.
SHORT_TEST = 1_000
QUICK_TEST = 500
#: Warm-up steps before each step's clock starts in a quick run (a full run: train's three).
QUICK_WARMUP = 1


def tutorial_loader(n: int | None, seed: int = 0) -> DataLoader:
    """The tutorial's DataLoader (``ToTensor`` per image, shuffled, batch 128, no workers)
    over the first ``n`` training images (all when None)."""
    ds = mnist(train=True)
    if n is not None:
        ds = Subset(ds, range(min(n, len(ds))))
    return DataLoader(ds, batch_size=STEPS[0].batch_size, shuffle=True, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))


def run_steps(device: torch.device, n: int | None, n_test: int | None,
              steps: tuple[Recipe, ...] = STEPS, seed: int = 0,
              warmup_steps: int = 3) -> list[TrainRun]:
    """Every step of chapter 14 trained and measured once on ``device``."""
    data = mnist_tensors(True, device, subset=n)
    test = mnist_tensors(False, device, subset=n_test)
    loader = tutorial_loader(n, seed)
    return [train(r, device, data, test, seed=seed, loader=loader, warmup_steps=warmup_steps)
            for r in steps]


@workload("fast_mnist", chapter=14)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Chapter 14: each step from the tutorial's loop to 99% in under a second (images/s,
    training seconds, test accuracy), the last step over five seeds, and the GPU-busy share."""
    device = torch.device(device)
    short = quick or device.type == "cpu"
    n = (QUICK_IMAGES if quick else SHORT_IMAGES) if short else None
    n_test = (QUICK_TEST if quick else SHORT_TEST) if short else None
    seeds = QUICK_SEEDS if quick else SEEDS
    warmup = {"warmup_steps": QUICK_WARMUP} if quick else {}
    tag = (f"{'quick' if quick else 'short'} run on {n:,} training and {n_test:,} test images "
           "(not the recipe's accuracy): " if short else "")
    dev = str(device)
    runs = run_steps(device, n, n_test, **warmup)
    figures: list[Figure] = []
    for r in runs:
        what = (f"{tag}{r.recipe.name}: batch {r.recipe.batch_size}, {r.recipe.epochs} "
                f"epoch(s), {r.images:,} images; "
                + ("step captured" if r.captured else "eager step"))
        k = r.recipe.key
        figures += [
            Figure(f"{k}_images_per_s", r.images_per_s, "images/s", dev, None, what),
            Figure(f"{k}_train_s", r.seconds, "s", dev, None,
                   f"{what}; training only, device synchronised"),
            Figure(f"{k}_test_accuracy", r.accuracy, "fraction", dev, None,
                   f"{what}; evaluated on {dev} after the timed training"),
            Figure(f"{k}_prepare_s", r.prepare_s, "s", dev, None,
                   f"{what}; warm-up (and capture) before the clock starts"),
        ]
    last = runs[-1]
    finals = [last]
    data = mnist_tensors(True, device, subset=n)
    test = mnist_tensors(False, device, subset=n_test)
    for s in seeds[1:]:
        finals.append(train(last.recipe, device, data, test, seed=s, **warmup))
    for s, r in zip(seeds, finals, strict=True):
        what = f"{tag}{last.recipe.name}, seed {s}"
        figures += [
            Figure(f"final_seed{s}_test_accuracy", r.accuracy, "fraction", dev, None, what),
            Figure(f"final_seed{s}_train_s", r.seconds, "s", dev, None,
                   f"{what}; training only, device synchronised"),
        ]
    accuracies = [r.accuracy for r in finals]
    figures += [
        Figure("final_mean_test_accuracy", statistics.fmean(accuracies), "fraction", dev,
               statistics.stdev(accuracies), f"{tag}mean over seeds {seeds}; spread: the "
               "standard deviation"),
        Figure("final_max_train_s", max(r.seconds for r in finals), "s", dev, None,
               f"{tag}the slowest of the {len(seeds)} seeds' training"),
        Figure("last_over_tutorial", last.images_per_s / runs[0].images_per_s, "x", dev, None,
               f"{tag}images/s of '{last.recipe.name}' over the tutorial DataLoader's"),
    ]
    if device.type == "cuda":
        for recipe in (STEPS[1], last.recipe):
            try:
                busy_ms, step_ms = busy_share(recipe, device, data)
            except NoGpuWorkProfiled as exc:  # the training figures stand without it
                print(f"{recipe.key}_busy_share left out: {exc}", file=sys.stderr)
                continue
            figures.append(Figure(
                f"{recipe.key}_busy_share", busy_ms / step_ms, "fraction", dev, None,
                f"{tag}{recipe.name}, batch {recipe.batch_size}: GPU busy {busy_ms:.3f} ms "
                f"of a {step_ms:.3f} ms step (profiler)"))
    return figures

