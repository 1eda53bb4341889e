"""Bad input for every public function of helpers.timing (chapter 3), as a reader would pass it
from the signatures and docstrings: each case ends in a clear error that names the bad value and
says what to pass instead, or in a correct result."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import timing
from tests.support import assert_clear_error

QUICK = {"warmup": 0, "min_run_time": 0.01, "min_runs": 2}


def _noop() -> None:
    return None


# (case, call, exception, words the message must contain: the bad value and the remedy)
ERRORS = [
    ("synchronize a 'gpu'", lambda: timing.synchronize("gpu"), ValueError,
     ["'gpu'", "did you mean"]),
    ("synchronize a GPU that is not here", lambda: timing.synchronize("cuda:99"), ValueError,
     ["cuda:99", "Devices on this machine"]),
    ("synchronize a number that is no device", lambda: timing.synchronize(2.5), TypeError,
     ["2.5", "'cuda:0'"]),
    ("synchronize 'CPU'", lambda: timing.synchronize("CPU"), ValueError,
     ["'CPU'", "did you mean 'cpu'"]),
    ("synchronize a misspelt device", lambda: timing.synchronize("cpuu"), ValueError,
     ["'cpuu'", "Devices on this machine"]),
    ("clock for a device that is not here", lambda: timing.device_clock("cuda:99"), ValueError,
     ["cuda:99", "Devices on this machine"]),
    ("clock for a list", lambda: timing.device_clock(["cpu"]), TypeError, ["['cpu']"]),
    ("benchmark a result instead of a function",
     lambda: timing.benchmark(torch.ones(2) @ torch.ones(2)), TypeError,
     ["tensor(2.)", "benchmark(torch.matmul, a, b)"]),
    ("benchmark on a device that is not here",
     lambda: timing.benchmark(_noop, device="cuda:99", **QUICK), ValueError, ["cuda:99"]),
    ("benchmark on 'gpu'", lambda: timing.benchmark(_noop, device="gpu", **QUICK), ValueError,
     ["'gpu'", "did you mean"]),
    ("benchmark on meta", lambda: timing.benchmark(_noop, device="meta", **QUICK), ValueError,
     ["meta", "pass the device the work runs on"]),
    ("negative warm-up", lambda: timing.benchmark(_noop, warmup=-1), ValueError,
     ["warmup", "-1"]),
    ("fractional run count", lambda: timing.benchmark(_noop, min_runs=2.5), ValueError,
     ["min_runs", "2.5"]),
    ("zero runs", lambda: timing.benchmark(_noop, min_runs=0), ValueError, ["min_runs", "0"]),
    ("zero run time", lambda: timing.benchmark(_noop, min_run_time=0), ValueError,
     ["min_run_time", "0"]),
    ("infinite run time", lambda: timing.benchmark(_noop, min_run_time=math.inf), ValueError,
     ["min_run_time", "inf"]),
    ("run time as text", lambda: timing.benchmark(_noop, min_run_time="1"), ValueError,
     ["min_run_time", "'1'"]),
    ("zero threads", lambda: timing.benchmark(_noop, num_threads=0), ValueError,
     ["num_threads", "0"]),
    ("a zero size", lambda: timing.matmul_flops(0, 200, 10), ValueError, ["(0, 200, 10)"]),
    ("a negative size", lambda: timing.matmul_flops(10, -2, 10), ValueError, ["-2"]),
    ("a fractional size", lambda: timing.matmul_flops(10.5, 2, 10), ValueError, ["10.5"]),
    ("a size as text", lambda: timing.matmul_flops("10", 2, 10), ValueError, ["'10'"]),
    ("a size as a bool", lambda: timing.matmul_flops(True, 2, 10), ValueError, ["True"]),
    ("zero seconds", lambda: timing.tflops(1e12, 0), ValueError, ["seconds", "0"]),
    ("NaN seconds", lambda: timing.tflops(1e12, math.nan), ValueError, ["seconds", "nan"]),
    ("negative FLOPs", lambda: timing.tflops(-5, 1.0), ValueError, ["flops", "-5"]),
    ("FLOPs as text", lambda: timing.tflops("1e12", 1.0), ValueError, ["flops", "'1e12'"]),
    ("a number format that does not exist", lambda: timing.peak_tflops("Tesla T4", "int8"),
     ValueError, ["'int8'", "fp16"]),
    ("a number format in capitals", lambda: timing.peak_tflops("Tesla T4", "FP16"),
     ValueError, ["'FP16'", "fp16"]),
    ("a device instead of its name", lambda: timing.peak_tflops(torch.device("cuda:0")),
     TypeError, ["cuda:0", "get_device_name"]),
    ("no name", lambda: timing.peak_tflops(None), TypeError, ["None", "'Tesla T4'"]),
    ("a negative rate", lambda: timing.share_of_peak(-1.0, "Tesla T4"), ValueError,
     ["achieved_tflops", "-1.0"]),
    ("a rate as text", lambda: timing.share_of_peak("5", "Tesla T4"), ValueError,
     ["achieved_tflops", "'5'"]),
    ("a peak of an unknown format",
     lambda: timing.PEAK_TFLOPS["Tesla T4"].for_dtype("float16"), ValueError,
     ["'float16'", "fp16"]),
]


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in ERRORS],
                         ids=[c[0] for c in ERRORS])
def test_bad_input_gets_a_clear_error(call, error, words) -> None:
    assert_clear_error(call, error, words)


def _timed_noop(**kwargs) -> timing.Timing:
    return timing.benchmark(_noop, **QUICK, **kwargs)


# (case, call, check of the result): inputs that are unusual but mean something.
RESULTS = [
    ("synchronize the CPU by name", lambda: timing.synchronize("cpu"), lambda r: r is None),
    ("synchronize a torch.device", lambda: timing.synchronize(torch.device("cpu")),
     lambda r: r is None),
    ("synchronize the default", lambda: timing.synchronize(None), lambda r: r is None),
    ("benchmark with a torch.device", lambda: _timed_noop(device=torch.device("cpu")),
     lambda r: r.runs >= 2 and r.device == "cpu"),
    ("benchmark with one thread", lambda: _timed_noop(num_threads=1), lambda r: r.runs >= 2),
    ("benchmark a function with keyword arguments",
     lambda: timing.benchmark(torch.matmul, torch.ones(2, 2), torch.ones(2, 2),
                              out=torch.empty(2, 2), **QUICK),
     lambda r: r.median > 0),
    ("numpy sizes", lambda: timing.matmul_flops(np.int64(10), 2, np.int32(3)),
     lambda r: r == 120 and type(r) is int),
    ("numpy seconds", lambda: timing.tflops(2e12, np.float64(2.0)), lambda r: r == 1.0),
    ("zero FLOPs", lambda: timing.tflops(0, 1.0), lambda r: r == 0.0),
    ("a GPU name with other case and spaces", lambda: timing.peak_tflops("  tesla t4 ", "fp16"),
     lambda r: r == 65.0),
    ("a GPU the table does not know", lambda: timing.peak_tflops("NVIDIA A10G"),
     lambda r: r is None),
    ("a format a GPU lacks", lambda: timing.peak_tflops("Tesla T4", "bf16"), lambda r: r is None),
    ("a share of an unknown GPU", lambda: timing.share_of_peak(5.0, "Fake GPU"),
     lambda r: r is None),
    ("a share of a known GPU", lambda: timing.share_of_peak(32.5, "Tesla T4", "fp16"),
     lambda r: r == 0.5),
]


@pytest.mark.parametrize(("call", "check"), [c[1:] for c in RESULTS], ids=[c[0] for c in RESULTS])
def test_unusual_but_meaningful_input_gets_a_correct_result(call, check) -> None:
    assert check(call())


def test_every_gpu_in_the_peak_table_has_an_fp16_figure() -> None:
    # fp16 runs on the tensor cores of every GPU in the table (Volta onwards), so a T4's
    # comparison of number formats has a peak for its one tensor-core format.
    assert all(p.fp16 is not None and p.fp16 > p.fp32 for p in timing.PEAK_TFLOPS.values())
    assert timing.peak_tflops("Tesla T4", "fp16") / timing.peak_tflops("Tesla T4") > 8
