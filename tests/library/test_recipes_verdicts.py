"""helpers.recipes (chapter 12): verdicts only where the spreads allow one, the GPU-busy share
of a step, TF32 in "plain fp32" convolutions and a cold compiler cache, all checked on a CPU.

The figures are the first GPU run's (one H200, torch 2.11, ../shared/gpu-runs/2026-11-28-h200):
chapter 12 printed "1.05x as fast" for a pinned copy whose pageable baseline had a spread of
13% of its median; that comparison must print no factor.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from helpers import recipes
from helpers.recipes import NO_DIFFERENCE, Comparison, compare
from helpers.timing import NOISY_SPREAD, Timing


def test_a_noisy_baseline_gives_no_factor() -> None:
    # The H200 page: pageable 2.680 ms (IQR 0.342), pinned 2.550 ms (IQR 0.226).
    c = compare((2.680, 0.3423), (2.550, 0.226))
    assert c.noisy and not c.measurable and c.verdict == NO_DIFFERENCE
    line = c.describe("pinned, non_blocking copy", "a pageable copy")
    assert NO_DIFFERENCE in line and "x" not in line.split("(")[0].replace("non_blocking", "")
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


def test_a_gap_within_the_spreads_gets_no_factor() -> None:
    c = compare((10.0, 0.9), (9.2, 0.9))  # each spread 9%: not noisy, but 0.8 < 0.9
    assert not c.noisy and c.within_spread and c.verdict == NO_DIFFERENCE
    assert "within the spreads" in c.describe("x")
    assert compare((10.0, 0.9), (9.0, 0.9)).verdict == "faster"  # 1.0 > 0.9


def test_the_noise_threshold_is_the_timing_modules() -> None:
    assert not compare((1.0, NOISY_SPREAD), (2.0, 0.0)).noisy
    assert compare((1.0, NOISY_SPREAD * 1.01), (2.0, 0.0)).noisy


def test_timings_from_benchmark_are_accepted() -> None:
    def timing(median: float, iqr: float) -> Timing:
        return Timing("t", "cpu", median, iqr, median, (median,))

    assert compare(timing(2.0, 0.01), timing(1.0, 0.01)).speedup == 2.0


@pytest.mark.parametrize("args", [((0.0, 0.1), (1.0, 0.1)), ((1.0, -0.1), (1.0, 0.1)),
                                  ((float("nan"), 0.1), (1.0, 0.1)), ((True, 0.1), (1.0, 0.1))])
def test_impossible_times_are_refused(args) -> None:
    with pytest.raises(ValueError, match="must be"):
        compare(*args)


def test_other_objects_are_refused() -> None:
    with pytest.raises(TypeError, match=r"Timing or a \(median, iqr\) pair"):
        compare(2.0, (1.0, 0.1))
    assert isinstance(compare((2.0, 0.1), (1.0, 0.1)), Comparison)


def _kernel(start: float, end: float, *, index: int = 0, annotation: bool = False,
            kind: DeviceType = DeviceType.CUDA) -> SimpleNamespace:
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=kind,
                           is_user_annotation=annotation, device_index=index)


def test_busy_time_counts_overlaps_once_and_only_the_gpus_work() -> None:
    events = [_kernel(0, 100), _kernel(50, 150),             # overlap: 150 us together
              _kernel(300, 400),                             # 100 us
              _kernel(0, 1000, annotation=True),             # a label mirrored on the GPU
              _kernel(0, 1000, kind=DeviceType.CPU),         # the host's own events
              _kernel(0, 1000, index=1)]                     # another GPU
    busy = recipes._busy_from_events(events, steps=2, index=0)
    assert busy.busy_ms == pytest.approx(0.125) and busy.operations == 1.5
    assert busy.share(0.5) == pytest.approx(0.25)


def test_device_busy_needs_a_cuda_gpu() -> None:
    with pytest.raises(ValueError, match="CUDA GPU"):
        recipes.device_busy(lambda: None, "cpu")
    with pytest.raises(ValueError, match="steps"):
        recipes.device_busy(lambda: None, "cpu", steps=0)


@pytest.mark.parametrize(("capability", "precision", "expected"),
                         [((9, 0), "tf32", True), ((8, 0), "tf32", True),
                          ((7, 5), "tf32", False), ((9, 0), "ieee", False)])
def test_tf32_convolutions_on_a_faked_gpu(monkeypatch, capability, precision, expected) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    conv = torch.backends.cudnn.conv
    before = conv.fp32_precision
    conv.fp32_precision = precision
    try:
        assert recipes.fp32_convolutions_use_tf32("cuda:0") is expected
    finally:
        conv.fp32_precision = before


def test_tf32_is_on_by_default_for_convolutions_not_for_matmuls() -> None:
    # What the H200's machine record showed (torch 2.11), on every torch the book supports.
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "highest"
    assert recipes.fp32_convolutions_use_tf32("cpu") is False


def test_the_cold_cache_is_a_fresh_folder_removed_afterwards() -> None:
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with recipes.cold_compile_cache():
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert inside != before and os.path.isdir(inside) and not os.listdir(inside)
        assert os.environ["TRITON_CACHE_DIR"].startswith(inside)
    # torch's own folder again (torch writes its default into the variable when it reads it)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (before, default_cache_dir())
    assert not os.path.exists(inside)
