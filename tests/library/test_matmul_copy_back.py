"""Chapter 3's GPU-only cells run on the CPU with faked timings and devices: the copy-back's
GB/s and the claims its check cell makes about them (issue 26, item 6: a fresh 400 MB pageable
tensor measured page faults, not the bus), and the naive reading against the GPU's fp32 peak
(issue 26, item 6: 'more than any GPU's peak' was false on an H100 or H200)."""

from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import helpers
import helpers.matmul
from helpers import checks, timing

CHAPTER = Path(__file__).resolve().parents[2] / "chapters" / "03_matmul.ipynb"
M = N = 512  # one MiB of fp32: 256 pages of 4 KiB


def _cell(marker: str) -> str:
    """The source of chapter 3's code cell holding ``marker``, without its %%gpu_only line."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    found = [("".join(c["source"])) for c in cells
             if c["cell_type"] == "code" and marker in "".join(c["source"])]
    assert len(found) == 1, marker
    lines = found[0].splitlines()
    return "\n".join(lines[1:] if lines[0].startswith("%%gpu_only") else lines)


def _faked(ms: dict[str, float], monkeypatch, faults: int | None,
           device: str = "cpu") -> dict:
    """Run the copy cell and return its namespace: each copy's median is ``ms[label]``.
    On a CPU ``device`` each copy also runs; on another the copies are only timed (faked)."""
    pinned = []

    def benchmark(fn, *args, device="cpu", label=None, **kwargs):
        if torch.device(device).type == "cpu":
            fn(*args)  # the copy itself runs (on the CPU here)
        return timing.Timing(label, str(device), ms[label] / 1e3, 0.0, ms[label] / 1e3,
                             (ms[label] / 1e3,) * 5)

    real_empty = torch.empty

    def empty(*size, pin_memory=False, **kwargs):  # pinning needs a GPU's driver
        pinned.append(pin_memory)
        return real_empty(*size, **kwargs)

    monkeypatch.setattr(helpers.timing, "benchmark", benchmark)
    monkeypatch.setattr(helpers.matmul, "minor_page_faults", lambda fn: faults)
    monkeypatch.setattr(torch, "empty", empty)
    multiply = timing.Timing("multiply", "cuda:0", 1e-4, 0.0, 1e-4, (1e-4,) * 5)
    out = torch.ones(M, N)
    space = {"torch": torch, "helpers": helpers, "pd": pd, "mmap": mmap, "sys": sys,
             "m": M, "n": N, "device": torch.device(device), "a_cpu": torch.ones(M, 8),
             "b_cpu": torch.ones(8, N), "out_dev": out, "tutorial_dev_out": multiply,
             "out_mb": out.nbytes / 1e6, "expect": checks.expect,
             "huge_pages_for_large_blocks": lambda: False,
             "other_allocator_loaded": lambda: False}
    exec(_cell("host_pinned = torch.empty"), space)
    space["pinned"] = pinned
    return space


def _check(space: dict) -> None:
    exec(_cell("# Check: on a CUDA GPU, the copies' order"), space)


# The H200's copies of the 400 MB product scaled to one MiB: back into a fresh tensor at
# 1.55 GB/s (its page faults), a pageable buffer at 10, a pinned one at 50; the tests slow
# them 20-fold, so even the pinned copy (0.42 ms) outlasts the faked 0.1 ms multiply.
H200_LIKE = {"a and b in": 0.3, "product out, fresh tensor": 1.048576 / 1.55,
             "product out, pageable buffer": 1.048576 / 10,
             "product out, pinned buffer": 1.048576 / 50}


def test_the_page_shows_each_copy_in_gb_per_s(monkeypatch) -> None:
    ms = {k: v * 20 for k, v in H200_LIKE.items()}
    monkeypatch.setenv(checks.STRICT_ENV_VAR, "1")
    space = _faked(ms, monkeypatch, faults=300)
    parts = space["parts"]
    assert list(parts.index) == list(H200_LIKE)
    assert parts.loc["product out, pinned buffer", "GB/s"] == pytest.approx(50 / 20)
    assert parts.loc["product out, fresh tensor", "GB/s"] == pytest.approx(1.55 / 20)
    assert parts.loc["a and b in", "GB/s"] == pytest.approx(
        (M * 8 + 8 * N) * 4 / 1e9 / 0.3e-3 / 20)
    assert parts.loc["product out, pinned buffer", "x the multiply"] == pytest.approx(
        1.048576 / 50 * 20 / 0.1)
    _check(space)  # every claim holds


@pytest.mark.parametrize(("change", "claim"), [
    ({"product out, pinned buffer": 0.05}, "outlasts the product"),
    ({"product out, pinned buffer": 5.0}, "pinned buffer"),
    ({"product out, fresh tensor": 1.0}, "page faults"),
])
def test_a_claim_the_numbers_contradict_fails_the_strict_run(monkeypatch, change,
                                                             claim) -> None:
    ms = {k: v * 20 for k, v in H200_LIKE.items()} | change
    monkeypatch.setenv(checks.STRICT_ENV_VAR, "1")
    space = _faked(ms, monkeypatch, faults=300)
    with pytest.raises(checks.ClaimNotMet, match=claim):
        _check(space)


@pytest.mark.skipif(sys.platform != "linux", reason="fault counts are read on Linux")
def test_a_fresh_tensor_must_fault_on_its_pages(monkeypatch) -> None:
    monkeypatch.setenv(checks.STRICT_ENV_VAR, "1")
    space = _faked({k: v * 20 for k, v in H200_LIKE.items()}, monkeypatch, faults=3)
    with pytest.raises(AssertionError, match="page by page"):
        _check(space)


def test_an_apple_gpu_gets_no_pinned_row(monkeypatch, capsys) -> None:
    # torch's pinned memory is not supported on mps (its DataLoader turns pin_memory off
    # there, 2.9 to 2.14): no pinned buffer is asked for, and no row claims one.
    ms = {k: v * 20 for k, v in H200_LIKE.items()}
    space = _faked(ms, monkeypatch, faults=300, device="mps")
    assert list(space["parts"].index) == list(H200_LIKE)[:3]
    assert True not in space["pinned"] and "host_pinned" not in space
    assert "page faults of one copy into a fresh tensor: 300 " in capsys.readouterr().out


def test_where_faults_are_not_counted_the_cell_says_so(monkeypatch, capsys) -> None:
    # Windows: helpers.matmul.minor_page_faults returns None (no resource module).
    space = _faked({k: v * 20 for k, v in H200_LIKE.items()}, monkeypatch, faults=None)
    assert "fresh tensor: not counted here (1 MB in pages of" in capsys.readouterr().out
    assert space["pinned"] == [False, True]  # the pageable buffer, then the pinned one


FLOPS = 2 * 10_000 * 200 * 10_000  # the tutorials' product: 40 GFLOP


def _naive_reading(monkeypatch, gpu_name: str, naive_s: float, median: float = 1e-3) -> dict:
    """Run the naive reading's rate cell and its check as on a CUDA GPU named ``gpu_name``
    whose warm unsynchronised reading took ``naive_s`` and the benchmark ``median``."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu_name)
    ratios = {"time.time(), no sync (first call)": 0.1 / median,
              "time.perf_counter(), no sync": naive_s / median}
    space = {"torch": torch, "helpers": helpers, "device": torch.device("cuda"),
             "flops": FLOPS, "naive_s": naive_s, "expect": checks.expect,
             "table": pd.DataFrame({"x the benchmark's median": ratios})}
    exec(_cell("naive_tflops = helpers.timing.tflops(flops, naive_s)"), space)
    exec(_cell("# Check: the page's claims about the unsynchronised rows"), space)
    return space


def test_the_naive_reading_is_compared_with_this_gpus_fp32_peak(monkeypatch, capsys) -> None:
    monkeypatch.setenv(checks.STRICT_ENV_VAR, "1")
    _naive_reading(monkeypatch, "NVIDIA H200", 56e-6)  # the H200 run's warm launch
    assert capsys.readouterr().out == (
        "the warm unsynchronised reading claims 714 TFLOP/s; "
        "the NVIDIA H200's fp32 peak is 67 TFLOP/s, 11x less\n")
    _naive_reading(monkeypatch, "Tesla T4", 20e-6)  # no exponent in the rate on a T4
    assert capsys.readouterr().out == (
        "the warm unsynchronised reading claims 2,000 TFLOP/s; "
        "the Tesla T4's fp32 peak is 8.1 TFLOP/s, 247x less\n")
    _naive_reading(monkeypatch, "NVIDIA Future GPU", 56e-6)
    assert capsys.readouterr().out.endswith("the table has no fp32 peak for NVIDIA Future GPU\n")


def test_a_naive_reading_below_the_peak_fails_the_strict_run(monkeypatch) -> None:
    # 0.8 ms for 40 GFLOP is 50 TFLOP/s, below an H100's 67: still far below the real time
    # (5 ms, 0.16 of it), so only the claim about the peak is false.
    monkeypatch.setenv(checks.STRICT_ENV_VAR, "1")
    with pytest.raises(checks.ClaimNotMet, match="more than the fp32 peak"):
        _naive_reading(monkeypatch, "NVIDIA H100 80GB HBM3", 0.8e-3, median=5e-3)
