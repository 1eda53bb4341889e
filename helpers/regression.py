"""Linear regression on any device: the training loop chapter 4 writes out (chapter 4).

Chapter 4 (Linear regression, CPU vs GPU) fits ``y = x @ w.T + b`` to the data of the
tutorials it names (Wang Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3,
使用GPU训练模型*: n = 1,000,000 rows, w = [2, -3], b = 10, noise standard deviation 2) with
500 Adam steps on each device, each time from a fresh model with the same starting point. It
writes the training loop out in raw PyTorch first; :func:`fit_regression` is that loop, kept
here so the chapter's later runs and the book's benchmark (``bench/regression.py``) share it.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.models import LinearRegression
from helpers.timing import Timing, benchmark, synchronize

__all__ = ["LR", "N", "NOISE_STD", "REPEATS", "STEPS", "TRUE_B", "TRUE_W", "RegressionRun",
           "StepTraffic", "fit_regression", "regression_step", "step_timing", "step_traffic",
           "timing_data"]

#: The tutorials' problem and training recipe.
N, TRUE_W, TRUE_B, NOISE_STD = 1_000_000, (2.0, -3.0), 10.0, 2.0
STEPS, LR = 500, 0.1

#: Timed runs each way on an accelerator, alternating.
REPEATS = 5


@dataclass(frozen=True)
class RegressionRun:
    """What :func:`fit_regression` returns (chapter 4): time, loss per step and fitted values."""

    device: str
    seconds: float
    losses: torch.Tensor = field(repr=False)  # on the CPU, one value per step
    w: tuple[float, ...]
    b: float
    log_every_step: bool = False

    @property
    def final_loss(self) -> float:
        return float(self.losses[-1])


def regression_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                    x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One full-batch step; returns the loss, still on the device (chapter 4).

    Nothing in it makes the CPU wait for the GPU: Adam keeps its step count on the CPU, and
    the loss is not read. Chapter 4 checks that with ``torch.cuda.set_sync_debug_mode``.
    A target ``y`` whose shape differs from the prediction's raises a ``ValueError`` (the loss
    would broadcast the two silently, chapter 4's bug).
    """
    optimizer.zero_grad()
    prediction = model(x)
    if prediction.shape != y.shape:
        raise ValueError(f"the model predicts shape {tuple(prediction.shape)} but y has shape "
                         f"{tuple(y.shape)}; reshape y to match (for one target per row: "
                         "y.reshape(-1, 1)), or the loss broadcasts the two silently")
    loss = loss_fn(prediction, y)
    loss.backward()
    optimizer.step()
    return loss


@dataclass(frozen=True)
class StepTraffic:
    """What one :func:`regression_step` asks of its device (chapter 4), from
    :func:`step_traffic`."""

    operators: int  # operators run on the data's device, views excluded: about one kernel each
    bytes: int  # bytes of the tensors those operators read and write
    rows: int

    @property
    def bytes_per_row(self) -> float:
        return self.bytes / self.rows


def step_traffic(x: torch.Tensor, y: torch.Tensor) -> StepTraffic:
    """Count the operators one :func:`regression_step` runs on ``x``'s device and the bytes
    of the tensors they read and write (chapter 4).

    A fresh model takes one step first (Adam makes its state then); the second step is
    counted with a ``TorchDispatchMode``, which sees every operator autograd and the optimiser
    run, backward included. Views (``.T``, ``detach``) are skipped: they move no data and
    launch no kernel; so are operators on other devices (Adam's step count lives on the CPU).
    Each counted operator is about one kernel launch on a GPU. The bytes are what the
    operators' arguments and results hold, a lower bound on the traffic (no re-reads, no
    caches).
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    _check_data(x, y)
    model = LinearRegression(n_features=x.shape[1]).to(x.device, x.dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.MSELoss()
    regression_step(model, optimizer, loss_fn, x, y)
    counted = {"operators": 0, "bytes": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0]
                       if isinstance(t, torch.Tensor)]
            if not func.is_view and any(t.device == x.device for t in tensors):
                counted["operators"] += 1
                counted["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
            return out

    with Count():
        regression_step(model, optimizer, loss_fn, x, y)
    return StepTraffic(counted["operators"], counted["bytes"], x.shape[0])


def timing_data(n: int, device: torch.device | str,
                n_features: int = len(TRUE_W)) -> tuple[torch.Tensor, torch.Tensor]:
    """Regression data of ``n`` rows made on ``device`` itself, for timing only (chapter 4).

    Drawn on the device (no seed, no copy from the host), so that large sizes cost the host
    neither memory nor time; :func:`helpers.data.make_regression` makes the seeded data the
    chapter fits.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a whole number of rows >= 1, got {n!r}")
    x = torch.rand(int(n), n_features, device=device) * 20 - 10
    w = torch.tensor([TRUE_W[:n_features]], device=device)
    y = x @ w.T + TRUE_B + NOISE_STD * torch.randn(int(n), 1, device=device)
    return x, y


def step_timing(x: torch.Tensor, y: torch.Tensor, *, min_run_time: float = 0.5) -> Timing:
    """Median seconds of one :func:`regression_step` on ``x``, ``y`` (chapter 4), a fresh
    model's steps after one warm-up step, timed by :func:`helpers.timing.benchmark`."""
    _check_data(x, y)
    model = LinearRegression(n_features=x.shape[1]).to(x.device, x.dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.MSELoss()
    return benchmark(regression_step, model, optimizer, loss_fn, x, y, device=x.device,
                     label=f"regression step, n={x.shape[0]:,}", warmup=1,
                     min_run_time=min_run_time)


def fit_regression(x: torch.Tensor, y: torch.Tensor, *, steps: int = STEPS, lr: float = LR,
                   log_every_step: bool = False, progress: bool = False,
                   seed: int = 0) -> RegressionRun:
    """Fit a fresh :class:`~helpers.models.LinearRegression` to ``x``, ``y`` with full-batch Adam
    on the device the data lives on, and time the ``steps`` steps honestly (chapter 4).

    The losses are kept in a tensor on the device and copied to the CPU once at the end; with
    ``log_every_step`` the loop instead calls ``loss.item()`` every step, as logging loops
    often do, which makes the CPU wait for the GPU each time.

    ``x`` is ``[n, d]`` and ``y`` is ``[n, 1]``, both floating point, of one dtype (the model
    is made in it), on one device. Bad input raises a ``ValueError`` or ``TypeError`` that
    names it before any step runs.
    """
    _check_data(x, y)
    for name, value, low in (("steps", steps, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    if (isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr)
            or lr <= 0):
        raise ValueError(f"lr must be a positive learning rate such as {LR}, got {lr!r}")
    steps, seed = int(steps), int(seed)
    device = x.device
    model = LinearRegression(n_features=x.shape[1], seed=seed).to(device, x.dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    losses = torch.empty(steps, device=device, dtype=x.dtype)
    logged: list[float] = []
    steps_range = range(steps)
    if progress:
        from helpers.training import progress as progress_bar  # a text bar a page keeps

        steps_range = progress_bar(steps_range, desc=f"Adam on {device}", unit="step")

    synchronize(device)
    tic = time.perf_counter()
    for step in steps_range:
        loss = regression_step(model, optimizer, loss_fn, x, y)
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


def _check_data(x: object, y: object) -> None:
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; convert "
                            f"it with torch.as_tensor({name}, dtype=torch.float32)")
        if not t.is_floating_point():
            raise TypeError(f"{name} has dtype {t.dtype}; the regression needs floating point: "
                            f"pass {name}.float()")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must be an [n, d] matrix with at least one row and column, got "
                         f"shape {tuple(x.shape)}; a single feature is x.reshape(-1, 1)")
    if tuple(y.shape) != (x.shape[0], 1):
        raise ValueError(f"y must have shape [n, 1] = {(x.shape[0], 1)} to match x's "
                         f"{x.shape[0]} rows, got {tuple(y.shape)}; for a 1-D target use "
                         "y.reshape(-1, 1) (a [n] target against an [n, 1] prediction "
                         "broadcasts to [n, n])")
    if x.dtype != y.dtype:
        raise TypeError(f"x is {x.dtype} but y is {y.dtype}; convert one to the other, e.g. "
                        "y.to(x.dtype)")
    if x.device != y.device:
        raise ValueError(f"x is on {x.device} but y is on {y.device}; move both to one device")
    if x.device.type == "meta":
        raise ValueError("x and y are on the meta device, which holds no data, so there is "
                         "nothing to fit; move them to a device that computes, such as 'cpu'")
