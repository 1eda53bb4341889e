"""Bad input for every public function and class of helpers.cuda_semantics (chapter 11), called
as a reader who has read only the signatures and docstrings would call them. Each case ends in
a clear error naming the bad value (and what to do), or in a correct result."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.cuda_semantics import (
    AsyncErrorReport,
    Overlap,
    async_error_report,
    async_error_reports,
    copy_compute_overlap,
    event_ms,
)
from helpers.timing import Timing
from tests.support import assert_clear_error

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")

#: Devices that cannot run CUDA events and streams: (device, words the error must contain)
NOT_CUDA = [
    pytest.param("cpu", ["'cpu'", "CUDA"], id="cpu"),
    pytest.param(torch.device("cpu"), ["cpu", "CUDA"], id="cpu-device-object"),
    pytest.param("meta", ["'meta'", "CUDA"], id="meta"),
    pytest.param("gpu", ["'gpu'", "cuda"], id="gpu-is-no-device-type"),
    pytest.param("cuda:99", ["cuda:99"], id="gpu-index-that-does-not-exist"),
    pytest.param("cuda", ["'cuda'", "not available"], id="cuda-without-a-gpu", marks=NO_CUDA),
]


@pytest.mark.parametrize("device, words", NOT_CUDA)
@pytest.mark.parametrize("call", [lambda d: event_ms(lambda: None, d),
                                  lambda d: copy_compute_overlap(d)],
                         ids=["event_ms", "copy_compute_overlap"])
def test_cuda_only_functions_refuse_other_devices(call, device, words) -> None:
    assert_clear_error(lambda: call(device), ValueError, words)


@pytest.mark.parametrize("fn", [None, 42, "a @ a", torch.randn(2)])
def test_event_ms_needs_a_function(fn) -> None:
    with pytest.raises(TypeError, match="lambda"):
        event_ms(fn, "cuda")


#: copy_compute_overlap's sizes: (keyword, bad value)
BAD_SIZES = [("mib", 0), ("mib", -256), ("mib", 2.5), ("mib", "256"), ("mib", True),
             ("size", 0), ("size", 4096.0), ("size", None), ("repeats", 0), ("repeats", -1)]


@pytest.mark.parametrize("name, value", BAD_SIZES)
def test_copy_compute_overlap_bad_sizes(name: str, value) -> None:
    # Checked before the device, so the message is about the size on any machine.
    assert_clear_error(lambda: copy_compute_overlap("cuda", **{name: value}), ValueError,
                       [name, repr(value)])


#: async_error_report's arguments: (device, keywords, exception, words)
BAD_REPORTS = {
    "meta": ("meta", {}, ValueError, ["meta", "'cpu'"]),
    "gpu": ("gpu", {}, ValueError, ["'gpu'"]),
    "cuda:99": ("cuda:99", {}, ValueError, ["cuda:99"]),
    "timeout 0": ("cpu", {"timeout": 0}, ValueError, ["timeout", "0"]),
    "negative timeout": ("cpu", {"timeout": -5}, ValueError, ["timeout", "-5"]),
    "NaN timeout": ("cpu", {"timeout": math.nan}, ValueError, ["timeout", "nan"]),
    "timeout as text": ("cpu", {"timeout": "300"}, ValueError, ["timeout", "'300'"]),
    "timeout True": ("cpu", {"timeout": True}, ValueError, ["timeout", "True"]),
    "launch_blocking as text": ("cpu", {"launch_blocking": "1"}, TypeError,
                                ["launch_blocking", "'1'"]),
    "a timeout too short to start Python": ("cpu", {"timeout": 0.001}, TimeoutError,
                                            ["timeout=0.001", "larger timeout"]),
}


@pytest.mark.parametrize("case", list(BAD_REPORTS))
def test_async_error_report_bad_input(case: str) -> None:
    device, kwargs, error, words = BAD_REPORTS[case]
    assert_clear_error(lambda: async_error_report(device, **kwargs), error, words)


@pytest.mark.parametrize("case", [c for c in BAD_REPORTS if "launch_blocking" not in c])
def test_async_error_reports_bad_input(case: str) -> None:
    """Both ways at once (chapter 11) refuse what one way refuses, with the same words."""
    device, kwargs, error, words = BAD_REPORTS[case]
    assert_clear_error(lambda: async_error_reports(device, **kwargs), error, words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_async_error_report_cuda_without_a_gpu() -> None:
    with pytest.raises(ValueError, match="'cuda'.*not available"):
        async_error_report("cuda")


def test_async_error_report_on_the_cpu_is_a_correct_result() -> None:
    report = async_error_report(" cpu ", timeout=300)
    assert isinstance(report, AsyncErrorReport)
    assert report.lines_late == 0 and "out of bounds" in report.error
    assert "the faulty call returned" not in report.printed


def _ms(median_ms: float, iqr_ms: float = 0.0, runs: int = 10) -> Timing:
    return Timing("t", "cuda:0", median_ms / 1e3, iqr_ms / 1e3, median_ms / 1e3,
                  (median_ms / 1e3,) * runs)


FIELDS = ["copy", "compute", "serial", "overlapped"]
TIMES = {"copy": _ms(10.0), "compute": _ms(10.0), "serial": _ms(20.0), "overlapped": _ms(11.0)}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_overlap_refuses_impossible_times(field: str, value) -> None:
    bad = Timing("t", "cuda:0", value, 0.0, value, (value,) * 10)
    assert_clear_error(lambda: Overlap(mib=256, products=3, **{**TIMES, field: bad}),
                       ValueError, [field, repr(value)])


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [20.0, "3 ms", (20.0, 0.1)])
def test_overlap_needs_timings(field: str, value) -> None:
    assert_clear_error(lambda: Overlap(mib=256, products=3, **{**TIMES, field: value}),
                       TypeError, [field, repr(value), "Timing"])


def test_overlap_saved_is_a_share_of_the_serial_time() -> None:
    overlap = Overlap(256, 3, **TIMES)
    assert overlap.saved == pytest.approx(0.45)
    assert (overlap.serial_ms, overlap.overlapped_ms) == pytest.approx((20.0, 11.0))
