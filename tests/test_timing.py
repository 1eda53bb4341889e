import math

import pytest
import torch

from helpers import timing
from helpers.timing import benchmark, matmul_flops, peak_tflops, share_of_peak, tflops


def test_benchmark_returns_median_and_spread():
    a = torch.randn(64, 64)
    result = benchmark(torch.matmul, a, a, device="cpu", label="mm", min_run_time=0.05)
    assert result.label == "mm" and result.device == "cpu"
    assert result.runs >= 1
    assert 0 < result.median < 1
    assert result.iqr >= 0
    assert min(result.times) <= result.median <= max(result.times)
    assert "median" in str(result)
    assert result.as_dict()["median_s"] == result.median


def test_benchmark_warms_up_before_timing():
    calls = []

    def f():
        calls.append(1)

    benchmark(f, device="cpu", warmup=5, min_run_time=0.01)
    assert len(calls) > 5


def test_benchmark_sees_slower_work_as_slower():
    small, big = torch.randn(32, 32), torch.randn(384, 384)
    t_small = benchmark(torch.matmul, small, small, min_run_time=0.05)
    t_big = benchmark(torch.matmul, big, big, min_run_time=0.05)
    # 1,728x the arithmetic: even on a busy machine the ordering cannot flip.
    assert t_big.median > t_small.median


def test_benchmark_rejects_bad_arguments():
    with pytest.raises(ValueError):
        benchmark(lambda: None, min_run_time=0)


def test_synchronize_is_safe_everywhere():
    timing.synchronize("cpu")
    timing.synchronize(None)


def test_flops_helpers():
    assert matmul_flops(10000, 200, 10000) == 2 * 10000 * 200 * 10000
    assert tflops(2e12, 2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        matmul_flops(0, 1, 1)
    with pytest.raises(ValueError):
        tflops(1.0, 0.0)
    with pytest.raises(ValueError):
        tflops(1.0, math.inf)


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "tf32", 494.7),
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "bf16", None),
        ("NVIDIA L4", "bf16", 121.0),
        ("Some Unknown GPU", "fp32", None),
    ],
)
def test_peak_table_lookup(name, dtype, expected):
    assert peak_tflops(name, dtype) == expected


def test_peak_table_has_sources_and_dense_figures():
    for key, fig in timing.PEAK_TFLOPS.items():
        assert fig.source.startswith("https://"), key
        if fig.bf16 is not None:
            assert fig.bf16 >= fig.fp32, key


def test_share_of_peak():
    assert share_of_peak(494.7, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.5)
    assert share_of_peak(1.0, "mystery", "bf16") is None
    with pytest.raises(ValueError, match="unknown dtype"):
        peak_tflops("NVIDIA H100", "int8")
