"""helpers.timing.compare (chapters 4, 10 and 12): a verdict only where the timings allow one.

The figures are the first GPU run's (one H200, torch 2.11, ../shared/gpu-runs/2026-11-28-h200):
chapter 12 printed "1.05x as fast" for a pinned copy whose pageable baseline had a spread of
13% of its median; that comparison must print no factor. The rule's false verdicts (a factor
for two timings of the same work) are measured here on simulated timings.
"""

from __future__ import annotations

import pytest
import torch

from helpers import recipes, timing
from helpers.timing import (
    MIN_RUNS_TO_COMPARE,
    NO_DIFFERENCE,
    NOISY_SPREAD,
    Comparison,
    Timing,
    compare,
)


def test_a_noisy_baseline_gives_no_factor() -> None:
    # The H200 page: pageable 2.680 ms (IQR 0.342), pinned 2.550 ms (IQR 0.226).
    c = compare((2.680, 0.3423), (2.550, 0.226))
    assert c.noisy and not c.measurable and c.verdict == NO_DIFFERENCE
    line = c.describe("pinned, non_blocking copy", "a pageable copy")
    assert NO_DIFFERENCE in line and "spread is above 10%" in line
    assert "1.05" not in line


def test_clear_differences_get_their_factor() -> None:
    # The H200 page: plain 2.520 ms (IQR 0.053), bf16 autocast 3.075 (0.120), cudnn 2.305 (0.080)
    slower = compare((2.520, 0.053), (3.075, 0.120))
    assert slower.measurable and slower.verdict == "slower"
    assert slower.describe("bf16_autocast").startswith("bf16_autocast: 0.82x the speed of")
    faster = compare((2.520, 0.053), (2.305, 0.080))
    assert faster.verdict == "faster"
    assert faster.describe("cudnn_benchmark") == \
        "cudnn_benchmark: 1.09x as fast as the plain step"


def test_a_gap_must_exceed_both_spreads_together() -> None:
    # Spreads of 0.9 on medians near 20 (under 5%: not noisy). Half the two spreads (0.9)
    # was the rule before: a gap of 1.0 got a factor, though the ranges median +- IQR overlap.
    old = compare((20.0, 0.9), (19.0, 0.9))
    assert not old.noisy and old.verdict == NO_DIFFERENCE
    c = compare((20.0, 0.9), (18.25, 0.9))  # 1.75: the ranges still overlap
    assert not c.noisy and c.within_spread and c.resolution == pytest.approx(1.8)
    assert "within the spreads" in c.describe("x")
    assert compare((20.0, 0.9), (18.1, 0.9)).verdict == "faster"  # 1.9 > 1.8
    assert compare((18.1, 0.9), (20.0, 0.9)).verdict == "slower"


def test_the_noise_threshold_is_the_timing_modules() -> None:
    assert not compare((1.0, NOISY_SPREAD), (2.0, 0.0)).noisy
    assert compare((1.0, NOISY_SPREAD * 1.01), (2.0, 0.0)).noisy


def _timing(median: float, iqr: float, runs: int) -> Timing:
    return Timing("t", "cpu", median, iqr, median, (median,) * runs)


def test_too_few_measurements_give_no_factor() -> None:
    # Two epochs against two (chapter 10 on a CPU): far apart, yet no verdict.
    few = compare((1.0, 0.01, 2), (2.0, 0.01, 2))
    assert few.too_few and few.verdict == NO_DIFFERENCE
    assert f"fewer than {MIN_RUNS_TO_COMPARE} measurements" in few.describe("x")
    enough = compare(_timing(2.0, 0.01, MIN_RUNS_TO_COMPARE), _timing(1.0, 0.01, 8))
    assert not enough.too_few and enough.speedup == 2.0 and enough.verdict == "faster"
    assert compare(_timing(2.0, 0.01, 4), _timing(1.0, 0.01, 8)).too_few
    assert not compare((2.0, 0.01), (1.0, 0.01)).too_few  # a pair: count not known


def _false_verdicts(rule, runs: int, trials: int = 4000) -> float:
    """How often ``rule`` gives a verdict for two timings of the same work (normal noise,
    3% of the median), each of ``runs`` measurements, medians and IQRs as
    torch.utils.benchmark computes them."""
    g = torch.Generator().manual_seed(0)
    samples = 1 + 0.03 * torch.randn(trials, 2, runs, generator=g, dtype=torch.float64)
    q = torch.quantile(samples, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=-1)
    medians, iqrs = q[1], q[2] - q[0]
    return sum(rule((m[0].item(), s[0].item(), runs), (m[1].item(), s[1].item(), runs))
               for m, s in zip(medians, iqrs, strict=True)) / trials


def test_two_timings_of_the_same_work_rarely_get_a_verdict() -> None:
    def rule(a, b):
        return compare(a, b).measurable

    def half_the_spreads(a, b):  # the rule before: the gap beyond half the two spreads
        return abs(a[0] - b[0]) > (a[1] + b[1]) / 2

    assert _false_verdicts(half_the_spreads, 5) > 0.15  # about one in four
    assert _false_verdicts(rule, 5) < 0.08  # about one in twenty
    assert _false_verdicts(rule, 8) < 0.02


@pytest.mark.parametrize("args", [((0.0, 0.1), (1.0, 0.1)), ((1.0, -0.1), (1.0, 0.1)),
                                  ((float("nan"), 0.1), (1.0, 0.1)), ((True, 0.1), (1.0, 0.1)),
                                  ((1.0, 0.1, 0), (1.0, 0.1)), ((1.0, 0.1, 2.5), (1.0, 0.1))])
def test_impossible_times_are_refused(args) -> None:
    with pytest.raises(ValueError, match="must be"):
        compare(*args)


def test_other_objects_are_refused() -> None:
    with pytest.raises(TypeError, match=r"Timing, a \(median, iqr\) pair"):
        compare(2.0, (1.0, 0.1))
    with pytest.raises(TypeError, match="triple"):
        compare((2.0, 0.1, 5, 1), (1.0, 0.1))
    assert isinstance(compare((2.0, 0.1), (1.0, 0.1)), Comparison)


def test_one_definition_importable_from_recipes_too() -> None:
    # Chapter 10 imports the rule from helpers.recipes, where chapter 12 first used it.
    assert recipes.compare is timing.compare and recipes.Comparison is timing.Comparison
    assert recipes.NO_DIFFERENCE == timing.NO_DIFFERENCE


def test_a_factor_never_reads_one_beside_a_verdict() -> None:
    # The H200's residual CNN (torch 2.11): plain 15.228 ms (IQR 7.9 us) and cudnn_benchmark
    # 0.9993x printed "1.00x the speed of the plain step on cuda:0, slower".
    slower = compare((15.228, 0.0079), (15.2387, 0.0020))
    assert slower.verdict == "slower" and slower.speedup == pytest.approx(0.9993, abs=1e-4)
    assert slower.describe("cudnn_benchmark") == \
        "cudnn_benchmark: 0.999x the speed of the plain step, slower"
    faster = compare((15.2072, 0.0030), (15.1957, 0.0003))  # its benchmark's figures
    assert faster.describe("cudnn_benchmark").startswith("cudnn_benchmark: 1.001x as fast")
    assert compare((1.00004, 0.0), (1.0, 0.0)).factor == "1.00004"
    assert compare((2.520, 0.053), (2.305, 0.080)).factor == "1.09"  # 2 decimals otherwise
