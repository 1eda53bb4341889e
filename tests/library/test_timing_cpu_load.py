"""CPU timings record how busy the host was (helpers.timing.cpu_load, Timing.oversubscribed):
a product timed while other work loads the CPU is slow without being noisy, and must not
decide anything (chapter 3's crossover)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.utils.benchmark as tbench

from helpers import timing
from helpers.timing import CpuLoad


@pytest.mark.parametrize(("load", "cores", "threads", "expected"), [
    (2.0, 2, 2, False),     # the timed work's own two threads on two cores
    (2.9, 2, 2, False),     # a little more (the notebook's kernel): within one core's margin
    (3.2, 2, 2, True),      # another process's thread waits for a core too
    (19.0, 16, 16, False),  # 16 cores: a margin of a quarter of them
    (21.0, 16, 16, True),
    (0.1, 2, 4, True),      # more threads than cores, however idle the machine
    (None, 2, 2, False),    # no load average (Windows): only the thread count can tell
    (None, 2, 3, True),
])
def test_oversubscription_compares_the_load_and_threads_with_the_cores(
        load, cores, threads, expected) -> None:
    assert CpuLoad(load, cores, threads).oversubscribed is expected


def test_cpu_load_reads_the_load_average_and_the_usable_cores(monkeypatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 3.0, 1.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    now = timing.cpu_load()
    assert now == CpuLoad(7.5, 2, torch.get_num_threads())
    assert str(now) == f"load 7.5 on 2 core(s), {torch.get_num_threads()} thread(s)"
    assert timing.cpu_load(threads=1).threads == 1

    def no_load_average():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_load_average)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert timing.cpu_load(threads=4) == CpuLoad(None, 8, 4)


def _steady_timer(monkeypatch) -> None:
    """Every measurement 8 ms, with no spread: slow but not noisy, as a product that waits
    for a core on every call."""
    spec = tbench.Timer(stmt="pass")._task_spec

    class SteadyTimer:
        def __init__(self, **kwargs):
            pass

        def blocked_autorange(self, min_run_time):
            return tbench.Measurement(1, [8e-3] * 5, spec)

        def timeit(self, number):
            return tbench.Measurement(number, [8e-3 * number], spec)

    monkeypatch.setattr(timing.tbench, "Timer", SteadyTimer)


def test_a_cpu_timing_on_a_loaded_machine_is_not_trusted(monkeypatch) -> None:
    _steady_timer(monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    loads = iter([(1.0, 1.0, 1.0), (9.0, 4.0, 2.0)])  # before, after
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    slow = timing.benchmark(lambda: None, warmup=0, num_threads=2)
    assert not slow.noisy, "every call waited alike: the spread shows nothing"
    assert slow.cpu == CpuLoad(9.0, 2, 2), "the busier reading of before and after"
    assert slow.oversubscribed and not slow.trusted
    assert slow.doubt == "CPU oversubscribed (load 9.0 on 2 core(s), 2 thread(s))"
    assert "oversubscribed" in str(slow) and slow.as_dict()["oversubscribed"]


def test_a_cpu_timing_on_a_quiet_machine_is_trusted(monkeypatch) -> None:
    _steady_timer(monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    quiet = timing.benchmark(lambda: None, warmup=0, num_threads=2)
    assert quiet.cpu == CpuLoad(1.5, 2, 2)
    assert quiet.trusted and quiet.doubt == "" and not quiet.oversubscribed
    assert "oversubscribed" not in str(quiet)


def test_a_noisy_timing_says_why_it_is_not_trusted() -> None:
    wide = timing.Timing("t", "cpu", 1.0, 0.3, 1.0, (0.8, 1.0, 1.1))
    assert wide.cpu is None and not wide.oversubscribed  # built without a load: an old caller
    assert not wide.trusted and wide.doubt == "IQR 30% of the median"
    both = timing.Timing("t", "cpu", 1.0, 0.3, 1.0, (0.8, 1.0, 1.1), cpu=CpuLoad(5.0, 2, 2))
    assert both.doubt == ("IQR 30% of the median; CPU oversubscribed "
                          "(load 5.0 on 2 core(s), 2 thread(s))")


@pytest.mark.parametrize("threads", [0, -2, 1.5, True, "2"])
def test_cpu_load_refuses_a_thread_count_that_is_not_a_positive_whole_number(threads) -> None:
    with pytest.raises(ValueError, match="threads must be None"):
        timing.cpu_load(threads)
