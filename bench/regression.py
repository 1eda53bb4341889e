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
  ``gpu_w1`` and ``gpu_b``;
- on an accelerator, what bounds a step (chapter 4's "What limits the speed-up"):
  ``step_operators`` and ``step_bytes_per_row`` (counted by
  :func:`helpers.regression.step_traffic`), ``gpu_copy_bandwidth`` (a 128 MiB copy),
  ``gpu_launch_seconds`` (one tiny operator queued back to back), ``gpu_read_step_seconds``
  (the same with ``.item()`` after it; both with their IQRs: one read's round trip is their
  difference only where the spreads support one, as ``helpers.timing.compare`` decides, so
  no difference is recorded as a figure), ``gpu_step_seconds_n1000``,
  ``gpu_step_seconds_n1000000`` and
  ``gpu_step_seconds_large`` (one step at each size; the large size, in its note, is the
  first of 10, 30, 100 and 300 times n whose bytes take four times the step at n=1,000 at
  the copy's bandwidth).
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
    step_timing,
    step_traffic,
    timing_data,
)
from helpers.timing import benchmark

__all__ = ["MIN_RUN_TIME", "QUICK_MIN_RUN_TIME", "run"]

#: ``min_run_time`` of each timing of what bounds a step (full run). ``helpers.timing.benchmark``
#: times blocks of calls, each ten times the last until it passes this many seconds (or its
#: clock's own cost, a synchronisation, is under 0.01% of it), and at least five blocks: so
#: five blocks of 10-100 ms each (1,000 to 10,000 tiny launches, 100 steps at n=1,000, one
#: step at the large size), the clock's cost under 0.1% of a block. The former 1 s and 0.5 s
#: made blocks of up to 0.5 s and cost 6-18 s on an H200 for the same spreads.
MIN_RUN_TIME = 0.01
#: The same in a quick run (a smoke test; on a CPU the blocks are shorter).
QUICK_MIN_RUN_TIME = 0.01


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
        *_bound_figures(device, n, tag, quick=quick),
    ]
    return figures


def _bound_figures(device: torch.device, n: int, tag: str, *,
                   quick: bool = False) -> list[Figure]:
    """What bounds a step on ``device``: launches or bytes (chapter 4), each timing with
    ``min_run_time`` :data:`MIN_RUN_TIME` (:data:`QUICK_MIN_RUN_TIME` when ``quick``)."""
    dev = str(device)
    timed = {"min_run_time": QUICK_MIN_RUN_TIME if quick else MIN_RUN_TIME}
    traffic = step_traffic(*timing_data(n, device))  # at n, as chapter 4: a step's fixed
    # bytes (parameters, Adam's state) spread over 1,000 rows would inflate the bytes a row
    src = torch.rand(2**25, device=device)  # 128 MiB: beyond any GPU's L2 cache
    dst = torch.empty_like(src)
    copy = benchmark(dst.copy_, src, device=device, label="copy", **timed)
    bandwidth = 2 * src.numel() * src.element_size() / copy.median
    tiny = torch.zeros(1, device=device)

    def read_step() -> None:
        tiny.add_(1)
        tiny.item()

    launch = benchmark(tiny.add_, 1, device=device, label="launch", **timed)
    read = benchmark(read_step, device=device, label="read", **timed)
    small = step_timing(*timing_data(1_000, device), **timed)
    full = step_timing(*timing_data(n, device), **timed)
    large_n = n * 10
    for factor in (10, 30, 100, 300):  # the first size whose bytes clearly take the longest
        large_n = n * factor
        if traffic.bytes_per_row * large_n / bandwidth >= 4 * small.median:
            break
    large = step_timing(*timing_data(large_n, device), **timed)
    return [
        Figure("step_operators", traffic.operators, "1", dev, None,
               f"{tag}operators one regression step runs on the device (views excluded)"),
        Figure("step_bytes_per_row", traffic.bytes_per_row, "B", dev, None,
               f"{tag}bytes those operators read and write, per data row"),
        Figure("gpu_copy_bandwidth", bandwidth / 1e9, "GB/s", dev, None,
               f"{tag}2 x 128 MiB / median time of a device-to-device copy_"),
        Figure("gpu_launch_seconds", launch.median, "s", dev, launch.iqr,
               f"{tag}one add_ on a 1-element tensor, queued back to back"),
        Figure("gpu_read_step_seconds", read.median, "s", dev, read.iqr,
               f"{tag}the same add_ followed by .item()"),
        Figure("gpu_step_seconds_n1000", small.median, "s", dev, small.iqr,
               f"{tag}one regression step, n=1,000"),
        Figure("gpu_step_seconds_n1000000", full.median, "s", dev, full.iqr,
               f"{tag}one regression step, n={n:,}"),
        Figure("gpu_step_seconds_large", large.median, "s", dev, large.iqr,
               f"{tag}one regression step, n={large_n:,}"),
    ]
