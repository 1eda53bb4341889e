"""Chapter 11's order of two timings by their ranges (helpers.cuda_semantics.ranges_verdict,
describe_ranges): a noisy timing gets no factor, but ranges apart still say which is faster."""

from __future__ import annotations

import pytest

from helpers.cuda_semantics import describe_ranges, ranges_verdict
from helpers.timing import NO_DIFFERENCE, compare

# The H200 run of chapter 11 (torch 2.11.0+cu130): eager step and graph replay, in ms, over
# 5 measurements each; the eager step's IQR is 16% of its median.
H200_EAGER, H200_REPLAY = (1.768, 0.2749, 5), (0.3077, 3.157e-05, 5)


def test_the_h200_figures_order_the_replay_first_where_compare_gives_no_verdict() -> None:
    gain = compare(H200_EAGER, H200_REPLAY)
    assert gain.verdict == NO_DIFFERENCE and gain.noisy, "the check that failed on the H200"
    assert ranges_verdict(gain) == "faster"
    line = describe_ranges(gain, "the graph replay", "launching each kernel")
    assert line.startswith("the graph replay: faster than launching each kernel"), line
    assert NO_DIFFERENCE not in line and "x as fast" not in line, "no factor from a noisy one"


def test_quiet_timings_keep_compares_factor() -> None:
    # the first H200 run: eager 2.179 ms (IQR 15.6 us), replay 304.6 us (IQR 0.1 us)
    gain = compare((2.179, 0.0156, 5), (0.3046, 0.0001, 5))
    assert ranges_verdict(gain) == gain.verdict == "faster"
    line = describe_ranges(gain, "the graph replay", "launching each kernel")
    assert line == gain.describe("the graph replay", "launching each kernel")
    assert line == "the graph replay: 7.15x as fast as launching each kernel"


@pytest.mark.parametrize(("eager", "replay", "said"), [
    ((1.768, 0.2749, 5), (1.768, 3.157e-05, 5), NO_DIFFERENCE),  # the same median
    ((1.768, 0.2749, 5), (1.60, 3.157e-05, 5), NO_DIFFERENCE),  # faster, within the spreads
    ((1.768, 0.2749, 5), (1.40, 0.1, 5), NO_DIFFERENCE),  # a gap of 0.368 ms, spreads 0.375
    ((0.3077, 3.157e-05, 5), (1.768, 0.2749, 5), "slower"),  # the figures swapped
    ((1.768, 0.2749, 4), (0.3077, 3.157e-05, 5), NO_DIFFERENCE),  # too few measurements
    ((1.768, 0.2749, 5), (0.3077, 3.157e-05, 2), NO_DIFFERENCE),
])
def test_where_the_replay_is_not_clearly_faster_the_verdict_is_not_faster(
        eager, replay, said) -> None:
    gain = compare(eager, replay)
    assert ranges_verdict(gain) == said
    line = describe_ranges(gain, "the graph replay", "launching each kernel")
    if said == NO_DIFFERENCE:
        assert line == gain.describe("the graph replay", "launching each kernel")
    else:
        assert line.startswith("the graph replay: slower than launching each kernel"), line


def test_a_gap_just_beyond_the_spreads_orders_them() -> None:
    assert ranges_verdict(compare((1.768, 0.2749, 5), (1.39, 0.1, 5))) == "faster"


def test_anything_but_a_comparison_is_refused() -> None:
    for bad in (H200_EAGER, None, 1.768):
        with pytest.raises(TypeError, match="helpers.timing.Comparison"):
            ranges_verdict(bad)
        with pytest.raises(TypeError, match="helpers.timing.Comparison"):
            describe_ranges(bad, "a", "b")


def test_a_noisy_timing_names_no_cause_it_cannot_know() -> None:
    # The H200 ran chapter 11 alone, yet its eager step printed "(the machine was busy)".
    from helpers.timing import Timing

    eager = Timing("eager step", "cuda:0", 1.768e-3, 0.2749e-3, 1.768e-3, (1.768e-3,) * 5)
    assert eager.noisy
    said = str(eager)
    assert said.endswith("over 5 measurements; noisy, so treat it as rough"), said
    assert "busy" not in said
