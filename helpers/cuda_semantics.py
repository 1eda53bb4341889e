"""CUDA behaviours chapter 11 demonstrates: late errors and copy/compute overlap (chapter 11),
and the sync-debug mode chapters 4, 5 and 11 use to find the calls that wait for the GPU.

- :func:`async_error_report` runs a script with a bad class index in a fresh process and
  reports where the error surfaced: on a CUDA GPU, lines after the faulty call (the kernel's
  device-side assert fires while Python has moved on), unless ``CUDA_LAUNCH_BLOCKING=1``;
  :func:`async_error_reports` runs it both ways at once.
- :func:`event_ms` times GPU work between two CUDA events on a device's current stream.
- :func:`sync_debug` runs a block under ``torch.cuda.set_sync_debug_mode`` and lists the
  synchronising calls torch reported (chapter 4).
- :func:`copy_compute_overlap` measures a pinned host-to-device copy and matrix products on one
  stream, then with the copy on a second stream: medians and spreads of interleaved rounds,
  so that :meth:`Overlap.describe` quotes the share saved only where
  :func:`helpers.timing.compare` measures a difference.
- :func:`ranges_verdict` and :func:`describe_ranges` say which of two timings is faster where
  their ranges (median ± IQR) are apart, even when one is too noisy for a factor (the CUDA
  graph's replay against a launch-bound eager step).

The book's benchmark (``bench/cuda_semantics.py``) records the same measurements.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from helpers.devices import resolve_device
from helpers.timing import NO_DIFFERENCE, NOISY_SPREAD, Comparison, Timing, compare, synchronize

__all__ = ["ASYNC_ERROR_SCRIPT", "AsyncErrorReport", "OVERLAP_ROUNDS", "Overlap",
           "async_error_report", "async_error_reports",
           "SYNC_MESSAGE", "copy_compute_overlap", "describe_ranges", "event_ms",
           "ranges_verdict", "sync_debug"]

#: A script whose cross-entropy gets a target class that does not exist (10 of classes 0-9).
#: On a CUDA GPU the kernel's device-side assert fires while Python has already moved on; on
#: the CPU the same call raises ``IndexError: Target 10 is out of bounds.`` at once.
ASYNC_ERROR_SCRIPT = """\
import sys
import torch

device = torch.device(sys.argv[1])
logits = torch.randn(64, 10, device=device)
target = torch.full((64,), 10, device=device)  # classes 0..9: 10 is no class
if device.type == "cuda":
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # queued work: the faulty kernel starts late
        torch.mm(busy, busy)
loss = torch.nn.functional.cross_entropy(logits, target)  # the faulty call
print("the faulty call returned", flush=True)
print("loss:", loss.item())  # the first call that waits for the GPU
"""


@dataclass(frozen=True)
class AsyncErrorReport:
    """Where :data:`ASYNC_ERROR_SCRIPT` failed (chapter 11): the faulty call's line, the line
    Python's traceback blames, the error's first line, and what the script printed before."""

    faulty_line: int
    reported_line: int
    error: str
    printed: str

    @property
    def lines_late(self) -> int:
        """How many lines after the faulty call the error surfaced (0: at the call itself)."""
        return self.reported_line - self.faulty_line


def async_error_report(device: torch.device | str, *, launch_blocking: bool = False,
                       timeout: float = 300) -> AsyncErrorReport:
    """Run :data:`ASYNC_ERROR_SCRIPT` on ``device`` in a fresh process and report where it failed
    (chapter 11).

    A separate process, because a device-side assert leaves the CUDA context unusable for the
    rest of the process. ``launch_blocking`` sets ``CUDA_LAUNCH_BLOCKING=1``, which makes every
    kernel launch wait for the kernel, so the error is raised at the faulty call.
    """
    if not isinstance(launch_blocking, bool):
        raise TypeError(f"launch_blocking must be True or False, got {launch_blocking!r}")
    return _run_faulty_script(device, (launch_blocking,), timeout)[0]


def async_error_reports(device: torch.device | str, *,
                        timeout: float = 300) -> tuple[AsyncErrorReport, AsyncErrorReport]:
    """:func:`async_error_report` without and with ``CUDA_LAUNCH_BLOCKING=1``, the two fresh
    processes run side by side, so the pair costs one process's start-up (chapter 11).

    Returns ``(late, blocking)``. The processes share the device; that only delays their
    kernels, and where each error surfaces does not depend on when a kernel runs: without
    ``CUDA_LAUNCH_BLOCKING`` the faulty kernel waits behind the script's own queued work,
    with it every launch waits for its kernel. ``timeout`` bounds the pair together.

    On a CUDA GPU a report whose error is not the device-side assert is taken again with its
    process alone (within a new ``timeout``): a GPU in exclusive-process compute mode gives
    the second process no context ("busy or unavailable"), and under MPS one client's fatal
    fault can reach the other's.
    """
    reports = _run_faulty_script(device, (False, True), timeout)
    if resolve_device(device).type == "cuda":
        reports = [report if "device-side assert" in report.error
                   else _run_faulty_script(device, (blocking,), timeout)[0]
                   for report, blocking in zip(reports, (False, True), strict=True)]
    late, blocking = reports
    return late, blocking


def _run_faulty_script(device: torch.device | str, launch_blocking: tuple[bool, ...],
                       timeout: float) -> list[AsyncErrorReport]:
    """Start one process of :data:`ASYNC_ERROR_SCRIPT` per entry of ``launch_blocking``, all
    at once, wait for them within ``timeout`` seconds in all, and read each one's failure."""
    if (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    device = resolve_device(device)
    if device.type == "meta":
        raise ValueError("the meta device runs no kernels; pass 'cpu' or a CUDA device")
    faulty = next(i for i, line in enumerate(ASYNC_ERROR_SCRIPT.splitlines(), start=1)
                  if line.endswith("# the faulty call"))
    base_env = {k: v for k, v in os.environ.items() if k != "CUDA_LAUNCH_BLOCKING"}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "faulty_target.py")
        with open(script, "w") as fh:
            fh.write(ASYNC_ERROR_SCRIPT)
        deadline = time.monotonic() + timeout
        procs: list[subprocess.Popen] = []
        outputs: list[tuple[int, str, str]] = []
        try:
            for blocking in launch_blocking:
                env = dict(base_env, CUDA_LAUNCH_BLOCKING="1") if blocking else base_env
                procs.append(subprocess.Popen(
                    [sys.executable, script, str(device)], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, env=env))
            for proc in procs:
                stdout, stderr = proc.communicate(
                    timeout=max(deadline - time.monotonic(), 0))
                outputs.append((proc.returncode, stdout, stderr))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the faulty script did not finish on {device} within "
                               f"timeout={timeout} s; pass a larger timeout") from None
        finally:  # none outlives the call: on a timeout, an error or an interrupt
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    return [_read_failure(script, faulty, device, *output) for output in outputs]


def _read_failure(script: str, faulty: int, device: torch.device, returncode: int,
                  stdout: str, stderr: str) -> AsyncErrorReport:
    if returncode == 0:
        raise RuntimeError(f"the faulty script ran to the end on {device}; expected an error. "
                           f"It printed:\n{stdout}")
    lines = [int(n) for n in re.findall(rf'File "{re.escape(script)}", line (\d+)', stderr)]
    errors = [line for line in stderr.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
    if not lines or not errors:
        raise RuntimeError(f"could not find the failing line in the script's error output:\n"
                           f"{stderr[-3000:]}")
    return AsyncErrorReport(faulty_line=faulty, reported_line=lines[-1], error=errors[-1],
                            printed=stdout)


def _cuda(device: torch.device | str, what: str = "CUDA events and streams need") -> torch.device:
    # Checked by type first, so that "cpu" and "meta" get this message, not resolve_device's.
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None  # resolve_device names what is wrong with the spelling
    if kind is not None and kind != "cuda":
        raise ValueError(f"{what} a CUDA device, got {device!r}; "
                         "pass 'cuda' (or 'cuda:1', ...) where torch.cuda.is_available() is True")
    return resolve_device(device)  # "cuda" without a GPU, or "cuda:5" on one GPU: clear error


#: What torch says (warning in mode "warn", RuntimeError in mode "error") at a call that waits
#: for the GPU: ``warn_or_error_on_sync`` in c10/cuda/CUDAFunctions.cpp, torch 2.9 to 2.14.
SYNC_MESSAGE = "called a synchronizing CUDA operation"
# torch's once-per-process notice at the first set_sync_debug_mode call (a TORCH_WARN_ONCE in
# torch/csrc/cuda/Module.cpp, 2.9 to 2.14): a notice about the feature, not a synchronisation.
_PROTOTYPE_NOTICE = "Synchronization debug mode is a prototype feature"


@contextmanager
def sync_debug(device: torch.device | str, mode: str = "warn") -> Iterator[list[str]]:
    """Run the ``with`` block under ``torch.cuda.set_sync_debug_mode(mode)`` (chapter 4).

    Yields a list that, when the block ends, holds the message of every synchronising call
    torch reported in it (mode ``"warn"``); in mode ``"error"`` such a call raises
    ``RuntimeError`` inside the block instead. The mode is process-wide: the one in force
    before is restored on the way out, whatever happens. torch's one-time "prototype feature"
    notice is dropped (it reports no call); any other warning of the block is passed on when
    the block ends. Not thread-safe: the mode and the record of warnings are process-wide, so
    a synchronising call or a warning of another thread during the block counts too.
    ``device`` must be a CUDA device: the mode exists for CUDA only.
    """
    _cuda(device, "sync-debug mode needs")
    if mode not in ("warn", "error"):
        raise ValueError(f"mode must be 'warn' (list the synchronising calls) or 'error' "
                         f"(raise at the first one), got {mode!r}")
    found: list[str] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(mode)
            try:
                yield found
            finally:
                torch.cuda.set_sync_debug_mode(previous)
    finally:  # sorted outside the recording, so that what is passed on reaches the caller
        for w in caught:
            text = str(w.message)
            if text.startswith(SYNC_MESSAGE):
                found.append(text)
            elif not text.startswith(_PROTOTYPE_NOTICE):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def event_ms(fn: Callable[[], object], device: torch.device | str) -> float:
    """GPU milliseconds of ``fn()``, between two CUDA events on ``device``'s current stream
    (chapter 11). Waits for ``device`` before starting, and for the end event after."""
    if not callable(fn):
        raise TypeError(f"event_ms needs a function to call, got {fn!r}; "
                        "wrap the work in a lambda: event_ms(lambda: a @ a, device)")
    device = _cuda(device)
    stream = torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    synchronize(device)
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


#: How many interleaved rounds :func:`copy_compute_overlap` times by default: enough for a
#: median and an interquartile range that :func:`helpers.timing.compare` accepts (at least
#: :data:`helpers.timing.MIN_RUNS_TO_COMPARE`), about a quarter of a second on an H200.
OVERLAP_ROUNDS = 10


def _event_timing(label: str, device: torch.device | str, times_ms: list[float]) -> Timing:
    """A :class:`helpers.timing.Timing` (seconds) of GPU milliseconds measured one call each,
    with torch.utils.benchmark's statistics (its quantiles: median, interquartile range)."""
    seconds = torch.tensor(times_ms, dtype=torch.float64) / 1e3
    q25, median, q75 = (float(seconds.quantile(q)) for q in (0.25, 0.5, 0.75))
    return Timing(label, str(device), median, q75 - q25, float(seconds.mean()),
                  tuple(float(t) for t in seconds))


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int,
                 time_ms: Callable[[Callable[[], object]], float],
                 device: torch.device | str) -> dict[str, Timing]:
    """Time each of ``fns`` once per round, round after round, with ``time_ms`` (GPU
    milliseconds of one call), after one untimed call each (the caching allocator's first
    blocks of a stream, cuBLAS's heuristics): a slow stretch of the machine (clocks, another
    process) falls on every function alike instead of on one."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_ms(fn))
    return {name: _event_timing(name, device, ms) for name, ms in times.items()}


@dataclass(frozen=True)
class Overlap:
    """What :func:`copy_compute_overlap` measured (chapter 11): four
    :class:`helpers.timing.Timing` (seconds: median, IQR, each round's time) of the copy
    alone, the products alone, both on one stream (``serial``) and with the copy on a second
    stream (``overlapped``)."""

    mib: int
    products: int
    copy: Timing
    compute: Timing
    serial: Timing
    overlapped: Timing

    def __post_init__(self) -> None:
        for name in ("copy", "compute", "serial", "overlapped"):
            value = getattr(self, name)
            if not isinstance(value, Timing):
                raise TypeError(f"Overlap.{name} must be a helpers.timing.Timing, got "
                                f"{value!r}")
            if not (math.isfinite(value.median) and value.median > 0):
                raise ValueError(f"Overlap.{name} must have a positive median time, got "
                                 f"{value.median!r}")

    @property
    def serial_ms(self) -> float:
        """Copy, then products, on one stream: median GPU milliseconds."""
        return self.serial.median * 1e3

    @property
    def overlapped_ms(self) -> float:
        """The copy on a second stream: median GPU milliseconds."""
        return self.overlapped.median * 1e3

    @property
    def timings(self) -> tuple[Timing, Timing, Timing, Timing]:
        """The four timings, in the order measured: copy, products, serial, overlapped."""
        return self.copy, self.compute, self.serial, self.overlapped

    @property
    def saved(self) -> float:
        """Share of the serial time the second stream saved (medians). Quote it only where
        :attr:`comparison` is measurable."""
        return 1 - self.overlapped.median / self.serial.median

    @property
    def comparison(self) -> Comparison:
        """:func:`helpers.timing.compare` of the serial timing (base) and the overlapped one."""
        return compare(self.serial, self.overlapped)

    def describe(self) -> str:
        """One line: the share of the serial time the second stream saved, where
        :attr:`comparison` finds the overlapped run faster; otherwise compare()'s own answer
        (no measurable difference and why, or slower), with no share."""
        comparison = self.comparison
        if comparison.verdict == "faster":
            return (f"the second stream saved {self.saved:.0%} of the serial time "
                    f"(medians of {min(self.serial.runs, self.overlapped.runs)} rounds)")
        return comparison.describe("the copy on a second stream",
                                   "the copy, then the products, on one stream")


def copy_compute_overlap(device: torch.device | str, *, mib: int = 256, size: int = 4096,
                         repeats: int = OVERLAP_ROUNDS) -> Overlap:
    """Copy ``mib`` MiB from pinned host memory to ``device`` while it multiplies ``size x size``
    matrices: first on one stream, then with the copy on a second stream (chapter 11).

    The number of products is chosen so that they take about as long as the copy, so a full
    overlap takes about half of the serial time. Each of the four (copy, products, both on
    one stream, the copy on a second stream) is timed with CUDA events once per round, in
    ``repeats`` interleaved rounds, after one untimed call each; :class:`Overlap` holds
    their medians and spreads. Everything runs inside ``torch.cuda.device(device)``; the
    overlapped copy follows the two stream rules: the copy stream waits for earlier work, and
    the main stream waits for the copy before its result is used (``record_stream`` tells the
    allocator).
    """
    mib, size, repeats = (_positive_int(name, value) for name, value in
                          (("mib", mib), ("size", size), ("repeats", repeats)))
    device = _cuda(device)
    with torch.cuda.device(device):
        host = torch.randn(mib * 2**18, pin_memory=True)  # float32: 4 bytes each
        m = torch.randn(size, size, device=device)
        copy_stream = torch.cuda.Stream(device=device)

        def copy_only() -> None:
            host.to(device, non_blocking=True)

        def product() -> None:
            m @ m

        def time_ms(fn: Callable[[], object]) -> float:
            return event_ms(fn, device)

        sizing = _interleaved({"copy": copy_only, "product": product}, 3, time_ms, device)
        reps = max(1, round(sizing["copy"].median / sizing["product"].median))

        def compute() -> None:
            for _ in range(reps):
                m @ m

        def serial() -> None:
            copy_only()
            compute()

        def overlapped() -> None:
            main = torch.cuda.current_stream(device)
            copy_stream.wait_stream(main)  # the copy may not start before earlier work
            with torch.cuda.stream(copy_stream):
                on_device = host.to(device, non_blocking=True)
            compute()  # on main, while the copy runs on copy_stream
            main.wait_stream(copy_stream)  # before anyone uses on_device
            on_device.record_stream(main)

        timed = _interleaved({"copy": copy_only, "compute": compute, "serial": serial,
                              "overlapped": overlapped}, repeats, time_ms, device)
        labels = {"copy": f"copy {mib} MiB (pinned)",
                  "compute": f"{reps} products, {size} x {size}",
                  "serial": "copy, then products, one stream",
                  "overlapped": "copy on a second stream"}
        return Overlap(mib, reps, **{name: replace(timing, label=labels[name])
                                     for name, timing in timed.items()})


def _comparison(comparison: object) -> Comparison:
    if not isinstance(comparison, Comparison):
        raise TypeError(f"comparison must be a helpers.timing.Comparison (from compare(base, "
                        f"other)), got {comparison!r}")
    return comparison


def ranges_verdict(comparison: Comparison) -> str:
    """``"faster"`` or ``"slower"`` (the other timing against the base) where their ranges
    *median ± IQR* are apart and each rests on enough measurements, else
    :data:`helpers.timing.NO_DIFFERENCE` (chapter 11).

    :attr:`helpers.timing.Comparison.verdict` asks one thing more: that neither timing be
    noisy (its spread above :data:`helpers.timing.NOISY_SPREAD` of its median), since a
    noisy median makes a rough factor. Which of the two is faster needs no factor. An eager
    training step bound by its kernel launches waits on the host, whose hiccups can spread
    its timing past that line while its whole range lies far above a graph replay's (the
    H200 run: 1.768 ms, IQR 0.275 ms, against 0.3077 ms, IQR 0.00003 ms).
    """
    comparison = _comparison(comparison)
    if comparison.too_few or comparison.within_spread:
        return NO_DIFFERENCE
    return "faster" if comparison.other < comparison.base else "slower"


def describe_ranges(comparison: Comparison, what: str, than: str) -> str:
    """One line: :meth:`helpers.timing.Comparison.describe` wherever it quotes a factor or
    finds no difference; where only a noisy timing keeps it from a factor and the ranges
    are apart, :func:`ranges_verdict`'s order, without a factor (chapter 11)."""
    comparison = _comparison(comparison)
    verdict = ranges_verdict(comparison)
    if comparison.measurable or verdict == NO_DIFFERENCE:
        return comparison.describe(what, than)
    return (f"{what}: {verdict} than {than}, the ranges (median ± IQR) apart; no factor, "
            f"as a timing's spread is above {NOISY_SPREAD:.0%} of its median")
