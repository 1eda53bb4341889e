"""The ``regression`` workload: 500 full-batch Adam steps of a linear regression (chapter 4).

Chapter 4 (Linear regression, CPU vs GPU) fits ``y = x @ w.T + b`` to the data of the
tutorials it names (Wang Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3,
使用GPU训练模型*: n = 1,000,000 rows, w = [2, -3], b = 10, noise standard deviation 2) with
500 Adam steps on each device, each time from a fresh model with the same starting point. This module times
:func:`helpers.regression.fit_regression`, the loop the chapter writes out.

Figures (``quick=True`` uses 20,000 rows and says so in each note):

- always: ``cpu_seconds`` (the 500 steps), ``cpu_final_loss``, ``cpu_w0``, ``cpu_w1``, ``cpu_b``;
- on an accelerator: ``gpu_seconds`` (median of five runs, IQR as spread),
  ``gpu_item_seconds`` (the same loop calling ``loss.item()`` every step, median of five runs
  alternating with the others), ``gpu_item_cost_per_step_seconds`` (the difference per step,
  with the two IQRs per step as its spread: where a step's GPU work is short it can lie within
  its spread of zero, or below it), ``gpu_speedup_vs_cpu``, ``gpu_final_loss``, ``gpu_w0``,
  ``gpu_w1`` and ``gpu_b``.
"""

from __future__ import annotations

import statistics

import torch

from bench.core import Figure, workload
from helpers.data import make_regression
from helpers.regression import (
    NOISE_STD,
    REPEATS,
    STEPS,
    TRUE_B,
    TRUE_W,
    N,
    RegressionRun,
    fit_regression,
)

__all__ = ["run"]


def _fit_figures(prefix: str, result: RegressionRun, device: str, tag: str) -> list[Figure]:
    return [
        Figure(f"{prefix}_final_loss", result.final_loss, "MSE", device, None,
               f"{tag}after the last step; the noise variance is {NOISE_STD ** 2:g}"),
        *(Figure(f"{prefix}_w{i}", value, "1", device, None, f"{tag}true value {true:g}")
          for i, (value, true) in enumerate(zip(result.w, TRUE_W, strict=True))),
        Figure(f"{prefix}_b", result.b, "1", device, None, f"{tag}true value {TRUE_B:g}"),
    ]


@workload("regression", chapter=4)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Seconds for 500 full-batch Adam steps of linear regression on the CPU and the accelerator."""
    device = torch.device(device)
    n = 20_000 if quick else N
    tag = "quick run: " if quick else ""
    what = f"{STEPS} Adam steps, n={n:,}, fresh model"
    x, y = make_regression(n, TRUE_W, TRUE_B, NOISE_STD, seed=0)

    cpu = fit_regression(x, y)
    figures = [Figure("cpu_seconds", cpu.seconds, "s", "cpu", None, f"{tag}{what}, one run"),
               *_fit_figures("cpu", cpu, "cpu", tag)]
    if device.type == "cpu":
        return figures

    xd, yd = x.to(device), y.to(device)
    fit_regression(xd, yd, steps=10)  # warm-up: CUDA kernels, cuBLAS handle, allocator
    runs, items = [], []
    for _ in range(REPEATS):  # alternate, so a slow spell of the machine hits both kinds alike
        runs.append(fit_regression(xd, yd))
        items.append(fit_regression(xd, yd, log_every_step=True))
    seconds = [r.seconds for r in runs]
    q = statistics.quantiles(seconds, n=4)
    median = statistics.median(seconds)
    item_seconds = [r.seconds for r in items]
    item_q = statistics.quantiles(item_seconds, n=4)
    item_median = statistics.median(item_seconds)
    dev = str(device)
    iqr, item_iqr = q[2] - q[0], item_q[2] - item_q[0]
    figures += [
        Figure("gpu_seconds", median, "s", dev, iqr, f"{tag}{what}, median of {REPEATS} runs"),
        Figure("gpu_item_seconds", item_median, "s", dev, item_iqr,
               f"{tag}{what}, loss.item() every step, median of {REPEATS} runs"),
        Figure("gpu_item_cost_per_step_seconds", (item_median - median) / STEPS, "s", dev,
               (iqr + item_iqr) / STEPS,
               f"{tag}(item median - median) / {STEPS} steps; spread: both IQRs per step"),
        Figure("gpu_speedup_vs_cpu", cpu.seconds / median, "x", dev, None,
               f"{tag}cpu_seconds / gpu_seconds"),
        *_fit_figures("gpu", runs[0], dev, tag),
    ]
    return figures
