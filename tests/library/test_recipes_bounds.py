"""helpers.recipes (chapter 12): what bounds a step (the GPU-busy share, TF32 in "plain fp32"
convolutions) and a cold compiler cache, all checked on a CPU. The comparison rule chapter 12
applies is tested with helpers.timing (test_timing_compare.py).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from helpers import recipes


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


def test_a_profile_without_gpu_work_is_an_error_that_says_where_to_look() -> None:
    """helpers hides kineto's own messages (KINETO_LOG_LEVEL=6), a CUPTI failure's among them:
    a profile that saw none of a step's kernels must not read as a GPU busy 0% of the time."""
    events = [_kernel(0, 1000, kind=DeviceType.CPU), _kernel(0, 1000, index=1)]
    with pytest.raises(recipes.NoGpuWorkProfiled, match="no GPU work on cuda:0.*CUPTI.*"
                       "KINETO_LOG_LEVEL=0"):
        recipes._busy_from_events(events, steps=3, index=0)


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


def test_what_bounds_a_step_from_its_busy_share() -> None:
    assert recipes.GPU_BOUND_SHARE == 0.9  # chapter 12's prose states it
    assert recipes.bound_by(recipes.GPU_BOUND_SHARE) == "the GPU"
    assert recipes.bound_by(1.02) == "the GPU"  # a profile may count a little past the step
    assert recipes.bound_by(0.0) == recipes.bound_by(0.8999) == "the host"
    for bad in (-0.1, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match="busy share"):
            recipes.bound_by(bad)


def test_h100_class_records_and_devices_off_cuda() -> None:
    assert recipes.h100_class({"capability": "9.0", "multiprocessors": 132}) is True
    assert recipes.h100_class({"capability": "10.0", "multiprocessors": 148}) is True  # B200
    assert recipes.h100_class({"capability": "9.0", "multiprocessors": 78}) is False  # H20
    assert recipes.h100_class({"capability": "8.0", "multiprocessors": 108}) is False  # A100
    assert recipes.h100_class("cpu") is False and recipes.h100_class("mps") is False
    with pytest.raises(ValueError, match="capability"):
        recipes.h100_class({"capability": "nine", "multiprocessors": 132})
