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
  generation), reported apart from the steady-state step time.

Recipes: ``plain``; ``bf16_autocast``; ``channels_last``; on CUDA also
``fp16_autocast_gradscaler``, ``cudnn_benchmark``, ``pinned_non_blocking`` (each step also
copies its batch from host memory, pageable for ``plain_host_copy``, pinned and
``non_blocking`` for this recipe) and ``compile`` (``torch.compile`` of the model). On the
CPU ``compile`` is left out: its first compilation takes minutes on a small machine, which
chapter 12 reports separately.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
from torch import nn

from helpers.bench.core import Figure, workload
from helpers.models import MnistCNN
from helpers.timing import benchmark, synchronize

__all__ = ["BATCH_SIZE", "make_step", "recipes_for", "run"]

#: The book's batch size for the CNN (chapter 5); full GPU runs use :data:`GPU_BATCH_SIZE`.
BATCH_SIZE = 128
GPU_BATCH_SIZE = 512


def recipes_for(device: torch.device) -> list[str]:
    """The recipes measured on ``device``, ``plain`` first (chapter 12)."""
    names = ["plain", "bf16_autocast", "channels_last"]
    if device.type == "cuda":
        names += ["fp16_autocast_gradscaler", "cudnn_benchmark", "plain_host_copy",
                  "pinned_non_blocking", "compile"]
    return names


def make_step(recipe: str, device: torch.device, batch_size: int = BATCH_SIZE,
              seed: int = 0) -> Callable[[], torch.Tensor]:
    """A function that runs one training step of the chapter 5 CNN with ``recipe`` applied.

    The model, optimiser and batch are created here (seeded), so every recipe starts alike.
    ``cudnn_benchmark`` sets ``torch.backends.cudnn.benchmark`` while its step runs and
    restores the previous value afterwards.
    """
    device = torch.device(device)
    if recipe not in recipes_for(device) and recipe != "compile":
        raise ValueError(f"recipe {recipe!r} does not apply to {device}; "
                         f"choose from {recipes_for(device)}")
    torch.manual_seed(seed)
    model = MnistCNN().to(device)
    gen = torch.Generator().manual_seed(seed)
    host_x = torch.rand(batch_size, 1, 28, 28, generator=gen)
    host_y = torch.randint(0, 10, (batch_size,), generator=gen)
    x, y = host_x.to(device), host_y.to(device)
    amp_dtype = {"bf16_autocast": torch.bfloat16, "fp16_autocast_gradscaler": torch.float16}.get(recipe)
    scaler = torch.amp.GradScaler("cuda") if recipe == "fp16_autocast_gradscaler" else None
    if recipe == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if recipe == "pinned_non_blocking":
        host_x, host_y = host_x.pin_memory(), host_y.pin_memory()
    net = torch.compile(model) if recipe == "compile" else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    copy = recipe in ("plain_host_copy", "pinned_non_blocking")
    non_blocking = recipe == "pinned_non_blocking"

    def step() -> torch.Tensor:
        bx, by = x, y
        if copy:
            bx = host_x.to(device, non_blocking=non_blocking)
            by = host_y.to(device, non_blocking=non_blocking)
        previous = torch.backends.cudnn.benchmark
        if recipe == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = True
        try:
            opt.zero_grad(set_to_none=True)
            autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None
                        else contextlib.nullcontext())
            with autocast:
                loss = loss_fn(net(bx), by)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        finally:
            torch.backends.cudnn.benchmark = previous
        return loss.detach()

    return step


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
        if recipe == "compile":
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            figures.append(Figure("compile_seconds", time.perf_counter() - start, "s",
                                  str(device), note=note + ", first compiled step"))
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
