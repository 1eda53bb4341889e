"""Timing code on a device honestly, and turning times into FLOP/s.

Introduced in chapter 3 (Matrix multiply, CPU vs GPU), where the naive ``time.time()``
measurement is shown to be wrong on a GPU and replaced by :func:`benchmark`. Used again in
chapters 4, 5, 12 and by the book's benchmark command.
"""

from __future__ import annotations

import math
import numbers
import os
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.benchmark as tbench

__all__ = [
    "OVERSUBSCRIBED_MARGIN",
    "PEAK_TFLOPS",
    "MIN_RUNS_TO_COMPARE",
    "NO_DIFFERENCE",
    "CpuLoad",
    "Comparison",
    "PeakFigures",
    "Timing",
    "NOISY_SPREAD",
    "benchmark",
    "compare",
    "cpu_load",
    "device_clock",
    "matmul_flops",
    "peak_tflops",
    "share_of_peak",
    "synchronize",
    "tflops",
    "timed",
]


def _device(device: torch.device | str | int, what: str = "device") -> torch.device:
    """``device`` as a :class:`torch.device` of a kind this machine has, or an error that says
    which devices it does have (the wording of :func:`helpers.devices.resolve_device`)."""
    from helpers.devices import _type_available, _type_count, resolve_device

    if isinstance(device, torch.device) and device.type == "cpu":
        return device
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"{what} must be a device name such as 'cpu' or 'cuda:0', or a "
                        f"torch.device; got {device!r} ({type(device).__name__})")
    try:
        dev = torch.device(device)
    except RuntimeError:
        resolve_device(device)  # raises, naming the bad name and this machine's devices
        raise
    if dev.type == "meta":
        return dev
    count = _type_count(dev.type) if _type_available(dev.type) else 0
    # A count of 0 from an available backend means it cannot count (or a test stands in for
    # it): only an index beyond a known count is refused.
    if not _type_available(dev.type) or (dev.index is not None and 0 < count <= dev.index):
        resolve_device(device)  # raises: not on this machine
    return dev


def _synchronize(dev: torch.device | None) -> None:
    # No checks: this runs inside timed regions (the benchmark's clock). torch.accelerator
    # (torch 2.6 and later) waits for whichever accelerator this build drives (CUDA, ROCm,
    # mps, xpu) on the device named; the CPU has nothing queued to wait for.
    if dev is None:
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
    elif dev.type not in ("cpu", "meta"):
        torch.accelerator.synchronize(dev)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all work queued on ``device`` has finished (no-op on the CPU) (chapter 3).

    ``None`` means the current accelerator device (CUDA, mps, ...) where there is one; pass
    the device the work runs on.
    A device this machine does not have raises a ``ValueError`` listing the ones it has.
    """
    _synchronize(None if device is None else _device(device))


def device_clock(device: torch.device | str) -> Callable[[], float]:
    """A clock for :class:`torch.utils.benchmark.Timer` that waits for ``device`` first (chapter 3).

    The Timer's own clock synchronises only the *current* accelerator, so work on ``cuda:1``
    (or a CPU measurement on a machine with a GPU) needs a clock that names its device.
    """
    device = _device(device)
    if device.type in ("cpu", "meta"):
        return timeit.default_timer

    def clock() -> float:
        _synchronize(device)
        return timeit.default_timer()

    return clock


#: A spread (interquartile range) above this share of the median marks a timing as noisy; it is
#: the threshold at which torch.utils.benchmark's Measurement adds its own variance warning.
NOISY_SPREAD = 0.1


#: The host CPU counts as oversubscribed when its load average exceeds the cores this process
#: may use by more than this share of them (and by at least one): the timed work's own threads
#: are part of the load, so a machine busy with that work alone stays below the line.
OVERSUBSCRIBED_MARGIN = 0.25


@dataclass(frozen=True)
class CpuLoad:
    """How busy the host CPU was around a CPU timing (chapter 3).

    ``load`` is the 1-minute load average (threads running or waiting to run, the timed work's
    own included; None where the operating system keeps none, as on Windows), ``cores`` the
    cores this process may run on, ``threads`` the CPU threads the timed work used.

    The load average is an exponentially decaying average over about a minute, sampled every
    5 seconds: it shows other work that has run for tens of seconds (a second chapter or test
    run beside this one), not a burst during a timing of a fraction of a second (the spread,
    :attr:`Timing.noisy`, shows that), and it stays high for up to a minute after such work
    ends. Inside a container it counts the whole host's threads.
    """

    load: float | None
    cores: int
    threads: int

    @property
    def oversubscribed(self) -> bool:
        """True when more threads wanted the CPU than it has cores: the work used more threads
        than there are cores, or the load exceeded the cores by :data:`OVERSUBSCRIBED_MARGIN`
        of them (at least one). A timing taken then measures waiting for a core as well."""
        if self.threads > self.cores:
            return True
        margin = max(1.0, OVERSUBSCRIBED_MARGIN * self.cores)
        return self.load is not None and self.load > self.cores + margin

    def __str__(self) -> str:
        load = "no load average" if self.load is None else f"load {self.load:.1f}"
        return f"{load} on {self.cores} core(s), {self.threads} thread(s)"


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # Linux: the cores this process may run on
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def cpu_load(threads: int | None = None) -> CpuLoad:
    """The host CPU's load now, against the cores this process may use and the CPU threads
    the work uses (``threads``; by default ``torch.get_num_threads()``) (chapter 3)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(
            threads, numbers.Integral) or threads < 1):
        raise ValueError(f"threads must be None (this process's thread count) or a whole "
                         f"number >= 1, got {threads!r}")
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows keeps no load average
        load = None
    return CpuLoad(load, _usable_cores(), threads or torch.get_num_threads())


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
    #: For CPU timings, the host's load around the measurement (the busier of before and
    #: after); None for an accelerator's.
    cpu: CpuLoad | None = None

    @property
    def runs(self) -> int:
        """How many timed measurements the median is taken over."""
        return len(self.times)

    @property
    def relative_iqr(self) -> float:
        """The interquartile range as a share of the median."""
        return self.iqr / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """True when the spread exceeds :data:`NOISY_SPREAD` of the median: treat as rough."""
        return self.relative_iqr > NOISY_SPREAD

    @property
    def oversubscribed(self) -> bool:
        """True for a CPU timing taken while the CPU had more threads to run than cores: it
        may be slow without being noisy (every call waits for a core alike)."""
        return self.cpu is not None and self.cpu.oversubscribed

    @property
    def doubt(self) -> str:
        """Why the median should not decide anything ('' when there is no reason)."""
        reasons = []
        if self.noisy:
            reasons.append(f"IQR {self.relative_iqr:.0%} of the median")
        if self.oversubscribed:
            reasons.append(f"CPU oversubscribed ({self.cpu})")
        return "; ".join(reasons)

    @property
    def trusted(self) -> bool:
        """Neither noisy nor taken on an oversubscribed CPU: fit to decide a comparison."""
        return not self.doubt

    def __str__(self) -> str:
        text = (f"{self.label} on {self.device}: median {_fmt(self.median)}, "
                f"IQR {_fmt(self.iqr)} ({self.relative_iqr:.0%} of the median) "
                f"over {self.runs} measurements")
        if self.noisy:
            # no cause guessed: a busy machine is one, but chapter 11's launch-bound step
            # was as noisy on an H200 that ran nothing else
            text += "; noisy, so treat it as rough"
        if self.oversubscribed:
            text += f"; the CPU was oversubscribed ({self.cpu}), so it may be slow"
        return text

    def as_dict(self) -> dict[str, Any]:
        """Plain figures for a table or a result file."""
        return {
            "label": self.label,
            "device": self.device,
            "median_s": self.median,
            "iqr_s": self.iqr,
            "mean_s": self.mean,
            "runs": self.runs,
            "noisy": self.noisy,
            "oversubscribed": self.oversubscribed,
        }


# -- comparing two timings ---------------------------------------------------------------------

#: What a comparison whose spreads cannot support a verdict says instead of a factor.
NO_DIFFERENCE = "no measurable difference"

#: The fewest measurements a timing needs for a verdict, where its count is known (the
#: default ``min_runs`` of :func:`benchmark`).
MIN_RUNS_TO_COMPARE = 5


def _time_figure(name: str, value: object, *, spread: bool) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0 or (not spread and value == 0)):
        need = "a finite spread >= 0" if spread else "a positive finite time"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Comparison:
    """Two timings of the same work, ``base`` (the reference, such as the plain step) and
    ``other``, each a median and its spread (interquartile range) in one unit, and where
    known how many measurements each was taken over (made by :func:`compare`; chapters 4,
    10 and 12).

    A verdict needs three things: neither timing is noisy (its spread is at most
    :data:`NOISY_SPREAD` of its median); each rests on at least
    :data:`MIN_RUNS_TO_COMPARE` measurements, where the count is known; and the medians
    differ by more than the two spreads together (the ranges *median ± IQR* do not
    overlap). Otherwise :attr:`verdict` is :data:`NO_DIFFERENCE` and :meth:`describe`
    prints no factor.

    Why the whole spreads: of two timings of the *same* work (normal noise), with five
    measurements each, a gap beyond half the two spreads still appears about one time in
    four, beyond the two spreads about one time in twenty; with eight measurements, one in
    twelve against one in three hundred. A sample's interquartile range says little below
    five measurements (three: a gap beyond the spreads about one time in eight; two: one
    in three).
    """

    base: float
    base_iqr: float
    other: float
    other_iqr: float
    base_runs: int | None = None
    other_runs: int | None = None

    def __post_init__(self) -> None:
        for name in ("base", "other"):
            _time_figure(name, getattr(self, name), spread=False)
            _time_figure(f"{name}_iqr", getattr(self, f"{name}_iqr"), spread=True)
            runs = getattr(self, f"{name}_runs")
            if runs is not None and (isinstance(runs, bool)
                                     or not isinstance(runs, numbers.Integral) or runs < 1):
                raise ValueError(f"{name}_runs must be None (not known) or a whole number "
                                 f">= 1 of measurements, got {runs!r}")

    @property
    def speedup(self) -> float:
        """``base / other``: above 1 the other is faster. Quote it only where
        :attr:`measurable`."""
        return self.base / self.other

    @property
    def noisy(self) -> bool:
        """True when either timing's spread is above :data:`NOISY_SPREAD` of its median."""
        return (self.base_iqr > NOISY_SPREAD * self.base
                or self.other_iqr > NOISY_SPREAD * self.other)

    @property
    def too_few(self) -> bool:
        """True when a timing's known count of measurements is below
        :data:`MIN_RUNS_TO_COMPARE`."""
        return any(runs is not None and runs < MIN_RUNS_TO_COMPARE
                   for runs in (self.base_runs, self.other_runs))

    @property
    def resolution(self) -> float:
        """The smallest gap between the medians that gives a verdict: the two spreads
        together (a gap must be larger)."""
        return self.base_iqr + self.other_iqr

    @property
    def within_spread(self) -> bool:
        """True when the medians differ by no more than the two spreads together."""
        return abs(self.base - self.other) <= self.resolution

    @property
    def measurable(self) -> bool:
        """True when the timings support a verdict: neither noisy, enough measurements,
        the gap beyond the spreads."""
        return not self.noisy and not self.too_few and not self.within_spread

    @property
    def verdict(self) -> str:
        """``"faster"``, ``"slower"`` (the other against the base) or :data:`NO_DIFFERENCE`."""
        if not self.measurable:
            return NO_DIFFERENCE
        return "faster" if self.other < self.base else "slower"

    def describe(self, what: str, than: str = "the plain step") -> str:
        """One line: the factor where :attr:`measurable`, else why there is no verdict."""
        if self.noisy:
            why = f"a timing's spread is above {NOISY_SPREAD:.0%} of its median"
        elif self.too_few:
            why = f"a timing has fewer than {MIN_RUNS_TO_COMPARE} measurements"
        elif self.within_spread:
            why = "the gap is within the spreads"
        elif self.verdict == "faster":
            return f"{what}: {self.factor}x as fast as {than}"
        else:
            return f"{what}: {self.factor}x the speed of {than}, slower"
        return f"{what}: {NO_DIFFERENCE} from {than} ({why})"

    @property
    def factor(self) -> str:
        """:attr:`speedup` to 2 decimals, or as many more as it takes not to read 1.00 (a
        measured 0.9993x prints "0.999", never "1.00" beside "slower")."""
        digits = 2
        while f"{self.speedup:.{digits}f}" == f"{1:.{digits}f}" and digits < 9:
            digits += 1
        return f"{self.speedup:.{digits}f}"


def _median_iqr_runs(name: str, timing: object) -> tuple[float, float, int | None]:
    if isinstance(timing, Timing):
        return timing.median, timing.iqr, timing.runs
    if isinstance(timing, tuple) and len(timing) in (2, 3):
        return (*timing, None) if len(timing) == 2 else timing  # type: ignore[return-value]
    raise TypeError(f"{name} must be a helpers.timing.Timing, a (median, iqr) pair or a "
                    f"(median, iqr, measurements) triple, got {timing!r}")


def compare(base: object, other: object) -> Comparison:
    """Compare ``other`` with ``base`` (chapters 4, 10 and 12; the rule: :class:`Comparison`).

    Each is a :class:`Timing` (from :func:`benchmark`, which knows its count of
    measurements), a ``(median, iqr)`` pair or a ``(median, iqr, measurements)`` triple, in
    one unit. ``compare(plain, recipe).describe("channels_last")`` prints
    ``"channels_last: 1.16x as fast as the plain step"`` only where the timings support it,
    and ``"channels_last: no measurable difference from the plain step (...)"`` otherwise.
    """
    base_median, base_iqr, base_runs = _median_iqr_runs("base", base)
    other_median, other_iqr, other_runs = _median_iqr_runs("other", other)
    return Comparison(base_median, base_iqr, other_median, other_iqr, base_runs=base_runs,
                      other_runs=other_runs)


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def timed(fn: Callable[[], Any], device: torch.device | str) -> float:
    """Seconds one call of ``fn()`` takes, ``device`` synchronised before and after
    (chapter 5's "where the time goes").

    Queued device work from before the call is waited for first, so it is not counted, and
    the work the call queues is waited for at the end, so it is. One call, one reading: for
    short operations use :func:`benchmark`, which repeats and reports spread.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments to time, such as "
                        f"lambda: train_epoch(...), got {fn!r}")
    device = _device(device)
    synchronize(device)
    start = timeit.default_timer()
    fn()
    synchronize(device)
    return timeit.default_timer() - start


def _more_blocks(timer: Any, first: Any, count: int, threads: int) -> list[Any]:
    """``count`` more blocks of ``first.number_per_run`` calls, timed as ``blocked_autorange``
    times its blocks: back to back on the Timer's clock (the device's synchronising clock), with
    the Timer's thread count, no untimed calls between them. The public ``Timer.timeit`` runs
    ``max(number // 100, 2)`` untimed warm-up calls before each block, which triples a slow
    call's cost; ``Timer._timeit`` (one block, what ``blocked_autorange`` calls) is private, so a
    torch without it gets ``timeit``: the same measurements, only slower to take.
    """
    block = getattr(timer, "_timeit", None)
    set_threads = getattr(tbench, "set_torch_threads", None)
    if not (callable(block) and callable(set_threads)):
        return [timer.timeit(first.number_per_run) for _ in range(count)]
    with set_threads(threads):
        times = [float(block(first.number_per_run)) for _ in range(count)]
    return [tbench.Measurement(first.number_per_run, times, first.task_spec)]


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    device: torch.device | str = "cpu",
    label: str | None = None,
    warmup: int = 3,
    min_run_time: float = 1.0,
    min_runs: int = 5,
    num_threads: int | None = None,
    **kwargs: Any,
) -> Timing:
    """Time ``fn(*args, **kwargs)`` on ``device`` the right way (chapter 3).

    Warms up first (so one-off costs such as CUDA initialisation and cuBLAS heuristics are
    not counted), then lets :class:`torch.utils.benchmark.Timer` repeat the call until
    ``min_run_time`` seconds have been spent and at least ``min_runs`` measurements exist,
    synchronising ``device`` (not merely the current GPU) before every clock reading.
    Returns the median and interquartile range per call; :attr:`Timing.noisy` says when the
    spread is too large to trust the median closely. A CPU timing also records the host's load
    (:func:`cpu_load`, the busier of before and after), and :attr:`Timing.oversubscribed` says
    when more threads wanted the CPU than it has cores: then every call may wait for a core
    alike, a slow median with a small spread. :attr:`Timing.trusted` is neither.
    """
    if not callable(fn):
        raise TypeError(f"fn must be the function to time, got {fn!r}; pass the function "
                        "itself and its arguments separately: benchmark(torch.matmul, a, b)")
    for name, value, low in (("warmup", warmup, 0), ("min_runs", min_runs, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    if (isinstance(min_run_time, bool) or not isinstance(min_run_time, numbers.Real)
            or not 0 < min_run_time < math.inf):
        raise ValueError(f"min_run_time must be a positive number of seconds, got "
                         f"{min_run_time!r}")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(
            num_threads, numbers.Integral) or num_threads < 1):
        raise ValueError(f"num_threads must be None (this process's thread count) or a whole "
                         f"number >= 1, got {num_threads!r}")
    device = _device(device)
    if device.type == "meta":
        raise ValueError("the meta device computes nothing, so there is nothing to time; "
                         "pass the device the work runs on")
    for _ in range(warmup):
        fn(*args, **kwargs)
    _synchronize(device)

    def call() -> None:
        fn(*args, **kwargs)

    name = label or getattr(fn, "__name__", "call")
    threads = num_threads or torch.get_num_threads()
    before = cpu_load(threads) if device.type == "cpu" else None
    timer = tbench.Timer(
        stmt="call()",
        globals={"call": call},
        label=name,
        num_threads=threads,
        timer=device_clock(device),
    )
    first = timer.blocked_autorange(min_run_time=min_run_time)
    per_run = first.number_per_run
    measurements = [first]
    if len(first.times) < min_runs:  # a slow call fits few runs in min_run_time
        measurements += _more_blocks(timer, first, min_runs - len(first.times), threads)
    # torch's own statistics (its quantiles, the ones its noise warning uses) over every run.
    measurement = tbench.Measurement.merge(measurements)[0]
    host = None
    if before is not None:  # a CPU timing: keep the busier reading of before and after
        after = cpu_load(threads)
        loads = [x.load for x in (before, after) if x.load is not None]
        host = CpuLoad(max(loads) if loads else None, after.cores, threads)
    return Timing(
        label=name,
        device=str(device),
        median=float(measurement.median),
        iqr=float(measurement.iqr),
        mean=float(measurement.mean),
        times=tuple(float(t) for t in measurement.times),
        number_per_run=int(per_run),
        cpu=host,
    )


def matmul_flops(m: int, k: int, n: int) -> int:
    """Floating-point operations of an ``(m, k) @ (k, n)`` product: ``2*m*k*n`` (chapter 3)."""
    _check_sizes(m, k, n)
    return 2 * int(m) * int(k) * int(n)


def _check_sizes(*sizes: Any) -> None:
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size <= 0:
            raise ValueError(f"matrix sizes must be positive whole numbers, got {sizes!r}; "
                             "pass (m, k, n) of an (m, k) @ (k, n) product")


def _check_number(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
            value) or value < 0 or (positive and value == 0):
        need = "positive" if positive else "non-negative"
        raise ValueError(f"{name} must be a {need} finite number, got {value!r}")
    return float(value)


def tflops(flops: float, seconds: float) -> float:
    """Throughput in TFLOP/s (10**12 floating-point operations per second) (chapter 3)."""
    flops = _check_number("flops", flops, positive=False)
    seconds = _check_number("seconds", seconds, positive=True)
    return flops / seconds / 1e12


@dataclass(frozen=True)
class PeakFigures:
    """Vendor-quoted dense peak throughput of one GPU model, in TFLOP/s (chapter 3).

    ``name`` is the GPU's name as ``torch.cuda.get_device_name()`` prints it.
    """

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


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H100_WP = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_V100 = ("https://images.nvidia.com/content/technologies/volta/pdf/"
         "volta-v100-datasheet-update-us-1165301-r5.pdf")
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"


def _peaks(*figures: PeakFigures) -> dict[str, PeakFigures]:
    return {f.name: f for f in figures}


# Dense (no structured sparsity) figures. Datasheets mark their tensor-core figures "with
# sparsity" (an asterisk), twice the dense rate; those are halved here and the source says so.
# The keys are the names exactly as torch.cuda.get_device_name() prints them: one GPU family
# ships under several names with different peaks (an H100 NVL is not an H100 SXM, an L40 is not
# an L4), so matching parts of names would hand a GPU another one's figures. A GPU whose maker
# publishes no datasheet (the A10G, built for AWS) is deliberately absent. The V100 (compute
# capability 7.0) runs only PyTorch builds for CUDA 12 and older: the CUDA 13 builds start at 7.5.
PEAK_TFLOPS: dict[str, PeakFigures] = _peaks(
    # Volta has no TF32 and no bf16; 125 and 112 are its fp16 tensor-core rates.
    *(PeakFigures(name, 15.7, None, None, 125.0, _V100)
      for name in ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB")),
    *(PeakFigures(name, 14.0, None, None, 112.0, _V100)
      for name in ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB")),
    # Turing (7.5) has no TF32 and no bf16; 65 is the fp16 tensor-core rate, fp32 accumulate.
    PeakFigures("Tesla T4", 8.1, None, None, 65.0,
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
                "t4-tensor-core-datasheet-951643.pdf"),
    PeakFigures("NVIDIA A10", 31.2, 62.5, 125.0, 125.0,
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/"
                "a10-datasheet.pdf (sparse figures halved)"),
    # The A100 datasheet quotes one set of peaks for the 40 GB and 80 GB, SXM and PCIe boards.
    *(PeakFigures(name, 19.5, 156.0, 312.0, 312.0, f"{_A100} (sparse figures halved)")
      for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
                   "NVIDIA A100 80GB PCIe")),
    PeakFigures("NVIDIA L4", 30.3, 60.0, 121.0, 121.0,
                "https://www.nvidia.com/en-us/data-center/l4/ (sparse figures halved)"),
    PeakFigures("NVIDIA L40", 90.5, 90.5, 181.0, 181.0,
                "https://www.nvidia.com/en-us/data-center/l40/ (sparse figures halved)"),
    PeakFigures("NVIDIA L40S", 91.6, 183.0, 362.0, 362.0,
                "https://www.nvidia.com/en-us/data-center/l40s/ (sparse figures halved)"),
    # The GeForce rates with fp32 accumulation, the kind PyTorch's matmuls use.
    PeakFigures("NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2,
                f"{_ADA} (appendix A, dense figures)"),
    # The Hopper whitepaper prints dense figures for the SXM5 and PCIe boards.
    PeakFigures("NVIDIA H100 80GB HBM3", 67.0, 494.7, 989.4, 989.4,
                f"{_H100_WP} (H100 SXM5, dense figures)"),
    PeakFigures("NVIDIA H100 PCIe", 51.2, 378.0, 756.0, 756.0,
                f"{_H100_WP} (H100 PCIe, dense figures)"),
    PeakFigures("NVIDIA H100 NVL", 60.0, 417.5, 835.5, 835.5,
                f"{_H100} (H100 NVL, sparse figures halved)"),
    PeakFigures("NVIDIA H200", 67.0, 494.5, 989.5, 989.5,
                f"{_H200} (H200 SXM, sparse figures halved)"),
    PeakFigures("NVIDIA H200 NVL", 60.0, 417.5, 835.5, 835.5,
                f"{_H200} (H200 NVL, sparse figures halved)"),
)


def peak_tflops(device_name: str, dtype: str = "fp32") -> float | None:
    """Dense peak TFLOP/s for a GPU named as ``torch.cuda.get_device_name()`` prints it, such
    as ``'NVIDIA H100 80GB HBM3'`` (chapter 3).

    Returns ``None`` when the GPU is not in :data:`PEAK_TFLOPS` (names must match exactly, up
    to case and surrounding spaces) or has no such number format.
    """
    if dtype not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"unknown dtype key {dtype!r}; use fp32, tf32, bf16 or fp16")
    if isinstance(device_name, torch.device):
        raise TypeError(f"got the device {device_name}, not its name; pass "
                        f"torch.cuda.get_device_name({str(device_name)!r})")
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a GPU's name as torch.cuda.get_device_name() "
                        f"prints it, such as 'Tesla T4'; got {device_name!r}")
    wanted = device_name.strip().casefold()
    for name, figures in PEAK_TFLOPS.items():
        if name.casefold() == wanted:
            return figures.for_dtype(dtype)
    return None


def share_of_peak(achieved_tflops: float, device_name: str, dtype: str = "fp32") -> float | None:
    """Achieved throughput as a fraction of the device's dense peak, or None if unknown (chapter 3)."""
    achieved_tflops = _check_number("achieved_tflops", achieved_tflops, positive=False)
    peak = peak_tflops(device_name, dtype)
    return None if peak is None else achieved_tflops / peak
