"""The benchmark's workloads (bench/<workload>.py): registered, and quick runs on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from bench import core, cuda_semantics
from bench import matmul as bench_matmul
from bench import recipes as bench_recipes
from bench import regression as bench_regression
from helpers import recipes


def _by_name(figures: list[core.Figure]) -> dict[str, core.Figure]:
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), f"figure names repeat: {names}"
    return {f.name: f for f in figures}


def _check_common(figures: list[core.Figure]) -> None:
    assert figures, "a workload must return figures"
    for fig in figures:
        assert isinstance(fig, core.Figure)
        assert fig.name == fig.name.lower() and " " not in fig.name, fig.name
        assert fig.unit.strip(), f"{fig.name} has no unit"
        assert math.isfinite(fig.value), f"{fig.name} = {fig.value}"
        assert fig.spread is None or (math.isfinite(fig.spread) and fig.spread >= 0), fig
        assert fig.device == "cpu", fig
        assert fig.note.startswith("quick run"), f"{fig.name}: quick figures must say so"


def test_importing_the_modules_registers_both_workloads() -> None:
    assert core.WORKLOADS["matmul"].fn is bench_matmul.run
    assert core.WORKLOADS["matmul"].chapter == 3
    assert core.WORKLOADS["regression"].fn is bench_regression.run
    assert core.WORKLOADS["regression"].chapter == 4


def test_matmul_quick_on_cpu() -> None:
    threads = torch.get_num_threads()
    figures = bench_matmul.run(torch.device("cpu"), quick=True)
    assert torch.get_num_threads() == threads, "the thread count must be restored"
    _check_common(figures)
    got = _by_name(figures)
    assert set(got) == {"cpu_tutorial_product_seconds", "cpu_tutorial_product_gflops",
                        "cpu_gflops_1thread", "cpu_gflops_all_threads",
                        "cpu_fp32_burst_gflops", "cpu_fp32_sustained_gflops"}
    assert got["cpu_tutorial_product_seconds"].unit == "s"
    for name in ("cpu_tutorial_product_gflops", "cpu_gflops_1thread", "cpu_gflops_all_threads",
                 "cpu_fp32_burst_gflops", "cpu_fp32_sustained_gflops"):
        assert got[name].unit == "GFLOP/s"
    for fig in figures:
        assert fig.value > 0, fig
    # seconds and GFLOP/s of the same product agree: 2*m*k*n flops
    flops = 2 * 1000 * 200 * 1000
    gflops = flops / got["cpu_tutorial_product_seconds"].value / 1e9
    assert gflops == pytest.approx(got["cpu_tutorial_product_gflops"].value, rel=1e-9)


def test_regression_quick_on_cpu() -> None:
    figures = bench_regression.run(torch.device("cpu"), quick=True)
    _check_common(figures)
    got = _by_name(figures)
    assert set(got) == {"cpu_seconds", "cpu_final_loss", "cpu_w0", "cpu_w1", "cpu_b"}
    assert got["cpu_seconds"].unit == "s" and got["cpu_seconds"].value > 0
    # 20,000 rows: standard errors about 0.0025 (w) and 0.014 (b); these bounds are generous
    assert got["cpu_w0"].value == pytest.approx(2.0, abs=0.05)
    assert got["cpu_w1"].value == pytest.approx(-3.0, abs=0.05)
    assert got["cpu_b"].value == pytest.approx(10.0, abs=0.1)
    assert got["cpu_final_loss"].value == pytest.approx(4.0, abs=0.3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("workload", [bench_matmul.run, bench_regression.run])
def test_quick_workloads_on_the_last_gpu(workload) -> None:
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    figures = _by_name(workload(device, quick=True))
    gpu = [f for f in figures.values() if f.device != "cpu"]
    assert gpu and all(f.device == str(device) for f in gpu)
    assert all(math.isfinite(f.value) for f in figures.values())




def test_importing_the_recipes_module_registers_its_workload() -> None:
    assert core.WORKLOADS["recipes"].fn is bench_recipes.run
    assert core.WORKLOADS["recipes"].chapter == 12


def test_recipes_quick_run_on_cpu() -> None:
    figures = bench_recipes.run(torch.device("cpu"), quick=True)
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), names
    got = {f.name: f for f in figures}
    for recipe in recipes.recipes_for(torch.device("cpu")):
        for prefix in ("", "resnet_"):  # the chapter 5 CNN and the residual CNN
            assert got[f"{prefix}{recipe}_step_ms"].unit == "ms"
            assert got[f"{prefix}{recipe}_speedup"].unit == "x"
    assert got["plain_speedup"].value == pytest.approx(1.0)
    assert got["resnet_plain_speedup"].value == pytest.approx(1.0)
    assert got["plain_step_ms"].note == ("quick run, MnistCNN training step, Adam, batch "
                                         f"{bench_recipes.QUICK_BATCH_SIZE}")
    width, batch = recipes.RESNET_SMALL_SIZE
    assert f"ResidualCNN(width={width}) training step, Adam, batch {batch}" in \
        got["resnet_plain_step_ms"].note
    assert not any("gpu_busy" in name or "compile" in name for name in got), sorted(got)
    for fig in figures:
        assert isinstance(fig, core.Figure) and fig.device == "cpu"
        assert math.isfinite(fig.value) and fig.value > 0, fig
        assert fig.note.startswith("quick run"), fig


def test_cuda_semantics_workload_on_cpu_measures_only_the_launch() -> None:
    assert core.WORKLOADS["cuda_semantics"].fn is cuda_semantics.run
    assert core.WORKLOADS["cuda_semantics"].chapter == 11
    figures = cuda_semantics.run(torch.device("cpu"), quick=True)
    assert [f.name for f in figures] == ["launch_ms", "matmul_done_ms"]
    assert all(f.device == "cpu" and f.value > 0 and f.note.startswith("quick run") for f in figures)




def test_cpu_workload_figures_do_not_include_the_cuda_only_ones() -> None:
    names = [f.name for f in cuda_semantics.run(torch.device("cpu"), quick=True)]
    assert names == ["launch_ms", "matmul_done_ms"], "the two figures every device measures"



def test_regression_bound_figures_conform_and_add_up_on_the_cpu() -> None:
    # The GPU-only part of the regression workload (chapter 4's "what limits the speed-up"),
    # run on the CPU: its figures agree with each other and say they are quick.
    figures = bench_regression._bound_figures(torch.device("cpu"), 20_000, "quick run: ",
                                              quick=True)
    got = _by_name(figures)
    assert set(got) == {
        "step_operators", "step_bytes_per_row", "gpu_copy_bandwidth", "gpu_launch_seconds",
        "gpu_read_step_seconds", "gpu_step_seconds_n1000", "gpu_step_seconds_n1000000",
        "gpu_step_seconds_large"}
    assert got["step_operators"].value >= 7  # forward, loss, backward and Adam's updates
    # x (8 bytes a row) and y (4) are read at least once, and the prediction written
    assert got["step_bytes_per_row"].value >= 16
    # counted at n rows, as chapter 4 counts them: at 1,000 a step's fixed bytes (the
    # parameters and Adam's state) add 0.3 bytes a row
    from helpers.regression import step_traffic, timing_data

    at_n = step_traffic(*timing_data(20_000, "cpu")).bytes_per_row
    assert got["step_bytes_per_row"].value == pytest.approx(at_n, rel=1e-9)
    # a read's cost is a difference of two medians: the two timings carry their spreads,
    # and no difference is recorded as a figure (chapter 4 decides with compare)
    for name in ("gpu_launch_seconds", "gpu_read_step_seconds"):
        assert got[name].value > 0 and got[name].spread is not None and got[name].spread >= 0
    assert "n=20,000" in got["gpu_step_seconds_n1000000"].note
    large_n = int(got["gpu_step_seconds_large"].note.rsplit("n=", 1)[1].replace(",", ""))
    assert large_n in {20_000 * f for f in (10, 30, 100, 300)}
    _check_common(figures)


def test_cuda_semantics_runs_the_two_error_processes_side_by_side(monkeypatch) -> None:
    # The GPU branch's last figures, with the reports a GPU gives faked: one call of
    # async_error_reports (both processes at once), its pair in order, each one's lines late.
    from helpers.cuda_semantics import AsyncErrorReport

    calls = []

    def fake_reports(device):
        calls.append(device)
        return (AsyncErrorReport(5, 7, "torch.AcceleratorError: CUDA error: device-side "
                                       "assert triggered", ""),
                AsyncErrorReport(5, 5, "torch.AcceleratorError: CUDA error: device-side "
                                       "assert triggered", ""))

    monkeypatch.setattr(cuda_semantics, "async_error_reports", fake_reports)
    device = torch.device("cuda", 0)
    figures = cuda_semantics._async_error_figures(device, "")
    assert calls == [device]
    got = {f.name: f for f in figures}
    assert list(got) == ["async_error_lines_late", "launch_blocking_error_lines_late"]
    assert got["async_error_lines_late"].value == 2.0
    assert got["launch_blocking_error_lines_late"].value == 0.0
    assert all(f.device == "cuda:0" and f.unit == "lines" and "device-side assert" in f.note
               for f in figures)


def test_the_full_regression_run_times_what_bounds_a_step_in_short_blocks(monkeypatch) -> None:
    # helpers.timing.benchmark times at least five blocks, each ten times the last until it
    # passes min_run_time (or the clock's cost is under 0.01% of it). The regression's bound
    # figures (its GPU branch) in a full run on the CPU, the timings faked: each with
    # MIN_RUN_TIME, five blocks of 10-100 ms.
    seen = []

    def fake_benchmark(fn, *args, min_run_time, **kwargs):
        seen.append(("benchmark", kwargs.get("label"), min_run_time))
        return type("T", (), {"median": 1e-5, "iqr": 1e-7})()

    def fake_step_timing(x, y, *, min_run_time):
        seen.append(("step", x.shape[0], min_run_time))
        return type("T", (), {"median": 1e-4, "iqr": 1e-6})()

    monkeypatch.setattr(bench_regression, "benchmark", fake_benchmark)
    monkeypatch.setattr(bench_regression, "step_timing", fake_step_timing)
    monkeypatch.setattr(bench_regression, "timing_data",
                        lambda n, device: (torch.zeros(min(n, 4), 2), torch.zeros(min(n, 4), 1)))
    bench_regression._bound_figures(torch.device("cpu"), 1_000_000, "")
    assert [s[2] for s in seen] == [bench_regression.MIN_RUN_TIME] * 6, seen
    assert bench_regression.MIN_RUN_TIME == 0.01
    assert [s[1] for s in seen if s[0] == "benchmark"] == ["copy", "launch", "read"]


def test_the_full_matmul_run_times_short_blocks_and_two_sustained_seconds(monkeypatch) -> None:
    # The GPU branch on the CPU with its measurements faked: the tutorial product, its copy
    # and every size of the sweep timed with GPU_MIN_RUN_TIME (five blocks of 10-100 ms of
    # products), each format's sustained run SUSTAINED_SECONDS long, as chapter 3's.
    from helpers.matmul import MatmulRate, Telemetry

    timed, sustained = [], []

    def fake_time_matmul(m, k, n, device, mode="fp32", *, min_run_time, **kwargs):
        timed.append((m, mode, min_run_time))
        return type("T", (), {"median": 1e-3, "iqr": 1e-5})(), 100.0

    def fake_rate(kind):
        def rate(device, mode, shapes, *, seconds=None, idle=None):
            shape = tuple(shapes[0]) if kind == "burst" else tuple(shapes)
            if kind == "sustained":
                sustained.append((mode, seconds))
            return MatmulRate(kind, mode, str(device), shape, 100.0, 10, 1.0,
                              Telemetry(None, None, None, None, "faked"), {shape: 100.0})
        return rate

    monkeypatch.setattr(bench_matmul, "time_matmul", fake_time_matmul)
    monkeypatch.setattr(bench_matmul, "burst_rate", fake_rate("burst"))
    monkeypatch.setattr(bench_matmul, "sustained_rate", fake_rate("sustained"))
    monkeypatch.setattr(bench_matmul, "supported_modes", lambda device: ["fp32", "bf16"])
    monkeypatch.setattr(bench_matmul, "sweep_sizes", lambda device, sizes: list(sizes))
    monkeypatch.setattr(bench_matmul, "_naive_seconds", lambda a, b: 1e-5)
    monkeypatch.setattr(bench_matmul, "TUTORIAL_SHAPE", (100, 20, 100))  # a small warm-up
    figures = bench_matmul._gpu_figures(torch.device("cpu"), False, 0.03)
    assert {t[2] for t in timed} == {bench_matmul.GPU_MIN_RUN_TIME} == {0.01}
    assert len(timed) == 2 + 2 * 4, timed  # the tutorial product twice, 2 modes x 4 sizes
    assert sustained == [("fp32", 2.0), ("bf16", 2.0)]
    assert bench_matmul.SUSTAINED_SECONDS == 2.0 and bench_matmul.CPU_SUSTAINED_SECONDS == 0.5
    assert {"fp32_tflops_n16384", "bf16_sustained_tflops"} <= {f.name for f in figures}


@pytest.mark.parametrize(("call_s", "min_run_time", "per_block", "blocks"), [
    (0.392e-3, bench_matmul.GPU_MIN_RUN_TIME, 100, 5),  # tf32 n=4096 on the H200
    (13.5e-6, bench_matmul.GPU_MIN_RUN_TIME, 1_000, 5),  # tf32 n=1024
    (166.6e-3, bench_matmul.GPU_MIN_RUN_TIME, 1, 5),  # fp32 n=16384: five products
    (6e-6, bench_regression.MIN_RUN_TIME, 10_000, 5),  # a tiny launch
    (1.6e-3, bench_recipes.MIN_RUN_TIME, 100, 5),  # chapter 5's CNN, bound by the host
    (15.2e-3, bench_recipes.RESNET_MIN_RUN_TIME, 1, 5),  # the residual CNN
    (0.31e-3, cuda_semantics.REPLAY_MIN_RUN_TIME, 100, 5),  # chapter 11's graph replay
    (1.6e-3, cuda_semantics.EAGER_MIN_RUN_TIME, 100, 5),  # and its eager step
    (0.392e-3, 0.5, 1_000, 5),  # the former 0.5 s: blocks of 0.39 s, 2 s a timing
])
def test_the_windows_make_the_blocks_the_notes_say(monkeypatch, call_s, min_run_time,
                                                    per_block, blocks) -> None:
    # helpers.timing.benchmark on a faked GPU clock (each reading costs 4 us, a synchronise;
    # each call takes call_s): torch's Timer picks the block size, as on an H200.
    from helpers import timing

    now = [0.0]

    def clock() -> float:
        now[0] += 4e-6
        return now[0]

    def call() -> None:
        now[0] += call_s

    monkeypatch.setattr(timing, "device_clock", lambda device: clock)
    monkeypatch.setattr(timing, "cpu_load", lambda threads: timing.CpuLoad(None, 2, threads))
    t = timing.benchmark(call, device="cpu", warmup=0, min_run_time=min_run_time)
    assert (t.number_per_run, len(t.times)) == (per_block, blocks)
    assert t.median == pytest.approx(call_s, rel=1e-3)
