"""The ``matmul`` workload: matrix-multiply throughput on the CPU and the accelerator (chapter 3).

Chapter 3 (Matrix multiply, CPU vs GPU) times the product of the tutorials it names (Wang
Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3, 使用GPU训练模型*),
``(10000, 200) @ (200, 10000)``, first naively and then correctly, and sweeps square sizes in
fp32, TF32 and bf16. This module measures the same things for the book's benchmark command and
holds the small pieces the chapter reuses once it has shown them in raw PyTorch:

- :func:`fp32_precision`: allow or forbid TF32 for float32 matmuls, restoring the old setting;
- :func:`num_threads`: run a block with a given number of CPU threads, restoring the old one;
- :func:`supported_modes`: which of ``fp32``, ``tf32``, ``bf16`` a device runs natively;
- :func:`sweep_sizes`: the square sizes that fit comfortably in a device's memory;
- :func:`time_matmul`: an honest timing of one product into a preallocated output (optionally
  with the host-to-device copy of its inputs included) and its TFLOP/s.

Figures (``quick=False``; ``quick=True`` uses small sizes and says so in each note):

- on the CPU, always: ``cpu_seed_product_seconds``, ``cpu_seed_product_gflops``,
  ``cpu_gflops_1thread`` and ``cpu_gflops_all_threads`` (a square product);
- on an accelerator: ``seed_product_seconds``, ``seed_product_naive_seconds`` (the
  ``time.time()`` pitfall), ``seed_product_naive_factor``, ``seed_product_with_copy_seconds``,
  ``seed_product_speedup_vs_cpu``, ``<mode>_tflops_n<size>`` for every supported mode and
  size, and ``<mode>_share_of_peak_n<largest>`` where the GPU's peak is known.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator

import torch

from helpers.bench.core import Figure, workload
from helpers.timing import Timing, benchmark, matmul_flops, share_of_peak, synchronize, tflops

__all__ = ["MODES", "SEED_SHAPE", "SWEEP_SIZES", "fp32_precision", "num_threads", "run",
           "supported_modes", "sweep_sizes", "time_matmul"]

#: The tutorials' product: (m, k) @ (k, n).
SEED_SHAPE = (10_000, 200, 10_000)

#: Number formats the sweep knows: the name used in figures -> (dtype, fp32 matmul precision).
MODES: dict[str, tuple[torch.dtype, str]] = {
    "fp32": (torch.float32, "ieee"),
    "tf32": (torch.float32, "tf32"),
    "bf16": (torch.bfloat16, "ieee"),
}


#: Square sizes the chapter's accelerator sweep tries, before :func:`sweep_sizes` drops the ones
#: too large for the device.
SWEEP_SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

#: Where a device's memory size is unknown, the sweep stops at this size (three fp32 matrices
#: of 4096 x 4096 take 192 MiB).
UNKNOWN_MEMORY_LARGEST = 4096


def _total_memory(device: torch.device) -> int | None:
    """Bytes of memory ``device`` offers, or None where PyTorch cannot say."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.get_device_properties(device).total_memory
    if device.type == "mps" and torch.backends.mps.is_available():
        # Apple GPUs share the machine's memory; Metal recommends how much one process may use.
        return torch.mps.recommended_max_memory()
    return None


def sweep_sizes(device: torch.device | str, sizes: tuple[int, ...] | list[int] = SWEEP_SIZES
                ) -> list[int]:
    """The ``sizes`` whose three fp32 ``n x n`` matrices (two inputs and the output) take at
    most a tenth of ``device``'s memory (chapter 3).

    A tenth leaves room for the caching allocator, other programs and a second format's
    matrices. Where the memory size is unknown (the CPU, or an accelerator PyTorch reports no
    size for), sizes up to ``UNKNOWN_MEMORY_LARGEST`` are kept.
    """
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"sizes must be positive matrix sizes, got {sizes!r}")
    total = _total_memory(torch.device(device))
    if total is None:
        return [s for s in sizes if s <= UNKNOWN_MEMORY_LARGEST]
    return [s for s in sizes if 3 * s * s * 4 <= total / 10]


@contextlib.contextmanager
def fp32_precision(precision: str) -> Iterator[None]:
    """Within the block, CUDA float32 matmuls use ``"ieee"`` (true fp32) or ``"tf32"`` (chapter 3).

    Uses ``torch.backends.cuda.matmul.fp32_precision``, the API PyTorch recommends since 2.9,
    and restores the previous value afterwards. (Mixing it with the older
    ``torch.backends.cuda.matmul.allow_tf32`` flag in one process makes PyTorch raise.)
    """
    if precision not in ("ieee", "tf32"):
        raise ValueError(f"precision must be 'ieee' or 'tf32', got {precision!r}")
    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    matmul.fp32_precision = precision
    try:
        yield
    finally:
        matmul.fp32_precision = old


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Within the block, CPU operators use ``n`` threads; the old number is restored (chapter 3)."""
    if n < 1:
        raise ValueError(f"need at least one thread, got {n}")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def supported_modes(device: torch.device | str) -> list[str]:
    """The modes of :data:`MODES` that ``device`` runs natively (chapter 3).

    The CPU: ``fp32`` (TF32 is a GPU tensor-core format, and bf16 matmuls are only fast on
    CPUs with bf16 units). A CUDA GPU: ``fp32``; ``tf32`` from compute capability 8.0
    (Ampere); ``bf16`` where the GPU has bf16 hardware rather than emulation. Other
    accelerators: ``fp32``. Every question is asked about ``device`` itself, not the current GPU.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return ["fp32"]
    modes = ["fp32"]
    if torch.cuda.get_device_capability(device) >= (8, 0):
        modes.append("tf32")
    # is_bf16_supported() takes no device: it asks the current one, so make `device` current.
    with torch.cuda.device(device):
        if torch.cuda.is_bf16_supported(including_emulation=False):
            modes.append("bf16")
    return modes


def time_matmul(m: int, k: int, n: int, device: torch.device | str, mode: str = "fp32", *,
                include_copy: bool = False, preallocate: bool = True, warmup: int = 2,
                min_run_time: float = 0.5, min_runs: int = 5) -> tuple[Timing, float]:
    """Time ``(m, k) @ (k, n)`` on ``device`` in ``mode``; return the timing and its TFLOP/s.

    With ``preallocate`` (the default) every call writes into one output made beforehand
    (``torch.matmul(a, b, out=c)``), so the CPU and a GPU are compared like with like: a fresh
    CPU output of many megabytes costs the operating system a page fault per page on every
    call, while a GPU's caching allocator hands back the same block. With ``include_copy`` the
    inputs start on the CPU and every timed call first copies both to ``device`` (the product
    stays there), which is what a computation whose data lives on the host really pays
    (chapter 3).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {sorted(MODES)}")
    device = torch.device(device)
    dtype, precision = MODES[mode]
    home = torch.device("cpu") if include_copy else device
    a = torch.randn(m, k, device=home, dtype=dtype)
    b = torch.randn(k, n, device=home, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype) if preallocate else None

    if include_copy:
        def product() -> torch.Tensor:
            return torch.matmul(a.to(device), b.to(device), out=out)
    else:
        def product() -> torch.Tensor:
            return torch.matmul(a, b, out=out)

    with fp32_precision(precision):
        timing = benchmark(product, device=device, label=f"{mode} {m}x{k} @ {k}x{n}",
                           warmup=warmup, min_run_time=min_run_time, min_runs=min_runs)
    return timing, tflops(matmul_flops(m, k, n), timing.median)


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
    m, k, n = (1000, 200, 1000) if quick else SEED_SHAPE
    size = 256 if quick else 2048
    budget = 0.05 if quick else 1.0
    tag = "quick run: " if quick else ""
    timing, tf = time_matmul(m, k, n, "cpu", warmup=1, min_run_time=budget)
    threads = torch.get_num_threads()
    out = [
        Figure("cpu_seed_product_seconds", timing.median, "s", "cpu", timing.iqr,
               f"{tag}fp32 ({m}, {k}) @ ({k}, {n}) into a preallocated output, "
               f"{threads} threads, median"),
        Figure("cpu_seed_product_gflops", tf * 1e3, "GFLOP/s", "cpu",
               _relative_spread(timing, tf * 1e3), f"{tag}fp32 ({m}, {k}) @ ({k}, {n})"),
    ]
    for name, count in (("cpu_gflops_1thread", 1), ("cpu_gflops_all_threads", threads)):
        with num_threads(count):
            timing, tf = time_matmul(size, size, size, "cpu", warmup=1, min_run_time=budget)
        out.append(Figure(name, tf * 1e3, "GFLOP/s", "cpu", _relative_spread(timing, tf * 1e3),
                          f"{tag}fp32 square n={size}, {count} thread(s) of {threads}"))
    return out


def _gpu_figures(device: torch.device, quick: bool, cpu_seed_seconds: float) -> list[Figure]:
    m, k, n = (1000, 200, 1000) if quick else SEED_SHAPE
    tag = "quick run: " if quick else ""
    budget = 0.1 if quick else 1.0
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
        Figure("seed_product_seconds", timing.median, "s", str(device), timing.iqr,
               f"{tag}{shape} into a preallocated output, synchronised, median"),
        Figure("seed_product_naive_seconds", naive, "s", str(device), None,
               f"{tag}{shape}, time.perf_counter() around the call, no synchronisation"),
        Figure("seed_product_naive_factor", timing.median / naive, "x", str(device), None,
               f"{tag}synchronised time / naive time"),
        Figure("seed_product_with_copy_seconds", copied.median, "s", str(device), copied.iqr,
               f"{tag}{shape}, inputs copied from the CPU inside every timed call"),
        Figure("seed_product_speedup_vs_cpu", cpu_seed_seconds / timing.median, "x",
               str(device), None, f"{tag}CPU seconds / {device} seconds, fp32"),
    ]

    sizes = sweep_sizes(device, [256, 512] if quick else [1024, 4096, 8192, 16384])
    for mode in supported_modes(device):
        achieved = {}
        for size in sizes:
            timing, tf = time_matmul(size, size, size, device, mode, min_run_time=budget)
            achieved[size] = tf
            out.append(Figure(f"{mode}_tflops_n{size}", tf, "TFLOP/s", str(device),
                              _relative_spread(timing, tf), f"{tag}square n={size}, {mode}"))
            if device.type == "cuda":
                with torch.cuda.device(device):
                    torch.cuda.empty_cache()  # the next size needs different blocks
        largest = sizes[-1]
        share = share_of_peak(achieved[largest], name, mode)
        if share is not None:
            out.append(Figure(f"{mode}_share_of_peak_n{largest}", share, "fraction",
                              str(device), None,
                              f"{tag}{achieved[largest]:.1f} TFLOP/s of the dense {mode} peak "
                              f"quoted for {name} in helpers.timing.PEAK_TFLOPS"))
    return out


@workload("matmul", chapter=3)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Matrix-multiply throughput: the tutorials' product and a square-size sweep in fp32/TF32/bf16.

    The CPU's GFLOP/s (one thread and all threads) are always measured; the accelerator's
    figures are added when ``device`` is not the CPU.
    """
    device = torch.device(device)
    figures = _cpu_figures(quick)
    if device.type != "cpu":
        cpu_seconds = figures[0].value
        figures += _gpu_figures(device, quick, cpu_seconds)
    return figures
