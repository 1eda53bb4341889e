"""Timing code on a device honestly, and turning times into FLOP/s.

Introduced in chapter 3 (Matrix multiply, CPU vs GPU), where the naive ``time.time()``
measurement is shown to be wrong on a GPU and replaced by :func:`benchmark`. Used again in
chapters 4, 5, 12 and by the book's benchmark command.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.benchmark as tbench

__all__ = [
    "PEAK_TFLOPS",
    "PeakFigures",
    "Timing",
    "benchmark",
    "matmul_flops",
    "peak_tflops",
    "share_of_peak",
    "synchronize",
    "tflops",
]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all work queued on ``device`` has finished (no-op on the CPU) (chapter 3)."""
    dev = torch.device(device) if device is not None else None
    kind = dev.type if dev is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(dev)
    elif kind == "mps" and torch.backends.mps.is_available():
        torch.mps.synchronize()
    elif kind == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.synchronize(dev)


@dataclass(frozen=True)
class Timing:
    """The result of :func:`benchmark`: seconds per call, with spread (chapter 3)."""

    label: str
    device: str
    median: float
    iqr: float
    mean: float
    times: tuple[float, ...] = field(repr=False)
    number_per_run: int = 1

    @property
    def runs(self) -> int:
        """How many timed measurements the median is taken over."""
        return len(self.times)

    def __str__(self) -> str:
        return (
            f"{self.label} on {self.device}: median {_fmt(self.median)}, "
            f"IQR {_fmt(self.iqr)} over {self.runs} measurements"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain figures for a table or a result file."""
        return {
            "label": self.label,
            "device": self.device,
            "median_s": self.median,
            "iqr_s": self.iqr,
            "mean_s": self.mean,
            "runs": self.runs,
        }


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    device: torch.device | str = "cpu",
    label: str | None = None,
    warmup: int = 3,
    min_run_time: float = 1.0,
    num_threads: int | None = None,
    **kwargs: Any,
) -> Timing:
    """Time ``fn(*args, **kwargs)`` on ``device`` the right way (chapter 3).

    Warms up first (so one-off costs such as CUDA initialisation and cuBLAS heuristics are
    not counted), then lets :class:`torch.utils.benchmark.Timer` repeat the call until
    ``min_run_time`` seconds have been spent, synchronising the device around every
    measurement. Returns the median and interquartile range per call.
    """
    device = torch.device(device)
    if warmup < 0 or min_run_time <= 0:
        raise ValueError("warmup must be >= 0 and min_run_time > 0")
    for _ in range(warmup):
        fn(*args, **kwargs)
    synchronize(device)

    if device.type in ("mps", "xpu"):
        # torch.utils.benchmark synchronises CUDA only; wrap the call for other accelerators.
        def call() -> None:
            fn(*args, **kwargs)
            synchronize(device)
    else:

        def call() -> None:
            fn(*args, **kwargs)

    timer = tbench.Timer(
        stmt="call()",
        globals={"call": call},
        label=label or getattr(fn, "__name__", "call"),
        num_threads=num_threads or torch.get_num_threads(),
    )
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    times = tuple(float(t) for t in measurement.times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return Timing(
        label=label or getattr(fn, "__name__", "call"),
        device=str(device),
        median=float(statistics.median(times)),
        iqr=float(q[2] - q[0]),
        mean=float(statistics.fmean(times)),
        times=times,
        number_per_run=int(measurement.number_per_run),
    )


def matmul_flops(m: int, k: int, n: int) -> int:
    """Floating-point operations of an ``(m, k) @ (k, n)`` product: ``2*m*k*n`` (chapter 3)."""
    if min(m, k, n) <= 0:
        raise ValueError(f"matrix sizes must be positive, got {(m, k, n)}")
    return 2 * m * k * n


def tflops(flops: float, seconds: float) -> float:
    """Throughput in TFLOP/s (10**12 floating-point operations per second) (chapter 3)."""
    if seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"seconds must be a positive finite number, got {seconds}")
    return flops / seconds / 1e12


@dataclass(frozen=True)
class PeakFigures:
    """Vendor-quoted dense peak throughput of one GPU model, in TFLOP/s (chapter 3)."""

    name: str
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    source: str

    def for_dtype(self, dtype: str) -> float | None:
        """Peak for ``'fp32'``, ``'tf32'``, ``'bf16'`` or ``'fp16'`` (None where unsupported)."""
        if dtype not in ("fp32", "tf32", "bf16", "fp16"):
            raise ValueError(f"unknown dtype key {dtype!r}; use fp32, tf32, bf16 or fp16")
        return getattr(self, dtype)


# Dense (no structured sparsity) tensor-core figures; datasheets often print the sparse figure,
# which is twice as large. Matched against torch.cuda.get_device_name() by the first key found
# in the name, so more specific keys come first.
PEAK_TFLOPS: dict[str, PeakFigures] = {
    "H200": PeakFigures(
        "NVIDIA H200 SXM", 67.0, 494.7, 989.4, 989.4,
        "https://www.nvidia.com/en-us/data-center/h200/ (sparse figures halved)",
    ),
    "H100 PCIe": PeakFigures(
        "NVIDIA H100 PCIe", 51.0, 378.0, 756.0, 756.0,
        "https://www.nvidia.com/en-us/data-center/h100/ (sparse figures halved)",
    ),
    "H100": PeakFigures(
        "NVIDIA H100 SXM", 67.0, 494.7, 989.4, 989.4,
        "https://www.nvidia.com/en-us/data-center/h100/ (sparse figures halved)",
    ),
    "A100": PeakFigures(
        "NVIDIA A100", 19.5, 156.0, 312.0, 312.0,
        "https://www.nvidia.com/en-us/data-center/a100/",
    ),
    "L40S": PeakFigures(
        "NVIDIA L40S", 91.6, 183.0, 362.0, 362.0,
        "https://www.nvidia.com/en-us/data-center/l40s/ (sparse figures halved)",
    ),
    "L4": PeakFigures(
        "NVIDIA L4", 30.3, 60.0, 121.0, 121.0,
        "https://www.nvidia.com/en-us/data-center/l4/ (sparse figures halved)",
    ),
    "A10": PeakFigures(
        "NVIDIA A10", 31.2, 62.5, 125.0, 125.0,
        "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
    ),
    "V100": PeakFigures(
        "NVIDIA V100 SXM2", 15.7, None, None, 125.0,
        "https://www.nvidia.com/en-us/data-center/v100/",
    ),
    "T4": PeakFigures(
        "NVIDIA T4", 8.1, None, None, 65.0,
        "https://www.nvidia.com/en-us/data-center/tesla-t4/",
    ),
    "RTX 4090": PeakFigures(
        "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    ),
}


def peak_tflops(device_name: str, dtype: str = "fp32") -> float | None:
    """Dense peak TFLOP/s for a GPU name such as ``'NVIDIA H100 80GB HBM3'`` (chapter 3).

    Returns ``None`` when the GPU is not in :data:`PEAK_TFLOPS` or has no such number format.
    """
    for key, figures in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            return figures.for_dtype(dtype)
    return None


def share_of_peak(achieved_tflops: float, device_name: str, dtype: str = "fp32") -> float | None:
    """Achieved throughput as a fraction of the device's dense peak, or None if unknown (chapter 3)."""
    peak = peak_tflops(device_name, dtype)
    return None if peak is None else achieved_tflops / peak
