"""The ``matmul`` and ``regression`` benchmark workloads (chapters 3 and 4), quick runs on the CPU."""

from __future__ import annotations

import pytest
import torch

from helpers import regression
from helpers.cuda_semantics import sync_debug
from helpers.models import LinearRegression


def test_regression_step_returns_the_loss_before_the_update() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64, 2), torch.randn(64, 1)
    model = LinearRegression()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    before = [p.detach().clone() for p in model.parameters()]
    expected = loss_fn(model(x), y).detach()
    loss = regression.regression_step(model, optimizer, loss_fn, x, y)
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
    regression.regression_step(model, optimizer, loss_fn, x, y)  # creates Adam's state
    with sync_debug(device, "error"):  # any synchronising call in the step raises
        losses[0] = regression.regression_step(model, optimizer, loss_fn, x, y).detach()
    with sync_debug(device) as calls:
        regression.regression_step(model, optimizer, loss_fn, x, y).item()
    assert len(calls) == 1, calls  # the read, and not torch's one-time notice


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


def test_step_traffic_counts_the_operators_and_bytes_of_one_step() -> None:
    # Chapter 4 decides launch-bound or bytes-bound from these counts.
    x, y = regression.timing_data(1_000, "cpu")
    small, large = regression.step_traffic(x, y), regression.step_traffic(
        *regression.timing_data(4_000, "cpu"))
    assert small.operators == large.operators >= 7  # a fixed count, whatever the size
    assert small.bytes_per_row >= 16  # x (8 bytes a row) and y (4) read, a prediction written
    # bytes grow with the rows: all but the parameters' share scales 4x
    assert 3.9 < large.bytes / small.bytes < 4.0
    assert x.shape == (1_000, 2) and y.shape == (1_000, 1)


def test_step_timing_times_one_step() -> None:
    timing = regression.step_timing(*regression.timing_data(1_000, "cpu"), min_run_time=0.05)
    assert timing.median > 0 and "n=1,000" in timing.label


def test_step_traffic_counts_the_backward_pass_too() -> None:
    # The forward pass moves 28 bytes a row: the product reads x (8) and writes the
    # prediction (4), the bias add reads and writes it (8), the loss reads it and y (8).
    # The backward reads the prediction, y and x again and writes gradients: as much again,
    # so a count that missed it would stay near 28. (On a GPU autograd runs the backward in
    # its device thread; the counting mode reaches it through the thread-local state autograd
    # carries into that thread, at::ThreadLocalState in torch 2.9 to 2.14.)
    traffic = regression.step_traffic(*regression.timing_data(10_000, "cpu"))
    assert traffic.bytes_per_row >= 50, traffic


def test_fit_regression_shows_progress_with_the_books_text_bar(monkeypatch) -> None:
    # tqdm.auto's ipywidgets bar is blank on a built page; helpers.training.progress is not
    import helpers.training

    seen = []

    def fake_progress(iterable, **kwargs):
        seen.append(kwargs)
        return iterable

    monkeypatch.setattr(helpers.training, "progress", fake_progress)
    x, y = torch.randn(8, 2), torch.randn(8, 1)
    regression.fit_regression(x, y, steps=3, progress=True)
    assert seen == [{"desc": "Adam on cpu", "unit": "step"}]
