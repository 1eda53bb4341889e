"""The ``matmul`` and ``regression`` benchmark workloads (chapters 3 and 4), quick runs on the CPU."""

from __future__ import annotations

import contextlib
import math
import types
import warnings

import pytest
import torch

from bench import core
from bench import matmul as bench_matmul
from bench import regression as bench_regression
from helpers import matmul, regression
from helpers.models import LinearRegression


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
                        "cpu_gflops_1thread", "cpu_gflops_all_threads"}
    assert got["cpu_tutorial_product_seconds"].unit == "s"
    for name in ("cpu_tutorial_product_gflops", "cpu_gflops_1thread", "cpu_gflops_all_threads"):
        assert got[name].unit == "GFLOP/s"
    for fig in figures:
        assert fig.value > 0, fig
    # seconds and GFLOP/s of the same product agree: 2*m*k*n flops
    flops = 2 * 1000 * 200 * 1000
    gflops = flops / got["cpu_tutorial_product_seconds"].value / 1e9
    assert gflops == pytest.approx(got["cpu_tutorial_product_gflops"].value, rel=1e-9)


def test_fp32_precision_restores_the_setting() -> None:
    before = torch.backends.cuda.matmul.fp32_precision
    with matmul.fp32_precision("tf32"):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before
    with pytest.raises(ValueError):
        with matmul.fp32_precision("fp16"):
            pass


def test_time_matmul_with_and_without_copy_on_cpu() -> None:
    for include_copy in (False, True):
        timing, tf = matmul.time_matmul(64, 32, 16, "cpu", include_copy=include_copy,
                                              warmup=1, min_run_time=0.01)
        assert timing.median > 0 and tf > 0
    assert matmul.supported_modes("cpu") == ["fp32"]
    with pytest.raises(ValueError):
        matmul.time_matmul(4, 4, 4, "cpu", mode="fp8")


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


def test_sweep_sizes_keep_a_tenth_of_the_named_gpus_memory(monkeypatch) -> None:
    # cuda:0 a T4 (15 GB), cuda:1 an H100 (80 GB): the rule asks the GPU it is given.
    totals = {0: 15_637_086_208, 1: 85_045_231_616}
    asked = []

    def properties(device=None):
        index = torch.device(device).index
        asked.append(index)
        return types.SimpleNamespace(total_memory=totals[index])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    t4 = matmul.sweep_sizes("cuda:0")
    h100 = matmul.sweep_sizes(torch.device("cuda:1"))
    assert asked == [0, 1]
    assert t4[-1] == 8192 and h100[-1] == 16384  # 3 * 16384**2 * 4 bytes = 3 GiB
    assert t4 == [s for s in matmul.SWEEP_SIZES if s <= 8192]
    for total, sizes in ((totals[0], t4), (totals[1], h100)):
        assert all(3 * s * s * 4 <= total / 10 for s in sizes)
    assert matmul.sweep_sizes("cuda:0", [1024, 4096, 8192, 16384]) == [1024, 4096, 8192]


def test_sweep_sizes_on_a_mac_and_where_memory_is_unknown(monkeypatch) -> None:
    # An 8 GB Mac: Metal recommends about 5.3 GiB for one process, so 16384 (3 GiB) is out.
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 5_726_633_984)
    assert matmul.sweep_sizes("mps")[-1] == 4096
    assert matmul.sweep_sizes("cpu")[-1] == matmul.UNKNOWN_MEMORY_LARGEST
    with pytest.raises(ValueError, match="positive"):
        matmul.sweep_sizes("cpu", [0, 64])
    with pytest.raises(ValueError, match="positive"):
        matmul.sweep_sizes("cpu", [])


def test_train_step_returns_the_loss_before_the_update() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64, 2), torch.randn(64, 1)
    model = LinearRegression()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    before = [p.detach().clone() for p in model.parameters()]
    expected = loss_fn(model(x), y).detach()
    loss = regression.train_step(model, optimizer, loss_fn, x, y)
    torch.testing.assert_close(loss.detach(), expected)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    # fit_regression runs the same steps from the same start
    run = regression.fit_regression(x, y, steps=1, lr=0.1)
    torch.testing.assert_close(run.losses[0], expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_training_step_waits_for_the_gpu_only_when_it_reads_the_loss() -> None:
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    x, y = torch.randn(4096, 2, device=device), torch.randn(4096, 1, device=device)
    model = LinearRegression().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    losses = torch.empty(1, device=device)
    regression.train_step(model, optimizer, loss_fn, x, y)  # creates Adam's state
    with torch.cuda.device(device):
        torch.cuda.set_sync_debug_mode("error")
        try:
            losses[0] = regression.train_step(model, optimizer, loss_fn, x, y).detach()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                regression.train_step(model, optimizer, loss_fn, x, y).item()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert any("synchroniz" in str(w.message).lower() for w in caught)


def test_fit_regression_refuses_data_split_across_devices() -> None:
    x, y = torch.zeros(4, 2), torch.zeros(4, 1, device="meta")
    with pytest.raises(ValueError, match="one device"):
        regression.fit_regression(x, y, steps=1)


def test_fit_regression_logging_every_step_gives_the_same_losses() -> None:
    x, y = torch.randn(256, 2), torch.randn(256, 1)
    quiet = regression.fit_regression(x, y, steps=20)
    logged = regression.fit_regression(x, y, steps=20, log_every_step=True)
    assert quiet.losses.shape == logged.losses.shape == (20,)
    torch.testing.assert_close(quiet.losses, logged.losses)
    assert logged.log_every_step and not quiet.log_every_step


def test_time_matmul_with_a_fresh_output_too() -> None:
    timing, tf = matmul.time_matmul(64, 32, 16, "cpu", preallocate=False, warmup=1,
                                          min_run_time=0.01, min_runs=2)
    assert timing.runs >= 2 and tf > 0
    assert matmul.supported_modes("meta") == ["fp32"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_supported_modes_ask_about_the_named_gpu() -> None:
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        ampere = torch.cuda.get_device_capability(device) >= (8, 0)
        modes = matmul.supported_modes(device)
        assert ("tf32" in modes) == ampere, (device, modes)
        assert ("bf16" in modes) == (ampere or bool(torch.version.hip)), (device, modes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("workload", [bench_matmul.run, bench_regression.run])
def test_quick_workloads_on_the_last_gpu(workload) -> None:
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    figures = _by_name(workload(device, quick=True))
    gpu = [f for f in figures.values() if f.device != "cpu"]
    assert gpu and all(f.device == str(device) for f in gpu)
    assert all(math.isfinite(f.value) for f in figures.values())


def test_supported_modes_asks_about_the_named_gpu_not_the_current_one(monkeypatch) -> None:
    # Two fake GPUs: cuda:0 (current) is a T4, cuda:1 an H100. torch.cuda.is_bf16_supported()
    # takes no device and answers for the current one, so the helper must make cuda:1 current.
    caps = {0: (7, 5), 1: (9, 0)}
    current = [0]

    @contextlib.contextmanager
    def make_current(device):
        old, current[0] = current[0], torch.device(device).index
        try:
            yield
        finally:
            current[0] = old

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: caps[torch.device(device).index])
    monkeypatch.setattr(torch.cuda, "device", make_current)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: caps[current[0]] >= (8, 0))
    assert matmul.supported_modes("cuda:1") == ["fp32", "tf32", "bf16"]
    assert matmul.supported_modes("cuda:0") == ["fp32"]
    assert current == [0], "the current GPU is restored"
