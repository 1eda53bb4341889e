"""helpers.matmul.crossover: where one series of chapter 3's sweep beats another for good."""

from __future__ import annotations

import pandas as pd
import pytest

from helpers.matmul import crossover


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
