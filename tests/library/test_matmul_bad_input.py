"""Bad input for every public function of helpers.matmul (chapter 3), as a reader would pass it
from the signatures and docstrings: each case ends in a clear error that names the bad value and
says what to pass instead, or in a correct result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import matmul
from tests.support import assert_clear_error

QUICK = {"warmup": 0, "min_run_time": 0.01, "min_runs": 2}


def _enter(context) -> None:
    with context:
        pass


ERRORS = [
    ("a product on 'gpu'", lambda: matmul.time_matmul(8, 8, 8, "gpu", **QUICK), ValueError,
     ["'gpu'", "did you mean"]),
    ("a product on a GPU that is not here", lambda: matmul.time_matmul(8, 8, 8, "cuda:99"),
     ValueError, ["cuda:99", "Devices on this machine"]),
    ("a product on meta", lambda: matmul.time_matmul(8, 8, 8, "meta"), ValueError,
     ["meta", "pass the device the product runs on"]),
    ("a product on a dtype", lambda: matmul.time_matmul(8, 8, 8, torch.float32), TypeError,
     ["torch.float32", "'cuda:0'"]),
    ("a mode that does not exist", lambda: matmul.time_matmul(8, 8, 8, "cpu", "fp8"),
     ValueError, ["'fp8'", "'fp16'"]),
    ("a dtype instead of a mode", lambda: matmul.time_matmul(8, 8, 8, "cpu", torch.bfloat16),
     ValueError, ["torch.bfloat16", "'bf16'"]),
    ("a mode in capitals", lambda: matmul.time_matmul(8, 8, 8, "cpu", "FP32"), ValueError,
     ["'FP32'", "'fp32'"]),
    ("a zero size", lambda: matmul.time_matmul(0, 8, 8, "cpu"), ValueError, ["(0, 8, 8)"]),
    ("a negative size", lambda: matmul.time_matmul(8, -8, 8, "cpu"), ValueError, ["-8"]),
    ("a fractional size", lambda: matmul.time_matmul(8, 8, 8.5, "cpu"), ValueError, ["8.5"]),
    ("a size as text", lambda: matmul.time_matmul("8", 8, 8, "cpu"), ValueError, ["'8'"]),
    ("a timing budget of zero", lambda: matmul.time_matmul(8, 8, 8, "cpu", min_run_time=0),
     ValueError, ["min_run_time", "0"]),
    ("a negative warm-up", lambda: matmul.time_matmul(8, 8, 8, "cpu", warmup=-1), ValueError,
     ["warmup", "-1"]),
    ("sizes on 'gpu'", lambda: matmul.sweep_sizes("gpu"), ValueError, ["'gpu'", "did you mean"]),
    ("sizes on a GPU that is not here", lambda: matmul.sweep_sizes("cuda:99"), ValueError,
     ["cuda:99"]),
    ("no sizes", lambda: matmul.sweep_sizes("cpu", []), ValueError, ["empty", "[256, 1024]"]),
    ("one size, not a list", lambda: matmul.sweep_sizes("cpu", 1024), TypeError,
     ["1024", "[256, 1024]"]),
    ("sizes as text", lambda: matmul.sweep_sizes("cpu", "1024"), TypeError, ["'1024'"]),
    ("a zero size in the list", lambda: matmul.sweep_sizes("cpu", [64, 0]), ValueError, ["0"]),
    ("a size as text in the list", lambda: matmul.sweep_sizes("cpu", [64, "128"]), ValueError,
     ["'128'"]),
    ("modes of 'gpu'", lambda: matmul.supported_modes("gpu"), ValueError,
     ["'gpu'", "did you mean"]),
    ("modes of a GPU that is not here", lambda: matmul.supported_modes("cuda:99"), ValueError,
     ["cuda:99", "Devices on this machine"]),
    ("modes of None", lambda: matmul.supported_modes(None), TypeError, ["None", "'cuda:0'"]),
    ("a precision that does not exist", lambda: _enter(matmul.fp32_precision("high")),
     ValueError, ["'high'", "'tf32'"]),
    ("a precision as a bool", lambda: _enter(matmul.fp32_precision(True)), ValueError,
     ["True", "'ieee'"]),
    ("zero threads", lambda: _enter(matmul.num_threads(0)), ValueError, ["0", "at least 1"]),
    ("threads as text", lambda: _enter(matmul.num_threads("4")), ValueError, ["'4'"]),
    ("fractional threads", lambda: _enter(matmul.num_threads(1.5)), ValueError, ["1.5"]),
]


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in ERRORS],
                         ids=[c[0] for c in ERRORS])
def test_bad_input_gets_a_clear_error(call, error, words) -> None:
    # A refused call changes no setting.
    assert_clear_error(call, error, words, settings=lambda: (
        torch.get_num_threads(), torch.backends.cuda.matmul.fp32_precision))


def _threads_inside(n) -> int:
    with matmul.num_threads(n):
        return torch.get_num_threads()


RESULTS = [
    ("a torch.device", lambda: matmul.time_matmul(8, 4, 2, torch.device("cpu"), **QUICK),
     lambda r: r[0].device == "cpu" and r[1] > 0),
    ("numpy sizes", lambda: matmul.time_matmul(np.int64(8), 4, 2, "cpu", **QUICK),
     lambda r: r[1] > 0),
    ("fp16 on the CPU (slow, but correct)",
     lambda: matmul.time_matmul(8, 8, 8, "cpu", "fp16", **QUICK),
     lambda r: r[0].label.startswith("fp16") and r[1] > 0),
    ("copying in from the CPU to the CPU",
     lambda: matmul.time_matmul(8, 8, 8, "cpu", include_copy=True, **QUICK),
     lambda r: r[1] > 0),
    ("a fresh output each call",
     lambda: matmul.time_matmul(8, 8, 8, "cpu", preallocate=False, **QUICK),
     lambda r: r[1] > 0),
    ("sizes as a tuple with a large one", lambda: matmul.sweep_sizes("cpu", (64, 65536)),
     lambda r: r == [64]),
    ("sizes as a generator", lambda: matmul.sweep_sizes("cpu", (s for s in (128, 64))),
     lambda r: r == [128, 64]),
    ("modes of the CPU", lambda: matmul.supported_modes(torch.device("cpu")),
     lambda r: r == ["fp32"]),
    ("modes of meta", lambda: matmul.supported_modes("meta"), lambda r: r == ["fp32"]),
    ("one thread", lambda: _threads_inside(1), lambda r: r == 1),
    ("numpy threads", lambda: _threads_inside(np.int64(1)), lambda r: r == 1),
]


@pytest.mark.parametrize(("call", "check"), [c[1:] for c in RESULTS], ids=[c[0] for c in RESULTS])
def test_unusual_but_meaningful_input_gets_a_correct_result(call, check) -> None:
    assert check(call())
