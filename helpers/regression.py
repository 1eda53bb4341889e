"""Linear regression on any device: the training loop chapter 4 writes out (chapter 4).

Chapter 4 (Linear regression, CPU vs GPU) fits ``y = x @ w.T + b`` to the data of the
tutorials it names (Wang Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3,
使用GPU训练模型*: n = 1,000,000 rows, w = [2, -3], b = 10, noise standard deviation 2) with
500 Adam steps on each device, each time from a fresh model with the same starting point. It
writes the training loop out in raw PyTorch first; :func:`fit_regression` is that loop, kept
here so the chapter's later runs and the book's benchmark (``bench/regression.py``) share it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.models import LinearRegression
from helpers.timing import synchronize

__all__ = ["LR", "N", "NOISE_STD", "REPEATS", "STEPS", "TRUE_B", "TRUE_W", "RegressionRun",
           "fit_regression", "train_step"]

#: The tutorials' problem and training recipe.
N, TRUE_W, TRUE_B, NOISE_STD = 1_000_000, (2.0, -3.0), 10.0, 2.0
STEPS, LR = 500, 0.1

#: Timed runs each way on an accelerator, alternating.
REPEATS = 5


@dataclass(frozen=True)
class RegressionRun:
    """What :func:`fit_regression` returns: the time, the loss per step and the fitted values."""

    device: str
    seconds: float
    losses: torch.Tensor = field(repr=False)  # on the CPU, one value per step
    w: tuple[float, ...]
    b: float
    log_every_step: bool = False

    @property
    def final_loss(self) -> float:
        return float(self.losses[-1])


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
               x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One full-batch step; returns the loss, still on the device (chapter 4).

    Nothing in it makes the CPU wait for the GPU: Adam keeps its step count on the CPU, and
    the loss is not read. Chapter 4 checks that with ``torch.cuda.set_sync_debug_mode``.
    """
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def fit_regression(x: torch.Tensor, y: torch.Tensor, *, steps: int = STEPS, lr: float = LR,
                   log_every_step: bool = False, progress: bool = False,
                   seed: int = 0) -> RegressionRun:
    """Fit a fresh :class:`~helpers.models.LinearRegression` to ``x``, ``y`` with full-batch Adam
    on the device the data lives on, and time the ``steps`` steps honestly (chapter 4).

    The losses are kept in a tensor on the device and copied to the CPU once at the end; with
    ``log_every_step`` the loop instead calls ``loss.item()`` every step, as logging loops
    often do, which makes the CPU wait for the GPU each time.
    """
    if x.device != y.device:
        raise ValueError(f"x is on {x.device} but y is on {y.device}; move both to one device")
    device = x.device
    model = LinearRegression(n_features=x.shape[1], seed=seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    losses = torch.empty(steps, device=device)
    logged: list[float] = []
    steps_range = range(steps)
    if progress:
        from tqdm.auto import tqdm

        steps_range = tqdm(steps_range, desc=f"Adam on {device}", unit="step")

    synchronize(device)
    tic = time.perf_counter()
    for step in steps_range:
        loss = train_step(model, optimizer, loss_fn, x, y)
        if log_every_step:
            logged.append(loss.item())
        else:
            losses[step] = loss.detach()
    synchronize(device)
    seconds = time.perf_counter() - tic

    history = torch.tensor(logged) if log_every_step else losses.cpu()
    w = tuple(float(v) for v in model.w.detach().cpu().ravel())
    return RegressionRun(str(device), seconds, history, w, float(model.b.detach().cpu()),
                         log_every_step)
