import math
import statistics
import time
import timeit

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


def test_benchmark_rejects_bad_arguments():
    with pytest.raises(ValueError):
        benchmark(lambda: None, min_run_time=0)
    with pytest.raises(ValueError):
        benchmark(lambda: None, min_runs=0)
    with pytest.raises(ValueError, match="meta"):
        benchmark(lambda: None, device="meta")


def test_benchmark_repeats_a_slow_call_until_it_has_enough_runs():
    calls = []

    def slow():
        calls.append(1)
        busy_until = time.perf_counter() + 0.02
        while time.perf_counter() < busy_until:
            pass

    # 0.02 s per call fits one run into min_run_time; min_runs asks for six
    result = benchmark(slow, warmup=0, min_run_time=0.001, min_runs=6)
    assert result.runs >= 6
    # one call sizes the blocks, one is the first block, five more blocks follow: no
    # untimed warm-up calls between them (Timer.timeit's two each made it 17 calls)
    assert 6 <= len(calls) <= 7, len(calls)


def test_benchmark_reports_torchs_own_statistics(monkeypatch):
    """Median, spread and the noise flag are torch.utils.benchmark's: its quantiles, over
    every run, so the flag agrees with torch's own variance warning."""
    import torch.utils.benchmark as tbench

    spec = tbench.Timer(stmt="pass")._task_spec  # what a real Timer labels its runs with

    more = iter([4.0, 5.0])

    class FakeTimer:  # three runs in the time given, then two more blocks on request
        def __init__(self, **kwargs):
            pass

        def blocked_autorange(self, min_run_time):
            return tbench.Measurement(1, [1.0, 2.0, 3.0], spec)

        def _timeit(self, number):
            return next(more) * number

    monkeypatch.setattr(timing.tbench, "Timer", FakeTimer)
    result = benchmark(lambda: None, warmup=0, min_runs=5)
    torch_view = tbench.Measurement(1, [1.0, 2.0, 3.0, 4.0, 5.0], spec)
    assert result.times == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert (result.median, result.iqr, result.mean) == (3.0, 2.0, 3.0)  # statistics: IQR 3
    assert (result.median, result.iqr) == (torch_view.median, torch_view.iqr)
    assert result.noisy == torch_view.has_warnings


def test_benchmark_falls_back_to_the_public_timeit_without_torchs_private_block(
        monkeypatch):
    """A newer torch may drop Timer._timeit (private): the extra runs then come from the
    public Timer.timeit, with the same statistics, not an AttributeError."""
    import torch.utils.benchmark as tbench

    spec = tbench.Timer(stmt="pass")._task_spec
    numbers = []

    class PublicOnlyTimer:  # no _timeit, no _task_spec: only torch's documented API
        def __init__(self, **kwargs):
            pass

        def blocked_autorange(self, min_run_time):
            return tbench.Measurement(2, [2.0, 4.0, 6.0], spec)  # blocks of two calls

        def timeit(self, number):
            numbers.append(number)
            return tbench.Measurement(number, [(3.0 + len(numbers)) * number], spec)

    monkeypatch.setattr(timing.tbench, "Timer", PublicOnlyTimer)
    result = benchmark(lambda: None, warmup=0, min_runs=5)
    assert numbers == [2, 2], "two more blocks of the first blocks' size"
    assert result.times == (1.0, 2.0, 3.0, 4.0, 5.0) and result.number_per_run == 2
    assert (result.median, result.iqr) == (3.0, 2.0)


def test_benchmark_times_the_extra_blocks_on_the_timers_clock_and_threads(monkeypatch):
    """The extra blocks run as blocked_autorange's do: on the clock given to the Timer (a
    GPU's synchronising one) and with the Timer's thread count, restored afterwards."""
    readings = []

    def clock():
        readings.append(torch.get_num_threads())
        return timeit.default_timer()

    monkeypatch.setattr(timing, "device_clock", lambda device: clock)

    def slow():
        busy_until = time.perf_counter() + 0.01
        while time.perf_counter() < busy_until:
            pass

    before = torch.get_num_threads()
    result = benchmark(slow, warmup=0, min_run_time=0.001, min_runs=4, num_threads=1)
    assert result.runs == 4 and result.number_per_run == 1
    assert min(result.times) >= 0.01, "each block's time is the call's, clock to clock"
    # the last three blocks were read twice each, with one thread
    assert len(readings) >= 6 and set(readings[-6:]) == {1}
    assert torch.get_num_threads() == before


def test_timing_flags_a_wide_spread():
    def timing_of(times):
        q = statistics.quantiles(times, n=4)
        return timing.Timing("t", "cpu", statistics.median(times), q[2] - q[0],
                             statistics.fmean(times), tuple(times))

    # three samples with a 17% spread: visible as noisy, not silent
    wide = timing_of([1.0, 1.17, 0.9])
    assert wide.noisy and "noisy" in str(wide) and wide.as_dict()["noisy"]
    steady = timing_of([1.0, 1.01, 0.99, 1.0, 1.02])
    assert not steady.noisy and "noisy" not in str(steady)
    assert f"{steady.relative_iqr:.0%} of the median" in str(steady)


def test_device_clock_reads_the_clock_and_is_plain_on_the_cpu():
    assert timing.device_clock("cpu") is timeit.default_timer
    clock = timing.device_clock(torch.device("cpu"))
    assert clock() <= clock()


def _clock_waits_for(device: torch.device) -> None:
    clock = timing.device_clock(device)
    a = torch.randn(4096, 4096, device=device)
    for _ in range(5):
        a = a @ a / 64
    clock()
    # after the clock has read, nothing queued on that GPU is still running
    assert torch.cuda.current_stream(device).query()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_clock_waits_for_the_current_gpu():
    _clock_waits_for(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_device_clock_waits_for_a_gpu_that_is_not_the_current_one():
    with torch.cuda.device(0):
        _clock_waits_for(torch.device("cuda:1"))


def test_synchronize_waits_only_for_the_device_it_names(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *device: waits.append(device))

    timing.synchronize("cpu")
    assert waits == [], "the CPU has nothing to wait for"
    timing.synchronize("cuda:1")
    assert waits == [(torch.device("cuda:1"),)], "the named GPU, not the current one"
    timing.synchronize(None)
    assert waits[-1] == (), "no device: the current accelerator"


def test_synchronize_without_a_gpu_waits_for_nothing(monkeypatch):
    cuda_waits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: cuda_waits.append(device))
    timing.synchronize(None)
    timing.synchronize("cpu")
    assert cuda_waits == []


def test_flops_helpers():
    assert matmul_flops(10000, 200, 10000) == 2 * 10000 * 200 * 10000
    assert tflops(2e12, 2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        matmul_flops(0, 1, 1)
    with pytest.raises(ValueError):
        tflops(1.0, 0.0)
    with pytest.raises(ValueError):
        tflops(1.0, math.inf)


# Names exactly as torch.cuda.get_device_name() prints them on each board.
@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("Tesla T4", "fp32", 8.1),
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "tf32", None),
        ("Tesla T4", "bf16", None),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L40", "fp32", 90.5),  # not the L4's 30.3
        ("NVIDIA L40", "bf16", 181.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA A10", "tf32", 62.5),
        ("NVIDIA A10G", "fp32", None),  # no datasheet: not the A10's figures
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100-PCIE-40GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),  # not the SXM's 989.4
        ("NVIDIA H200", "tf32", 494.5),
        ("NVIDIA H200 NVL", "fp32", 60.0),  # not the SXM's 67
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("nvidia h100 pcie ", "bf16", 756.0),  # case and surrounding spaces do not matter
        ("NVIDIA H100", "fp32", None),  # a partial name is not a GPU
        ("Tesla V100-SXM2-16GB", "fp32", 15.7),
        ("Tesla V100-PCIE-32GB", "fp16", 112.0),
        ("Tesla V100-PCIE-32GB", "tf32", None),
        ("Some Unknown GPU", "fp32", None),
    ],
)
def test_peak_table_lookup(name, dtype, expected):
    assert peak_tflops(name, dtype) == expected


def test_peak_table_has_sources_and_dense_figures():
    for key, fig in timing.PEAK_TFLOPS.items():
        assert key == fig.name, key
        assert fig.source.startswith("https://"), key
        for low, high in ((fig.fp32, fig.tf32), (fig.tf32, fig.bf16), (fig.fp32, fig.fp16)):
            if low is not None and high is not None:
                assert high >= low, key
        if fig.tf32 is not None and fig.bf16 is not None:
            # dense tensor-core bf16 is twice dense TF32 on every listed GPU; a sparse figure
            # copied by mistake for one of them breaks that ratio
            assert fig.bf16 == pytest.approx(2 * fig.tf32, rel=0.02), key


def test_share_of_peak():
    assert share_of_peak(494.7, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.5)
    assert share_of_peak(1.0, "mystery", "bf16") is None
    with pytest.raises(ValueError, match="unknown dtype"):
        peak_tflops("NVIDIA H100", "int8")






def test_the_inner_wait_asks_torch_accelerator_for_the_named_device(monkeypatch):
    # One call for every accelerator type (CUDA, ROCm, mps, xpu); nothing for the CPU.
    calls = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: calls.append(a))
    timing._synchronize(torch.device("cuda", 1))
    timing._synchronize(torch.device("mps", 0))
    timing._synchronize(torch.device("cpu"))
    assert calls == [(torch.device("cuda", 1),), (torch.device("mps", 0),)]
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    timing._synchronize(None)
    assert len(calls) == 2, "no accelerator: nothing to wait for"
