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
  with the host-to-device copy of its inputs included) and its TFLOP/s;
- :func:`gpu_telemetry`: the GPU's SM clock, power draw and temperature right now (through
  ``torch.cuda``, which needs ``pynvml``, else ``nvidia-smi``; none on the CPU, with the reason);
- :func:`burst_rate` and :func:`sustained_rate`: the two figures a matmul's throughput needs,
  a short burst at the best of a few shapes (clocks at boost, as the MAMF finder measures) and
  seconds of back-to-back products (clocks as power and heat let them stay), each with the
  telemetry read while the products ran.

The book's benchmark (``bench/matmul.py``) measures with the same functions.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from helpers.timing import (
    Timing,
    _check_sizes,
    _device,
    _synchronize,
    benchmark,
    matmul_flops,
    tflops,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BURST_SHAPES", "MODES", "NVIDIA_SMI_QUERY", "SWEEP_SIZES", "TENSOR_CORES_SINCE",
           "MatmulRate", "Telemetry", "burst_rate", "crossover", "fp32_precision",
           "gpu_telemetry", "huge_pages_for_large_blocks", "minor_page_faults", "num_threads",
           "other_allocator_loaded", "supported_modes", "sustained_rate", "sweep_sizes",
           "time_matmul"]

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


# -- Burst and sustained: the two figures of a GPU's matmul throughput (chapter 3) ----------

#: The shapes ``(m, n, k)`` a burst search tries on a GPU: a few around 4096-8192, multiples of
#: 256 (the tile sizes of cuBLAS's kernels divide them, so no tile is half empty).
BURST_SHAPES: tuple[tuple[int, int, int], ...] = (
    (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192))

#: The fallback where ``torch.cuda``'s readings need ``pynvml`` and it is missing: the GPU's
#: UUID (to pick the row of this device), SM clock in MHz, power draw in W, temperature in C.
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=uuid,clocks.sm,power.draw,temperature.gpu",
                    "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Telemetry:
    """The GPU's SM clock (MHz), power draw (W) and temperature (C) at one moment, where
    something could read them (chapter 3).

    ``source`` says what read them (``"pynvml"`` or ``"amdsmi"`` through ``torch.cuda``, or
    ``"nvidia-smi"``); a reading that could not be taken is None, and ``missing`` says why.
    ``busy`` says whether the device was still running the measured products when the reading
    came back (None where nothing was read, or nothing was running). The power draw is the
    driver's average over its last sample period (NVML: about a second on Ampere and newer
    GPUs), so beside a burst of some milliseconds it mostly reflects the idle pause before it;
    the SM clock is the clock at the moment of reading.
    """

    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    source: str | None = None
    missing: str | None = None
    busy: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"sm_clock_mhz": self.sm_clock_mhz, "power_w": self.power_w,
                "temperature_c": self.temperature_c, "source": self.source,
                "missing": self.missing, "busy": self.busy}

    def __str__(self) -> str:
        if self.source is None:
            return f"no telemetry ({self.missing})"
        parts = [f"{v:.0f} {unit}" if v is not None else f"{unit} unknown"
                 for v, unit in ((self.sm_clock_mhz, "MHz"), (self.power_w, "W"),
                                 (self.temperature_c, "C"))]
        return ", ".join(parts) + f" ({self.source})"


def _number(text: str) -> float | None:
    """A reading of nvidia-smi's csv ('1980', '698.12'), None for '[N/A]' and the like."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _uuid(device: torch.device) -> str | None:
    """The GPU's UUID as nvidia-smi prints it without its ``GPU-`` prefix, lower case."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:  # noqa: BLE001 - a fake or an odd build: fall back to the GPU count
        return None
    return str(uuid).lower().removeprefix("gpu-") if uuid is not None else None


def _nvidia_smi(device: torch.device, run: Callable[..., Any]) -> Telemetry:
    """The readings of ``device`` from ``nvidia-smi``, or why there are none."""
    try:
        out = run(list(NVIDIA_SMI_QUERY), capture_output=True, text=True, timeout=10,
                  check=True).stdout
    except FileNotFoundError:
        return Telemetry(missing="nvidia-smi is not on PATH")
    except subprocess.TimeoutExpired:
        return Telemetry(missing="nvidia-smi did not answer within 10 s")
    except subprocess.CalledProcessError as exc:
        return Telemetry(missing=f"nvidia-smi failed with exit status {exc.returncode}")
    except OSError as exc:
        return Telemetry(missing=f"nvidia-smi could not run: {exc}")
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines()
            if line.strip()]
    rows = [row for row in rows if len(row) == 4]
    uuid = _uuid(device)
    mine = [row for row in rows if uuid and row[0].lower().removeprefix("gpu-") == uuid]
    if not mine and len(rows) == 1 and torch.cuda.device_count() == 1:
        mine = rows  # one GPU on each side: it is this one
    if not mine:
        return Telemetry(missing=f"nvidia-smi lists {len(rows)} GPU(s), none with "
                                 f"{device}'s UUID")
    clock, power, temperature = (_number(cell) for cell in mine[0][1:])
    unread = [name for name, v in (("clocks.sm", clock), ("power.draw", power),
                                   ("temperature.gpu", temperature)) if v is None]
    return Telemetry(clock, power, temperature, "nvidia-smi",
                     f"nvidia-smi reports no {', '.join(unread)}" if unread else None)


def gpu_telemetry(device: torch.device | str, *,
                  run: Callable[..., Any] = subprocess.run) -> Telemetry:
    """The SM clock, power draw and temperature of ``device`` now (chapter 3).

    On a CUDA or ROCm GPU through ``torch.cuda.clock_rate``, ``power_draw`` (milliwatts from
    NVML; watts from ROCm's amdsmi) and ``temperature``, which need ``pynvml`` (the
    ``nvidia-ml-py`` package; ``amdsmi`` on ROCm); where they fail, on an NVIDIA GPU, from
    ``nvidia-smi`` (``run`` runs it; the tests pass a fake). Anywhere else, and where neither
    works, every reading is None and :attr:`Telemetry.missing` says why.
    """
    device = _device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return Telemetry(missing=f"no GPU telemetry on the {device.type} device"
                         if device.type != "cpu" else "the CPU has no GPU telemetry")
    rocm = bool(getattr(torch.version, "hip", None))
    try:
        clock = float(torch.cuda.clock_rate(device))
        power = float(torch.cuda.power_draw(device))
        temperature = float(torch.cuda.temperature(device))
    except Exception as exc:  # noqa: BLE001 - pynvml missing, no driver, NVML errors
        why = f"torch.cuda.clock_rate failed ({type(exc).__name__}: {exc})"
    else:
        if rocm:  # amdsmi answers in watts, and 0 where it has no clock or power reading
            unread = [name for name, v in (("clock", clock), ("power draw", power)) if not v]
            return Telemetry(clock or None, power or None, temperature, "amdsmi",
                             f"amdsmi reports no {' or '.join(unread)}" if unread else None)
        return Telemetry(clock, power / 1000, temperature, "pynvml")
    if rocm:
        return Telemetry(missing=why)
    smi = _nvidia_smi(device, run)
    if smi.source is None:
        return Telemetry(missing=f"{why}; {smi.missing}")
    return smi


@dataclass(frozen=True)
class MatmulRate:
    """One throughput figure of a matmul (chapter 3): the rate, the shape, how it was
    measured, and the telemetry read while its products ran.

    ``kind`` is ``"burst"`` (the median time of the fastest few products of a short burst
    started after an idle pause, at the best shape of a small search: clocks at boost) or
    ``"sustained"`` (every product of seconds of back-to-back work, total FLOPs over the
    synchronised wall time: clocks as power and heat let them stay).
    """

    kind: str
    mode: str
    device: str
    shape: tuple[int, int, int]
    tflops: float
    products: int
    seconds: float
    telemetry: Telemetry
    searched: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def describe(self) -> str:
        m, n, k = self.shape
        how = (f"median of the {BURST_FASTEST} fastest of {self.products} products"
               if self.kind == "burst" else
               f"{self.products} back-to-back products in {self.seconds:.1f} s")
        return f"{self.mode} {self.kind} at {m}x{k} @ {k}x{n}: {how}"


#: A burst's figure is the median time of its fastest products, this many of them (the MAMF
#: finder reports the mean of its best shape's products; the five fastest leave out the ones
#: still slowed by the clock's ramp from idle).
BURST_FASTEST = 5


def _operands(shape: Sequence[int], device: torch.device, mode: str
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n, k = shape
    dtype = MODES[mode][0]
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    return a, b, torch.empty(m, n, device=device, dtype=dtype)


def _check_rate_args(device: torch.device | str, mode: str) -> torch.device:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {sorted(MODES)}")
    device = _device(device)
    if device.type == "meta":
        raise ValueError("the meta device computes nothing, so there is nothing to time; "
                         "pass the device the product runs on")
    return device


def _timed_products(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, count: int,
                    device: torch.device, telemetry: Callable[[], Telemetry]
                    ) -> tuple[list[float], Telemetry]:
    """Seconds of each of ``count`` back-to-back products, and the telemetry read while they
    ran (on a CUDA GPU, whose events time each product, all are queued first and the reading
    is taken once half of them have finished: past the clock's ramp from idle, with products
    still running)."""
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        events[0].record(stream)
        for end in events[1:]:
            torch.matmul(a, b, out=out)
            end.record(stream)
        events[len(events) // 2].synchronize()
        reading = telemetry()
        busy = not events[-1].query()  # still running when the reading came back
        events[-1].synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(events, events[1:], strict=False)]
        return times, _with_busy(reading, busy)
    times = []
    for _ in range(count):
        tic = time.perf_counter()
        torch.matmul(a, b, out=out)
        _synchronize(device)
        times.append(time.perf_counter() - tic)
    return times, telemetry()


def _with_busy(reading: Telemetry, busy: bool) -> Telemetry:
    if reading.source is None:
        return reading
    return Telemetry(reading.sm_clock_mhz, reading.power_w, reading.temperature_c,
                     reading.source, reading.missing, busy)


def burst_rate(device: torch.device | str, mode: str = "fp32",
               shapes: Sequence[Sequence[int]] = BURST_SHAPES, *, products: int = 20,
               burst_seconds: float = 0.2, idle: float = 0.2,
               telemetry: Callable[[torch.device], Telemetry] = gpu_telemetry) -> MatmulRate:
    """The burst rate of ``(m, k) @ (k, n)`` products on ``device`` in ``mode``: the best of
    ``shapes`` (chapter 3).

    For each shape ``(m, n, k)``: three warm-up products, a pause of ``idle`` seconds (the GPU
    idles, so its power budget recovers and its clock returns to boost), then a burst of
    back-to-back products, each timed (CUDA events on a CUDA GPU): ``products`` of them, or
    fewer where they would take more than ``burst_seconds`` (at least ``BURST_FASTEST + 1``).
    The shape's rate uses the median of its ``BURST_FASTEST`` fastest products (the MAMF
    finder, which idles and bursts the same way over a far larger search, reports the mean of
    its best shape's); the telemetry is read halfway through the best shape's burst.
    """
    device = _check_rate_args(device, mode)
    shapes = [tuple(s) for s in shapes]
    if not shapes or any(len(s) != 3 for s in shapes):
        raise ValueError(f"shapes must be a non-empty list of (m, n, k), got {shapes!r}")
    for shape in shapes:
        _check_sizes(*shape)
    if isinstance(products, bool) or not isinstance(products, int) or products <= BURST_FASTEST:
        raise ValueError(f"products must be a whole number above {BURST_FASTEST}, got "
                         f"{products!r}")
    best: MatmulRate | None = None
    searched: dict[tuple[int, int, int], float] = {}
    with fp32_precision(MODES[mode][1]):
        for shape in shapes:
            a, b, out = _operands(shape, device, mode)
            for _ in range(2):
                torch.matmul(a, b, out=out)
            _synchronize(device)
            tic = time.perf_counter()
            torch.matmul(a, b, out=out)
            _synchronize(device)
            one = time.perf_counter() - tic
            count = max(BURST_FASTEST + 1, min(products, int(burst_seconds / max(one, 1e-9))))
            time.sleep(idle)
            times, reading = _timed_products(a, b, out, count, device,
                                             lambda: telemetry(device))
            seconds = statistics.median(sorted(times)[:BURST_FASTEST])
            m, n, k = shape
            rate = tflops(matmul_flops(m, k, n), seconds)
            searched[shape] = rate
            if best is None or rate > best.tflops:
                best = MatmulRate("burst", mode, str(device), shape, rate, count, seconds,
                                  reading)
            del a, b, out
    assert best is not None
    return MatmulRate(best.kind, mode, best.device, best.shape, best.tflops, best.products,
                      best.seconds, best.telemetry, searched)


def sustained_rate(device: torch.device | str, mode: str, shape: Sequence[int], *,
                   seconds: float = 3.0,
                   telemetry: Callable[[torch.device], Telemetry] = gpu_telemetry
                   ) -> MatmulRate:
    """The sustained rate of ``(m, k) @ (k, n)`` products on ``device`` in ``mode`` (chapter 3).

    Back-to-back products for at least ``seconds``: the GPU always has two more chunks of
    products (about 0.1 s each) queued while the host waits for the one before, so it never
    idles. The rate is every product's FLOPs over the synchronised wall time; the
    telemetry is read three quarters of the way through, while products still run.
    """
    device = _check_rate_args(device, mode)
    shape = tuple(shape)
    if len(shape) != 3:
        raise ValueError(f"shape must be (m, n, k), got {shape!r}")
    _check_sizes(*shape)
    if (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
            or not 0 < seconds < math.inf):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    m, n, k = shape
    with fp32_precision(MODES[mode][1]):
        a, b, out = _operands(shape, device, mode)
        torch.matmul(a, b, out=out)
        _synchronize(device)
        tic = time.perf_counter()
        torch.matmul(a, b, out=out)
        _synchronize(device)
        cuda = device.type == "cuda"
        # The CPU computes as it is called: one product per step, so a product slowed down by
        # other processes cannot stretch the run far past its seconds.
        chunk = 1 if device.type == "cpu" else max(
            1, int(0.1 / max(time.perf_counter() - tic, 1e-9)))
        stream = torch.cuda.current_stream(device) if cuda else None
        reading: Telemetry | None = None
        pending: list[Any] = []
        count = 0
        start = time.perf_counter()
        while True:
            for _ in range(chunk):
                torch.matmul(a, b, out=out)
            count += chunk
            if cuda:
                done = torch.cuda.Event()
                done.record(stream)
                pending.append(done)
                if len(pending) > 2:  # wait for the chunk two before: two stay queued
                    pending.pop(0).synchronize()
            else:
                _synchronize(device)
            elapsed = time.perf_counter() - start
            if reading is None and elapsed >= 0.75 * seconds:
                reading = telemetry(device)
                if cuda:
                    reading = _with_busy(reading, not pending[-1].query())
            if elapsed >= seconds:
                break
        _synchronize(device)
        wall = time.perf_counter() - start
        del a, b, out
    assert reading is not None
    return MatmulRate("sustained", mode, str(device), (m, n, k),
                      tflops(count * matmul_flops(m, k, n), wall), count, wall, reading)


_SWEEP_RATE = "{mode}_tflops_n"


def rates_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The committed burst and sustained figures of each GPU machine, one column per machine
    and format, next to the dense peak and the telemetry read beside each (chapter 3).

    ``docs`` is what :func:`helpers.results.load_results` returns. A file written before the
    benchmark measured bursts has no burst figure (its cells stay empty, never filled in) and
    no sustained run: its sustained-style figure is the size sweep's rate at its largest size
    (seconds of back-to-back products too), and the row ``sustained from`` says which it is.
    """
    import pandas as pd  # noqa: PLC0415 - only the chapter's tables need pandas

    from helpers import results, timing  # noqa: PLC0415

    gpus = [d for d in docs if d["machine"].get("gpu_count")]
    columns: dict[str, dict[str, Any]] = {}
    for label, doc in zip(results.machine_labels(gpus), gpus, strict=True):
        name = doc["machine"]["device_name"]
        figs = {f["name"]: f for f in doc["figures"]
                if f.get("workload") == "matmul" and f.get("device") != "cpu"}
        for mode in MODES:
            burst = figs.get(f"{mode}_burst_tflops")
            sustained = figs.get(f"{mode}_sustained_tflops")
            source = "sustained run"
            if sustained is None:
                sweep = {int(n[len(_SWEEP_RATE.format(mode=mode)):]): f for n, f in figs.items()
                         if n.startswith(_SWEEP_RATE.format(mode=mode))
                         and n[len(_SWEEP_RATE.format(mode=mode)):].isdigit()}
                if not sweep:
                    continue
                largest = max(sweep)
                sustained, source = sweep[largest], f"size sweep, n = {largest}"
            try:
                peak = timing.peak_tflops(name, mode)
            except ValueError:
                peak = None
            column: dict[str, Any] = {
                "burst TFLOP/s": burst["value"] if burst else None,
                "sustained TFLOP/s": sustained["value"], "sustained from": source,
                "dense peak TFLOP/s": peak,
                "burst share of peak": burst["value"] / peak if burst and peak else None,
                "sustained share of peak": sustained["value"] / peak if peak else None}
            for kind, fig in (("burst", burst), ("sustained", sustained)):
                cond = (fig or {}).get("conditions") or {}
                shape = cond.get("shape")
                column[f"{kind} shape"] = "x".join(map(str, shape)) if shape else None
                for key, unit in (("sm_clock_mhz", "SM clock MHz"), ("power_w", "power W"),
                                  ("temperature_c", "temperature C")):
                    column[f"{kind} {unit}"] = cond.get(key)
            columns[f"{label}, {mode}"] = column
    table = pd.DataFrame(columns, dtype=object)
    # Rows nothing was measured for go, except the two rates: an empty burst row says plainly
    # that a machine has no burst figure.
    keep = table.notna().any(axis=1) | table.index.isin(["burst TFLOP/s", "sustained TFLOP/s"])
    table = table[keep]
    table.columns.name = "machine, format"
    return table
