"""The ``recipes`` workload: what each performance recipe of chapter 12 buys one training step.

Chapter 12 (Performance recipes) applies each recipe to the chapter 5 CNN
(:class:`helpers.models.MnistCNN`, Adam, cross-entropy) and measures it against the plain
fp32 step in the same run. This module measures the same steps for the book's benchmark
command, on whatever device it is given, on synthetic batches of MNIST's shape (the step's
speed does not depend on the pixel values).

Figures, for each recipe that applies to the device (see :func:`recipes_for`):

- ``<recipe>_step_ms``: median milliseconds per training step (spread: interquartile range);
- ``<recipe>_speedup``: plain step time divided by the recipe's (``x``; above 1 is faster);
- ``compile_seconds``: where ``compile`` runs, the first compiled step (tracing and code
  generation, with empty compiler caches as on a fresh machine: :func:`cold_compile_cache`),
  reported apart from the steady-state step time.

Recipes: ``plain``; ``bf16_autocast`` (left out on CUDA GPUs below compute capability 8.0,
see :func:`bf16_is_fast`); ``channels_last``; on CUDA also ``fp16_autocast_gradscaler``,
``cudnn_benchmark``, ``pinned_non_blocking`` (each step also copies its batch from host
memory, pageable for ``plain_host_copy``, pinned and ``non_blocking`` for this recipe) and
``compile`` (``torch.compile`` of the model's forward pass, and through AOTAutograd its
backward; the loss and the optimizer stay eager). The CPU benchmark leaves ``compile`` out:
its first compilation takes minutes on a small machine. Chapter 12 builds its steps with the
same :class:`RecipeStep` and compiles live on every device.
"""

from __future__ import annotations

import contextlib
import time

import torch

from bench.core import Figure, workload
from helpers.recipes import (
    BATCH_SIZE,
    GPU_BATCH_SIZE,
    cold_compile_cache,
    make_step,
    recipes_for,
    tf32_advice_ignored,
)
from helpers.timing import benchmark, synchronize

__all__ = ["run"]


@workload("recipes", chapter=12)
def run(device: torch.device, *, quick: bool) -> list[Figure]:
    """Per-recipe training-step time of the chapter 5 CNN and speed-up over the plain step."""
    device = torch.device(device)
    batch = GPU_BATCH_SIZE if device.type == "cuda" and not quick else BATCH_SIZE
    min_run_time = 0.3 if quick else 2.0
    note = f"{'quick run, ' if quick else ''}MnistCNN training step, Adam, batch {batch}"
    figures: list[Figure] = []
    timings = {}
    for recipe in recipes_for(device):
        step = make_step(recipe, device, batch)
        # A first compilation timed cold: a cache left on disk by an earlier run (of the
        # benchmark or of chapter 12) would make it many times shorter.
        cold = cold_compile_cache() if recipe == "compile" else contextlib.nullcontext()
        with cold:
            if recipe == "compile":
                synchronize(device)
                start = time.perf_counter()
                with tf32_advice_ignored():  # plain measures fp32 matmuls without TF32 too
                    step()
                synchronize(device)
                figures.append(Figure("compile_seconds", time.perf_counter() - start, "s",
                                      str(device),
                                      note=note + ", first compiled step, empty caches"))
            timings[recipe] = benchmark(step, device=device, label=recipe, warmup=3,
                                        min_run_time=min_run_time)
    for recipe, t in timings.items():
        base = timings["plain_host_copy" if recipe == "pinned_non_blocking" else "plain"]
        figures.append(Figure(f"{recipe}_step_ms", t.median * 1e3, "ms", str(device),
                              spread=t.iqr * 1e3, note=note))
        figures.append(Figure(f"{recipe}_speedup", base.median / t.median, "x", str(device),
                              note=note + (", against plain_host_copy"
                                           if recipe == "pinned_non_blocking" else ", against plain")))
    return figures
