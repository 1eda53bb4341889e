"""Matrix multiply on the CPU and an accelerator: the pieces chapter 3 reuses (chapter 3).

Chapter 3 (Matrix multiply, CPU vs GPU) times the product of the tutorials it names (Wang
Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3, 使用GPU训练模型*),
``(10000, 200) @ (200, 10000)``, first naively and then correctly, and sweeps square sizes in
fp32, TF32, bf16 and (on GPUs whose tensor cores predate bf16, such as Colab's T4) fp16. Once it has shown each step in raw PyTorch it uses these:

- :func:`fp32_precision`: allow or forbid TF32 for float32 matmuls, restoring the old setting;
- :func:`num_threads`: run a block with a given number of CPU threads, restoring the old one;
- :func:`supported_modes`: which of ``fp32``, ``tf32``, ``bf16``, ``fp16`` a device runs natively;
- :func:`sweep_sizes`: the square sizes that fit comfortably in a device's memory;
- :func:`minor_page_faults`, :func:`huge_pages_for_large_blocks`, :func:`other_allocator_loaded`:
  the probes behind the chapter's page-fault count (why a fresh CPU output costs time);
- :func:`crossover`: the size from which one series of a sweep beats another for good, decided
  by trusted timings only (not noisy, not taken on an oversubscribed CPU);
- :func:`time_matmul`: an honest timing of one product into a preallocated output (optionally
  with the host-to-device copy of its inputs included) and its TFLOP/s.

The book's benchmark (``bench/matmul.py``) measures with the same functions.
"""

from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from helpers.timing import Timing, _check_sizes, _device, benchmark, matmul_flops, tflops

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MODES", "SWEEP_SIZES", "TENSOR_CORES_SINCE", "crossover",
           "fp32_precision",
           "huge_pages_for_large_blocks", "minor_page_faults", "num_threads",
           "other_allocator_loaded", "supported_modes", "sweep_sizes", "time_matmul"]

#: Number formats the sweep knows: the name used in figures -> (dtype, fp32 matmul precision).
MODES: dict[str, tuple[torch.dtype, str]] = {
    "fp32": (torch.float32, "ieee"),
    "tf32": (torch.float32, "tf32"),
    "bf16": (torch.bfloat16, "ieee"),
    "fp16": (torch.float16, "ieee"),
}

#: The first CUDA compute capability with tensor cores (Volta): they multiply fp16 there.
TENSOR_CORES_SINCE = (7, 0)


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
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise TypeError(f"sizes must be a list of matrix sizes such as [256, 1024], got {sizes!r}")
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes is empty; pass positive matrix sizes, such as [256, 1024]")
    _check_sizes(*sizes)
    total = _total_memory(_device(device))
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
    if not isinstance(precision, str) or precision not in ("ieee", "tf32"):
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
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"need a whole number of threads, at least 1, got {n!r}")
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
    (Ampere); ``bf16`` where the GPU has bf16 hardware rather than emulation; ``fp16`` where
    fp16 is the only tensor-core format (compute capability 7.x: Volta, and Turing such as
    Colab's T4). Where bf16 runs, fp16 runs on the same tensor cores at the same peak, so it is
    not measured twice. Other accelerators, and the ``meta`` device: ``fp32``. Every question
    is asked about ``device`` itself, not the current GPU; a device this machine does not have
    raises a ``ValueError``.
    """
    device = _device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return ["fp32"]
    modes = ["fp32"]
    capability = torch.cuda.get_device_capability(device)
    if capability >= (8, 0):
        modes.append("tf32")
    # is_bf16_supported() takes no device: it asks the current one, so make `device` current.
    with torch.cuda.device(device):
        if torch.cuda.is_bf16_supported(including_emulation=False):
            modes.append("bf16")
    if capability >= TENSOR_CORES_SINCE and "bf16" not in modes:
        modes.append("fp16")
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
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {sorted(MODES)}")
    _check_sizes(m, k, n)
    device = _device(device)
    if device.type == "meta":
        raise ValueError("the meta device computes nothing, so there is nothing to time; "
                         "pass the device the product runs on")
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


def minor_page_faults(fn: Callable[[], object]) -> int | None:
    """Minor page faults of this process while ``fn()`` runs, or None where the operating
    system does not count them here (Windows) (chapter 3)."""
    if not callable(fn):
        raise TypeError(f"fn must be a function to run, got {fn!r}; wrap a call in a lambda")
    try:
        import resource  # Linux and macOS
    except ImportError:
        fn()
        return None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def huge_pages_for_large_blocks(
        enabled_file: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> bool:
    """True where Linux maps large blocks with 2 MiB pages: transparent huge pages set to
    ``always``, or to ``madvise`` with PyTorch asked to request them (``THP_MEM_ALLOC_ENABLE``)
    (chapter 3)."""
    try:
        with open(enabled_file) as f:
            mode = f.read()
    except OSError:
        return False
    asked = os.environ.get("THP_MEM_ALLOC_ENABLE", "").lower() in ("1", "true", "on", "yes")
    return "[always]" in mode or ("[madvise]" in mode and asked)


def other_allocator_loaded() -> bool:
    """True where this process preloads another memory allocator (tcmalloc, jemalloc, ...
    through ``LD_PRELOAD``), which may hand freed blocks back without new faults (chapter 3)."""
    return "malloc" in os.environ.get("LD_PRELOAD", "")


def crossover(sweep: pd.DataFrame, slow: str, fast: str) -> int | None:
    """The smallest size from which series ``fast`` takes less time than ``slow`` at every
    larger size both ran, or None where ``fast`` does not win at the largest (chapter 3).

    ``sweep`` has one row per timed product, with columns ``size``, ``series`` and
    ``seconds`` (chapter 3's sweep table). Where it also has a ``trusted`` column
    (:attr:`helpers.timing.Timing.trusted`), only trusted rows count: a noisy timing, or a CPU
    timing taken while the CPU was oversubscribed, decides nothing, and a size where either
    series has no trusted timing is left out of the walk.
    """
    missing = {"size", "series", "seconds"} - set(getattr(sweep, "columns", ()))
    if missing:
        raise ValueError(f"sweep needs the columns size, series and seconds; missing "
                         f"{sorted(missing)}")
    names = set(sweep["series"])
    for name in (slow, fast):
        if name not in names:
            raise ValueError(f"no series {name!r} in the sweep; it has {sorted(names)}")
    if "trusted" in sweep.columns:
        sweep = sweep[sweep["trusted"].astype(bool)]
    both = sweep.pivot_table(index="size", columns="series", values="seconds")
    if slow not in both or fast not in both:
        return None  # one series has no trusted timing at all
    both = both[[slow, fast]].dropna().sort_index()
    since = None
    for size in reversed(both.index):  # walk down from the largest size while fast wins
        if both.loc[size, fast] >= both.loc[size, slow]:
            break
        since = int(size)
    return since
