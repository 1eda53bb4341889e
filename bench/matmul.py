"""The ``matmul`` workload: matrix-multiply throughput on the CPU and the accelerator (chapter 3).

Chapter 3 (Matrix multiply, CPU vs GPU) times the product of the tutorials it names (Wang
Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3, 使用GPU训练模型*),
``(10000, 200) @ (200, 10000)``, first naively and then correctly, and sweeps square sizes in
fp32, TF32, bf16 and (on GPUs whose only tensor-core format is fp16, compute capability 7.x such
as Colab's T4) fp16. This module measures the same things for the book's benchmark command,
with the pieces chapter 3 reuses from :mod:`helpers.matmul`:

- :func:`fp32_precision`: allow or forbid TF32 for float32 matmuls, restoring the old setting;
- :func:`num_threads`: run a block with a given number of CPU threads, restoring the old one;
- :func:`supported_modes`: which of ``fp32``, ``tf32``, ``bf16``, ``fp16`` a device runs natively;
- :func:`sweep_sizes`: the square sizes that fit comfortably in a device's memory;
- :func:`time_matmul`: an honest timing of one product into a preallocated output (optionally
  with the host-to-device copy of its inputs included) and its TFLOP/s.

Figures (``quick=False``; ``quick=True`` uses small sizes and says so in each note):

- on the CPU, always: ``cpu_tutorial_product_seconds``, ``cpu_tutorial_product_gflops``,
  ``cpu_gflops_1thread`` and ``cpu_gflops_all_threads`` (a square product);
- on an accelerator: ``tutorial_product_seconds``, ``tutorial_product_naive_seconds`` (the
  ``time.time()`` pitfall), ``tutorial_product_naive_factor``, ``tutorial_product_with_copy_seconds``,
  ``tutorial_product_speedup_vs_cpu``, ``<mode>_tflops_n<size>`` for every supported mode and
  size, and ``<mode>_share_of_peak_n<largest>`` where the GPU's peak is known. On a T4 (15 GB,
  so n = 16384 does not fit a tenth of it) that is ``fp32_tflops_n1024``, ``fp32_tflops_n4096``,
  ``fp32_tflops_n8192``, ``fp16_tflops_n1024``, ``fp16_tflops_n4096``, ``fp16_tflops_n8192``,
  ``fp32_share_of_peak_n8192`` and ``fp16_share_of_peak_n8192`` (no TF32 or bf16 there);
  on an H100, ``fp32``, ``tf32`` and ``bf16`` up to n = 16384.

Two figures per format say how close a matmul comes to the peak, each with the telemetry read
while its products ran (``conditions``: the shape, the product count, and the SM clock in MHz,
power draw in W and temperature in C, each null with the reason where nothing could read it,
always on the CPU):

- ``<mode>_burst_tflops``: a short burst after an idle pause, at the best shape of a small
  search (:data:`helpers.matmul.BURST_SHAPES` on a GPU), clocks at boost, as the MAMF finder
  measures it; ``<mode>_sustained_tflops``: back-to-back products at that shape for
  :data:`SUSTAINED_SECONDS`, where power (and over longer runs heat) sets the clock; with
  ``<mode>_burst_share_of_peak`` and ``<mode>_sustained_share_of_peak`` where the peak is known;
- on the CPU, always, the same two in fp32 on small shapes: ``cpu_fp32_burst_gflops`` and
  ``cpu_fp32_sustained_gflops``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench.core import Figure, workload
from helpers.matmul import (
    BURST_SHAPES,
    MatmulRate,
    burst_rate,
    fp32_precision,
    num_threads,
    supported_modes,
    sustained_rate,
    sweep_sizes,
    time_matmul,
)
from helpers.timing import Timing, share_of_peak, synchronize

#: The tutorials' product (m, k) @ (k, n), which chapter 3 times.
TUTORIAL_SHAPE = (10_000, 200, 10_000)

#: Seconds of back-to-back products behind a sustained figure (full run; quick: 0.2 s): as
#: chapter 3's own run, long enough that the power the telemetry reads (the driver averages
#: it over about a second) is that of the load alone, read at three quarters of the way.
SUSTAINED_SECONDS = 2.0
#: The CPU's burst shapes (m, n, k) and sustained seconds (as chapter 3's CPU run: there a
#: burst and a sustained run differ by noise, not by clock), full run and quick run.
CPU_BURST_SHAPES = ((512, 512, 512), (768, 768, 768), (1024, 1024, 1024))
CPU_SUSTAINED_SECONDS = 0.5
QUICK_SHAPES = ((128, 128, 128), (192, 192, 192), (256, 256, 256))
QUICK_SECONDS = 0.2
#: ``min_run_time`` of each accelerator timing (tutorial product, size sweep) in a full run.
#: :func:`helpers.timing.benchmark` times blocks of calls, each block ten times the last
#: until it passes this many seconds (or its clock's own cost, a synchronisation, is under
#: 0.01% of it), and at least five blocks: so five blocks of 10 ms to 100 ms of products,
#: the clock's cost under 0.1% of each. A longer window (it was 0.5 s) grew the blocks to
#: 0.05-0.5 s and the five of them to seconds a timing; the H200's spreads were 0.01-7%.
GPU_MIN_RUN_TIME = 0.01
#: ``min_run_time`` of each CPU timing in a full run, at least five products (8 of the
#: tutorial's, 5 single-threaded and 22 all-threaded square ones on the H200's host).
CPU_MIN_RUN_TIME = 0.25


@dataclass(frozen=True)
class RateFigure(Figure):
    """A burst or sustained rate, with the conditions it was measured under: written into the
    result file beside the figure's other keys."""

    conditions: dict[str, Any] | None = None


def conditions(rate: MatmulRate) -> dict[str, Any]:
    """What a result file records beside a burst or sustained figure."""
    return {"kind": rate.kind, "shape": list(rate.shape), "products": rate.products,
            "seconds": rate.seconds, **rate.telemetry.as_dict()}


def _rate_figures(rate: MatmulRate, name: str, tag: str, *, scale: float = 1.0,
                  unit: str = "TFLOP/s", peak_of: str | None = None) -> list[Figure]:
    """The figure of a burst or sustained rate, and its share of the peak where known."""
    m, n, k = rate.shape
    how = (f"best of {len(rate.searched)} shapes after an idle pause; median of the "
           f"fastest products" if rate.kind == "burst" else
           f"{rate.products} back-to-back products over {rate.seconds:.1f} s")
    note = f"{tag}{rate.mode} ({m}, {k}) @ ({k}, {n}), {rate.kind}: {how}; {rate.telemetry}"
    out: list[Figure] = [RateFigure(name, rate.tflops * scale, unit, rate.device, None, note,
                                    conditions(rate))]
    share = share_of_peak(rate.tflops, peak_of, rate.mode) if peak_of else None
    if share is not None:
        out.append(Figure(f"{rate.mode}_{rate.kind}_share_of_peak", share, "fraction",
                          rate.device, None,
                          f"{tag}{rate.tflops:.1f} TFLOP/s of the dense {rate.mode} peak "
                          f"quoted for {peak_of} in helpers.timing.PEAK_TFLOPS"))
    return out

__all__ = ["run"]


def _naive_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int = 10) -> float:
    """The pitfall: ``time.perf_counter()`` around the call, with no synchronisation inside."""
    device = a.device
    seconds = []
    for _ in range(repeats):
        synchronize(device)  # start from an idle device, as a fresh cell would
        tic = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - tic)
        synchronize(device)
    return statistics.median(seconds)


def _relative_spread(timing: Timing, value: float) -> float:
    return value * timing.iqr / timing.median


def _cpu_figures(quick: bool) -> list[Figure]:
    m, k, n = (1000, 200, 1000) if quick else TUTORIAL_SHAPE
    size = 256 if quick else 2048
    budget = 0.05 if quick else CPU_MIN_RUN_TIME
    tag = "quick run: " if quick else ""
    timing, tf = time_matmul(m, k, n, "cpu", warmup=1, min_run_time=budget)
    threads = torch.get_num_threads()
    out = [
        Figure("cpu_tutorial_product_seconds", timing.median, "s", "cpu", timing.iqr,
               f"{tag}fp32 ({m}, {k}) @ ({k}, {n}) into a preallocated output, "
               f"{threads} threads, median"),
        Figure("cpu_tutorial_product_gflops", tf * 1e3, "GFLOP/s", "cpu",
               _relative_spread(timing, tf * 1e3), f"{tag}fp32 ({m}, {k}) @ ({k}, {n})"),
    ]
    for name, count in (("cpu_gflops_1thread", 1), ("cpu_gflops_all_threads", threads)):
        with num_threads(count):
            timing, tf = time_matmul(size, size, size, "cpu", warmup=1, min_run_time=budget)
        out.append(Figure(name, tf * 1e3, "GFLOP/s", "cpu", _relative_spread(timing, tf * 1e3),
                          f"{tag}fp32 square n={size}, {count} thread(s) of {threads}"))
    burst = burst_rate("cpu", "fp32", QUICK_SHAPES if quick else CPU_BURST_SHAPES, idle=0.05)
    sustained = sustained_rate("cpu", "fp32", burst.shape,
                               seconds=QUICK_SECONDS if quick else CPU_SUSTAINED_SECONDS)
    for rate in (burst, sustained):
        out += _rate_figures(rate, f"cpu_fp32_{rate.kind}_gflops", tag, scale=1e3,
                             unit="GFLOP/s")
    return out


def _gpu_figures(device: torch.device, quick: bool, cpu_tutorial_seconds: float) -> list[Figure]:
    m, k, n = (1000, 200, 1000) if quick else TUTORIAL_SHAPE
    tag = "quick run: " if quick else ""
    budget = GPU_MIN_RUN_TIME  # quick too: five blocks of 10-100 ms of its small products
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    out = []

    with fp32_precision("ieee"):
        a = torch.randn(m, k, device=device)
        b = torch.randn(k, n, device=device)
        for _ in range(3):
            a @ b
        naive = _naive_seconds(a, b)
        del a, b
    timing, _ = time_matmul(m, k, n, device, "fp32", min_run_time=budget)
    copied, _ = time_matmul(m, k, n, device, "fp32", include_copy=True, min_run_time=budget)
    shape = f"fp32 ({m}, {k}) @ ({k}, {n})"
    out += [
        Figure("tutorial_product_seconds", timing.median, "s", str(device), timing.iqr,
               f"{tag}{shape} into a preallocated output, synchronised, median"),
        Figure("tutorial_product_naive_seconds", naive, "s", str(device), None,
               f"{tag}{shape}, time.perf_counter() around the call, no synchronisation"),
        Figure("tutorial_product_naive_factor", timing.median / naive, "x", str(device), None,
               f"{tag}synchronised time / naive time"),
        Figure("tutorial_product_with_copy_seconds", copied.median, "s", str(device), copied.iqr,
               f"{tag}{shape}, inputs copied from the CPU inside every timed call"),
        Figure("tutorial_product_speedup_vs_cpu", cpu_tutorial_seconds / timing.median, "x",
               str(device), None, f"{tag}CPU seconds / {device} seconds, fp32"),
    ]

    modes = supported_modes(device)
    # Bursts first, on a GPU that has only run the short products above: clocks at boost.
    bursts = {mode: burst_rate(device, mode, QUICK_SHAPES if quick else BURST_SHAPES,
                               idle=0.05 if quick else 0.2) for mode in modes}
    for rate in bursts.values():
        out += _rate_figures(rate, f"{rate.mode}_burst_tflops", tag, peak_of=name)
    _empty_cache(device)

    sizes = sweep_sizes(device, [256, 512] if quick else [1024, 4096, 8192, 16384])
    for mode in modes:
        achieved = {}
        for size in sizes:
            timing, tf = time_matmul(size, size, size, device, mode, min_run_time=budget)
            achieved[size] = tf
            out.append(Figure(f"{mode}_tflops_n{size}", tf, "TFLOP/s", str(device),
                              _relative_spread(timing, tf), f"{tag}square n={size}, {mode}"))
            _empty_cache(device)  # the next size needs different blocks
        largest = sizes[-1]
        share = share_of_peak(achieved[largest], name, mode)
        if share is not None:
            out.append(Figure(f"{mode}_share_of_peak_n{largest}", share, "fraction",
                              str(device), None,
                              f"{tag}{achieved[largest]:.1f} TFLOP/s of the dense {mode} peak "
                              f"quoted for {name} in helpers.timing.PEAK_TFLOPS"))

    # Sustained last, at each burst's best shape: seconds of work, as long as power allows.
    for mode, burst in bursts.items():
        rate = sustained_rate(device, mode, burst.shape,
                              seconds=QUICK_SECONDS if quick else SUSTAINED_SECONDS)
        out += _rate_figures(rate, f"{mode}_sustained_tflops", tag, peak_of=name)
        _empty_cache(device)
    return out


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


@workload("matmul", chapter=3)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Matrix-multiply throughput: the tutorials' product and a square-size sweep in each format
    the device runs natively (fp32, TF32, bf16; fp16 on compute capability 7.x).

    The CPU's GFLOP/s (one thread and all threads) are always measured; the accelerator's
    figures are added when ``device`` is not the CPU.
    """
    device = torch.device(device)
    figures = _cpu_figures(quick)
    if device.type != "cpu":
        cpu_seconds = figures[0].value
        figures += _gpu_figures(device, quick, cpu_seconds)
    return figures
