"""The ``recipes`` workload: what each performance recipe of chapter 12 buys one training step.

Chapter 12 (Performance recipes) applies each recipe to the chapter 5 CNN
(:class:`helpers.models.MnistCNN`, Adam, cross-entropy), whose step a big GPU finishes faster
than the host launches it, and to a residual CNN (:class:`helpers.recipes.ResidualCNN`) whose
step keeps a GPU busy, and measures each against the plain fp32 step in the same run. This
module measures the same steps for the book's benchmark command, on whatever device it is
given, on synthetic batches of MNIST's shape (the step's speed does not depend on the pixel
values).

Figures, for each recipe that applies to the device (see :func:`recipes_for`):

- ``<recipe>_step_ms``: median milliseconds per training step (spread: interquartile range),
  each recipe timed for :data:`MIN_RUN_TIME` seconds, one after the other; a quick run
  times the chapter 5 CNN at :data:`QUICK_BATCH_SIZE` and each recipe for
  :data:`QUICK_MIN_RUN_TIME` seconds, after one warm-up step instead of three;
- ``<recipe>_speedup``: plain step time divided by the recipe's (``x``; above 1 is faster);
- ``compile_seconds``: where ``compile`` runs, the first compiled step (tracing and code
  generation, with empty compiler caches as on a fresh machine: :func:`cold_compile_cache`),
  reported apart from the steady-state step time;
- the same three, prefixed ``resnet_``, for the residual CNN (:func:`resnet_size`: width 64
  at batch 1024 on a CUDA GPU, timed for :data:`RESNET_MIN_RUN_TIME`; width 16 at batch 16
  elsewhere), without the two input-pipeline recipes;
- on CUDA, ``plain_gpu_busy_ms`` and ``resnet_plain_gpu_busy_ms``: how long the GPU's kernels
  and copies ran per plain step (:func:`device_busy`); divided by ``plain_step_ms``, the share
  of the step the GPU was busy (left out, saying why, where the profiler cannot see the GPU:
  :class:`helpers.recipes.NoGpuWorkProfiled`).

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
import sys
import time

import torch

from bench.core import Figure, workload
from helpers.recipes import (
    BATCH_SIZE,
    GPU_BATCH_SIZE,
    NoGpuWorkProfiled,
    cold_compile_cache,
    device_busy,
    make_step,
    recipes_for,
    resnet_size,
    tf32_advice_ignored,
)
from helpers.timing import benchmark, synchronize

__all__ = ["MIN_RUN_TIME", "QUICK_BATCH_SIZE", "QUICK_MIN_RUN_TIME", "RESNET_MIN_RUN_TIME",
           "run"]

# helpers.timing.benchmark times blocks of steps, each ten times the last until it passes
# min_run_time (or its clock's own cost, a synchronisation, is under 0.01% of it), and at
# least five blocks.
#: Seconds each recipe of the chapter 5 CNN is timed in a full run, as chapter 12 times it:
#: on an H100 or H200 its 1.6-2.3 ms step makes blocks of 100 steps, and 0.5 s five of them
#: (the former 2 s: nine to thirteen). Their spread, 3-17% of the median on the H200, is the
#: host's jitter (the step is bound by the host), which more blocks measure no smaller.
MIN_RUN_TIME = 0.5
#: The residual CNN's ``min_run_time`` in a full run: five blocks of one step each. Its step
#: keeps a GPU busy (8-17 ms on an H200, the same kernels every step), so one step varies
#: little: chapter 12 checks speed-ups of 1.17x to 1.9x over the plain step on the H200,
#: whose spreads were 0.02-1.3% of the medians with the former 1 s,
#: which made blocks of 10 steps (of 100, 4 s a recipe, where the clock costs over 8 us).
RESNET_MIN_RUN_TIME = 0.005


#: Recipes that change the input pipeline, not the step: measured on the chapter 5 CNN only.
PIPELINE_RECIPES = ("plain_host_copy", "pinned_non_blocking")
#: The chapter 5 CNN's batch in a quick run, a smoke test (at the full run's batch of 128 a
#: bf16 step took about 2 s on a 2-core CPU, 0.2 s at 32).
QUICK_BATCH_SIZE = 32
#: Seconds each recipe is timed in a quick run (at least five steps: helpers.timing.benchmark).
QUICK_MIN_RUN_TIME = 0.1


@workload("recipes", chapter=12)
def run(device: torch.device, *, quick: bool) -> list[Figure]:
    """Per-recipe training-step time of the chapter 5 CNN and of a residual CNN, and speed-up
    over the plain step."""
    device = torch.device(device)
    if quick:
        batch = QUICK_BATCH_SIZE
    else:
        batch = GPU_BATCH_SIZE if device.type == "cuda" else BATCH_SIZE
    warmup = 1 if quick else 3
    note = f"{'quick run, ' if quick else ''}MnistCNN training step, Adam, batch {batch}"
    figures = _recipe_figures(device, recipes_for(device), note, prefix="", batch=batch,
                              min_run_time=QUICK_MIN_RUN_TIME if quick else MIN_RUN_TIME,
                              warmup=warmup)
    width, res_batch = resnet_size(device, quick=quick)
    res_note = (f"{'quick run, ' if quick else ''}ResidualCNN(width={width}) training step, "
                f"Adam, batch {res_batch}")
    figures += _recipe_figures(device, [r for r in recipes_for(device)
                                        if r not in PIPELINE_RECIPES],
                               res_note, prefix="resnet_", batch=res_batch,
                               min_run_time=QUICK_MIN_RUN_TIME if quick else RESNET_MIN_RUN_TIME,
                               warmup=warmup,
                               model="resnet", width=width)
    if device.type == "cuda":  # what bounds each plain step: the GPU's busy time in it
        for prefix, kwargs, what in (("", {"batch_size": batch}, note),
                                     ("resnet_", {"batch_size": res_batch, "model": "resnet",
                                                  "width": width}, res_note)):
            try:
                busy = device_busy(make_step("plain", device, **kwargs), device)
            except NoGpuWorkProfiled as exc:  # the other figures stand without this one
                print(f"{prefix}plain_gpu_busy_ms left out: {exc}", file=sys.stderr)
                continue
            figures.append(Figure(f"{prefix}plain_gpu_busy_ms", busy.busy_ms, "ms",
                                  str(device), note=what + ", GPU kernels and copies per "
                                  "plain step (profiler), overlaps counted once"))
    return figures


def _recipe_figures(device: torch.device, names: list[str], note: str, *, prefix: str,
                    batch: int, min_run_time: float, warmup: int = 3,
                    **model: object) -> list[Figure]:
    """Step time and speed-up over the plain step of each recipe in ``names`` (``plain``
    first), figure names starting with ``prefix``."""
    figures: list[Figure] = []
    timings = {}
    for recipe in names:
        step = make_step(recipe, device, batch, **model)
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
                figures.append(Figure(f"{prefix}compile_seconds", time.perf_counter() - start,
                                      "s", str(device),
                                      note=note + ", first compiled step, empty caches"))
            timings[recipe] = benchmark(step, device=device, label=recipe, warmup=warmup,
                                        min_run_time=min_run_time)
    for recipe, t in timings.items():
        base = timings["plain_host_copy" if recipe == "pinned_non_blocking" else "plain"]
        figures.append(Figure(f"{prefix}{recipe}_step_ms", t.median * 1e3, "ms", str(device),
                              spread=t.iqr * 1e3, note=note))
        figures.append(Figure(f"{prefix}{recipe}_speedup", base.median / t.median, "x",
                              str(device),
                              note=note + (", against plain_host_copy"
                                           if recipe == "pinned_non_blocking" else ", against plain")))
    return figures
