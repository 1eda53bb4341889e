"""helpers.matmul.crossover: where one series of chapter 3's sweep beats another for good,
decided by trusted timings only."""

from __future__ import annotations

import pandas as pd
import pytest

from helpers.matmul import crossover
from helpers.timing import CpuLoad, Timing


def _sweep(slow: dict[int, float], fast: dict[int, float]) -> pd.DataFrame:
    rows = [{"size": s, "series": "cpu fp32", "seconds": t} for s, t in slow.items()]
    rows += [{"size": s, "series": "cuda fp32", "seconds": t} for s, t in fast.items()]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("slow", "fast", "expected"), [
    ({64: 1, 128: 2, 256: 8}, {64: 2, 128: 1, 256: 1}, 128),      # wins from 128 on
    ({64: 1, 128: 2, 256: 8}, {64: 0.5, 128: 3, 256: 1}, 256),    # a win at 64 does not count
    ({64: 1, 128: 2, 256: 8}, {64: 2, 128: 3, 256: 9}, None),     # never wins at the top
    ({64: 1, 128: 2, 256: 8}, {64: 0.1, 128: 0.1, 256: 0.1}, 64),  # wins everywhere
    ({64: 1, 128: 2, 256: 8, 512: 30}, {128: 1, 256: 1}, 128),    # only common sizes count
])
def test_crossover(slow, fast, expected) -> None:
    assert crossover(_sweep(slow, fast), "cpu fp32", "cuda fp32") == expected


def test_a_series_that_is_not_there_is_named() -> None:
    with pytest.raises(ValueError, match=r"'mps fp32'.*cpu fp32"):
        crossover(_sweep({64: 1}, {64: 2}), "cpu fp32", "mps fp32")


def test_a_table_without_the_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="seconds"):
        crossover(pd.DataFrame({"size": [64], "series": ["cpu fp32"]}), "cpu fp32", "x")
    with pytest.raises(ValueError, match="missing"):
        crossover([1, 2], "cpu fp32", "x")


def _timed(seconds: float, load: float | None = 1.0, spread: float = 0.0) -> Timing:
    """A faked CPU measurement: median ``seconds``, IQR ``spread`` of it, on 2 cores."""
    times = (seconds * (1 - spread / 2), seconds, seconds * (1 + spread / 2))
    return Timing("faked", "cpu", seconds, seconds * spread, seconds, times,
                  cpu=CpuLoad(load, 2, 2))


def _trusted_sweep(cpu: dict[int, Timing], gpu: dict[int, float]) -> pd.DataFrame:
    rows = [{"size": s, "series": "cpu fp32", "seconds": t.median, "trusted": t.trusted,
             "doubt": t.doubt} for s, t in cpu.items()]
    rows += [{"size": s, "series": "cuda fp32", "seconds": t, "trusted": True, "doubt": ""}
             for s, t in gpu.items()]
    return pd.DataFrame(rows)


GPU = {64: 2.0e-5, 128: 2.5e-5, 256: 3e-5, 512: 1e-4}


@pytest.mark.parametrize("doubtful", [
    _timed(8e-3, load=9.0),             # an oversubscribed CPU: slow, with no spread at all
    _timed(8e-3, load=1.0, spread=0.5),  # a noisy one
])
def test_a_doubtful_cpu_point_does_not_move_the_crossover(doubtful) -> None:
    # The CPU's 128 x 128 product timed at 8 ms (as the GPU run's busy CPU timed its small
    # products): were it believed, the GPU would win from n = 128. The trusted points say
    # the CPU wins at 64 (5 us against 20 us) and nothing about 128, so from n = 256.
    cpu = {64: _timed(5e-6), 128: doubtful, 256: _timed(1e-4), 512: _timed(1e-3)}
    sweep = _trusted_sweep(cpu, GPU)
    assert crossover(sweep.drop(columns="trusted"), "cpu fp32", "cuda fp32") == 128
    assert crossover(sweep, "cpu fp32", "cuda fp32") == 256
    excluded = sweep[~sweep["trusted"]]
    assert list(excluded["size"]) == [128] and excluded["doubt"].iloc[0] == doubtful.doubt


def test_without_a_trusted_point_in_a_series_there_is_no_crossover() -> None:
    cpu = {size: _timed(1e-3, load=9.0) for size in GPU}
    assert crossover(_trusted_sweep(cpu, GPU), "cpu fp32", "cuda fp32") is None
