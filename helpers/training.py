"""The book's training loop, written out by hand in chapter 5 and reused from then on.

Introduced in chapter 5 (MNIST, CPU vs GPU). Chapter 6 adds a learning-rate scheduler
stepped on the validation loss; chapters 10 and 12 compare other trainers and recipes
against it.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pandas as pd
import torch
import torchmetrics
from torch import nn
from tqdm.std import tqdm as _TerminalBar

from .devices import resolve_device
from .timing import synchronize

__all__ = ["EarlyStopping", "accuracy_metric", "default_non_blocking", "evaluate", "fit",
           "predict", "progress", "train_epoch", "train_step"]

Batch = tuple[torch.Tensor, torch.Tensor]


# -- progress a static page can show ---------------------------------------------------------

#: The width of a notebook's progress line: within the book's 88 columns.
PROGRESS_COLUMNS = 80

# The terminal's cursor moves tqdm writes around a nested bar (position 1 and below):
# a notebook line has no cursor, and shown as text they would replace the bar.
_CURSOR_MOVES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _ProgressLine:
    """A file for tqdm that keeps one line of text in a notebook output, updated in place.

    tqdm writes each state of the bar after a carriage return; this keeps the last non-blank
    state and shows it as one ``text/plain`` display, updated through its display id. Jupyter
    and Colab update that output live, and an executed notebook stores its final state, which
    the built book shows (``tqdm.auto``'s ipywidgets bar is blank on a static page).
    """

    def __init__(self) -> None:
        self.handle: Any = None
        self.text = ""

    def write(self, text: str) -> None:
        from IPython.display import display

        text = _CURSOR_MOVES.sub("", text)
        states = [part.rstrip() for part in text.replace("\n", "\r").split("\r")]
        states = [part for part in states if part]
        if not states or states[-1] == self.text:
            return  # a clearing write (leave=False) keeps the last state on the page
        self.text = states[-1]
        if self.handle is None:
            self.handle = display({"text/plain": self.text}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": self.text}, raw=True)

    def flush(self) -> None:
        pass


class _PageBar(_TerminalBar):
    """tqdm's text bar on a :class:`_ProgressLine`; closing shows the final count."""

    def close(self) -> None:
        if not self.disable and not self.leave and hasattr(self, "last_print_n"):
            self.refresh()  # the last state, before tqdm clears a leave=False bar
        super().close()


# One line per notebook cell: every bar a cell opens (an epoch bar, then its batch bars)
# writes into it, so the page keeps one line, the last bar's final state.
_LINE: dict[str, Any] = {"cell": None, "line": None}


def _notebook_line() -> _ProgressLine | None:
    """The current cell's progress line inside a Jupyter kernel, else None."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - the book's environments all have IPython
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    cell = getattr(shell, "execution_count", None)
    if _LINE["cell"] != cell or _LINE["line"] is None:
        _LINE.update(cell=cell, line=_ProgressLine())
    return _LINE["line"]


def progress(iterable: Iterable[Any] | None = None, *, desc: str | None = None,
             total: float | None = None, leave: bool = True, disable: bool = False,
             **kwargs: Any) -> _TerminalBar:
    """A progress bar over ``iterable`` that a built page can show (chapter 5; chapters 3, 4
    and 6 use it too): ``for x in progress(loader, desc="train"): ...``.

    In a notebook it is tqdm's text bar on one output line, updated in place (live in Jupyter
    and Colab); the executed notebook keeps the bar's final state, so the book's page shows
    it. All the bars of one cell share that line. Elsewhere (a script, a terminal, the tests)
    it is tqdm's terminal bar on stderr. The arguments are tqdm's.
    """
    if iterable is not None and not (isinstance(iterable, Iterable)
                                     or hasattr(type(iterable), "__getitem__")):
        raise TypeError(f"progress() takes an iterable (a loader, a range, a list), not "
                        f"{type(iterable).__name__}: for a count n, progress(range(n)), "
                        f"or progress(total=n) and .update()")
    # disabled, or written where the caller says (file=...): tqdm's own bar
    line = None if disable or "file" in kwargs else _notebook_line()
    if line is None:
        return _TerminalBar(iterable, desc=desc, total=total, leave=leave, disable=disable,
                            **kwargs)
    kwargs.setdefault("ncols", PROGRESS_COLUMNS)
    kwargs.setdefault("ascii", False)
    return _PageBar(iterable, desc=desc, total=total, leave=leave, file=line, **kwargs)


progress_bar = progress  # for the functions below, whose `progress` argument is a flag


# Devices already checked by _device: a step on a known device costs no second check.
_CHECKED: set[torch.device] = set()


def _device(device: torch.device | str | int) -> torch.device:
    """``device`` as a torch.device that exists here; a clear ValueError or TypeError
    (from :func:`helpers.devices.resolve_device`) names a bad one and lists the good ones."""
    if isinstance(device, torch.device) and device in _CHECKED:
        return device
    resolved = resolve_device(device)
    _CHECKED.add(resolved)
    return resolved


def _check_classes(num_classes: Any) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be a whole number of at least 2 (the classes the "
                         f"model predicts, 10 for MNIST), got {num_classes!r}")


def _check_batches(batches: Any, what: str) -> None:
    if not isinstance(batches, Iterable) or isinstance(batches, str | bytes | torch.Tensor):
        raise TypeError(f"the {what} data must be an iterable of (inputs, labels) batches, "
                        f"such as a DataLoader or a list of pairs, not {type(batches).__name__}")


def _pair(batch: Any, index: int) -> tuple[Any, Any]:
    """A batch as (inputs, labels), or a TypeError that says what the batch was."""
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    shape = f"a {type(batch).__name__}" + (
        f" of {len(batch)} items" if isinstance(batch, list | tuple) else "")
    raise TypeError(f"batch {index} is {shape}, not an (inputs, labels) pair: the Dataset's "
                    "__getitem__ must return (input, label)")


def accuracy_metric(num_classes: int = 10,
                    device: torch.device | str = "cpu") -> torchmetrics.Metric:
    """The fraction of correct predictions, counted on ``device`` without waiting for it
    (chapter 5; a trainer moves it with its module, chapter 10)."""
    # The metric keeps its running state in tensors, which must live where the predictions do.
    # average="micro" is the fraction of correct predictions; torchmetrics' default ("macro")
    # would be the mean of the per-class recalls. validate_args=False: the argument checks may
    # call torch.unique at every update (torchmetrics 1.9 does when the predictions are class
    # indices), which waits for the GPU each step. A label outside the classes still fails in
    # the loss: at once on the CPU, on CUDA as a device-side assert reported by a later call
    # (chapter 11, "Errors surface late").
    return torchmetrics.classification.MulticlassAccuracy(
        num_classes=num_classes, average="micro", validate_args=False).to(device)


def default_non_blocking(device: torch.device | str) -> bool:
    """Whether the book's loop copies batches to ``device`` with ``non_blocking=True`` (chapter 5).

    True for CUDA only. There, from pinned memory the copy is queued and the call returns at
    once; from ordinary (pageable) memory the driver first copies the batch into a staging
    buffer of its own, so the source may be reused as soon as the call returns, but PyTorch
    skips the stream synchronisation a blocking copy ends with. On Apple's ``mps`` a
    non-blocking copy from pageable memory can read the source after it is freed, and on the
    CPU there is nothing to copy, so elsewhere it is False.
    """
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if not isinstance(device, str):
        raise TypeError(f"device must be a name such as 'cuda:0' or a torch.device, "
                        f"not {device!r}")
    try:
        return torch.device(device).type == "cuda"
    except RuntimeError:
        raise ValueError(f"{device!r} is not a device name PyTorch understands: use 'cpu', "
                         "'cuda', 'cuda:1', 'mps' or 'xpu'") from None


def _read_once(*values: torch.Tensor) -> list[float]:
    # One device-to-host copy for all of an epoch's figures: its only wait for the device.
    return torch.stack([v.detach().float() for v in values]).tolist()


def train_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    *,
    metric: torchmetrics.Metric | None = None,
    non_blocking: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step on a batch; returns the detached loss and the logits (chapter 5).

    The caller puts ``model`` in training mode (:func:`train_epoch` does). On CUDA, PyTorch
    itself never waits for the device in it: the batch is copied with ``non_blocking`` (see
    :func:`default_non_blocking`), the loss stays a device tensor, and ``metric`` (if given)
    is updated on the device without its argument checks. From pageable memory the CUDA driver
    may still wait for the stream while it stages the copy (CUDA's "API synchronization
    behavior"); from pinned memory it does not. On ``mps`` the copy is a blocking one.
    """
    device = _device(device)
    if non_blocking is None:
        non_blocking = default_non_blocking(device)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"a batch must be two tensors (inputs, labels), got "
                        f"{type(x).__name__} and {type(y).__name__}")
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
        raise ValueError(f"a batch of inputs {tuple(x.shape)} and labels {tuple(y.shape)}: "
                         "they must hold the same number of examples (dimension 0)")
    x = x.to(device, non_blocking=non_blocking)
    y = y.to(device, non_blocking=non_blocking)
    optimizer.zero_grad(set_to_none=True)
    logits = model(x)
    loss = loss_fn(logits, y)
    loss.backward()
    optimizer.step()
    logits = logits.detach()
    if metric is not None:
        metric.update(logits, y)
    return loss.detach(), logits


def train_epoch(
    model: nn.Module,
    batches: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    *,
    num_classes: int = 10,
    non_blocking: bool | None = None,
    progress: bool = False,
    desc: str = "train",
    accuracy: bool = True,
    max_batches: int | None = None,
) -> dict[str, float]:
    """One pass over ``batches`` in training mode; returns the mean loss, the accuracy and
    the number of images seen (chapter 5).

    Each step is :func:`train_step`; the loss sum and the accuracy stay on the device and are
    read once, at the end of the epoch. ``non_blocking=None`` means
    :func:`default_non_blocking` for ``device``. ``accuracy=False`` skips the metric (its
    ``acc`` is NaN), and ``max_batches`` stops early: the benchmark times bare steps so.
    """
    if max_batches is not None and (isinstance(max_batches, bool) or
                                    not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches must be a whole number of at least 1 (or None for "
                         f"all), got {max_batches!r}")
    device = _device(device)
    _check_classes(num_classes)
    _check_batches(batches, "training")
    model.train()
    acc = accuracy_metric(num_classes, device) if accuracy else None
    total_loss = torch.zeros((), device=device)
    seen = 0
    for i, batch in enumerate(progress_bar(batches, desc=desc, leave=False, disable=not progress)):
        if max_batches is not None and i >= max_batches:
            break
        x, y = _pair(batch, i)
        loss, _ = train_step(model, x, y, optimizer, loss_fn, device, metric=acc,
                             non_blocking=non_blocking)
        # Accumulate on the device: calling .item() here would synchronise every step.
        total_loss += loss * len(y)
        seen += len(y)
    if seen == 0:
        raise ValueError("the training data yielded no batches")
    if acc is None:
        (loss_sum,) = _read_once(total_loss)
        return {"loss": loss_sum / seen, "acc": float("nan"), "images": seen}
    loss_sum, accuracy_value = _read_once(total_loss, acc.compute())
    return {"loss": loss_sum / seen, "acc": accuracy_value, "images": seen}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    *,
    num_classes: int = 10,
    non_blocking: bool | None = None,
    progress: bool = False,
    desc: str = "validate",
) -> dict[str, float]:
    """Mean loss and accuracy over ``batches`` in eval mode, without autograd (chapter 5).

    Puts the model in eval mode and leaves it there; :func:`train_epoch` switches back. Like
    the training pass, it reads from the device once, at the end.
    """
    device = _device(device)
    _check_classes(num_classes)
    _check_batches(batches, "validation")
    if non_blocking is None:
        non_blocking = default_non_blocking(device)
    model.eval()
    acc = accuracy_metric(num_classes, device)
    total_loss = torch.zeros((), device=device)
    seen = 0
    for i, batch in enumerate(progress_bar(batches, desc=desc, leave=False, disable=not progress)):
        x, y = _pair(batch, i)
        if len(x) != len(y):
            raise ValueError(f"batch {i}: inputs {tuple(x.shape)} and labels "
                             f"{tuple(y.shape)} hold different numbers of examples")
        x = x.to(device, non_blocking=non_blocking)
        y = y.to(device, non_blocking=non_blocking)
        logits = model(x)
        total_loss += loss_fn(logits, y) * len(y)
        seen += len(y)
        acc.update(logits, y)
    if seen == 0:
        raise ValueError("the validation data yielded no batches")
    loss_sum, accuracy_value = _read_once(total_loss, acc.compute())
    return {"loss": loss_sum / seen, "acc": accuracy_value, "images": seen}


@torch.no_grad()
def predict(
    model: nn.Module, batches: Iterable[Any], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted classes and true labels for every batch, gathered on the CPU (chapter 5).

    The predictions stay on the device until the end and come back in one copy.
    """
    device = _device(device)
    _check_batches(batches, "prediction")
    model.eval()
    non_blocking = default_non_blocking(device)
    preds, labels = [], []
    for i, batch in enumerate(batches):
        x, y = _pair(batch, i)
        preds.append(model(x.to(device, non_blocking=non_blocking)).argmax(dim=1))
        labels.append(y)
    if not preds:
        raise ValueError("the data yielded no batches")
    return torch.cat(preds).cpu(), torch.cat([y.cpu() for y in labels])


class EarlyStopping:
    """Tracks a monitored metric, remembers the best weights and says when to stop (chapter 5).

    ``mode="max"`` for accuracies, ``"min"`` for losses. The best weights are copied to the
    CPU, so keeping them costs no accelerator memory.
    """

    def __init__(self, monitor: str = "val_acc", mode: str = "max", patience: int = 3,
                 min_delta: float = 0.0) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"monitor must be the name of a metric, such as 'val_acc', "
                            f"got {monitor!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' (for a loss) or 'max' (for an accuracy), "
                             f"got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be a whole number of epochs, at least 1, "
                             f"got {patience!r}")
        if not isinstance(min_delta, int | float) or not math.isfinite(min_delta) \
                or min_delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0 (how much better a "
                             f"value must be to count), got {min_delta!r}")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best = -math.inf if mode == "max" else math.inf
        self.best_epoch = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.bad_epochs = 0

    def improved(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (NaN never
        does: a diverged epoch is not kept)."""
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def step(self, epoch: int, metrics: dict[str, float], model: nn.Module) -> bool:
        """Record one epoch's metrics; return True when training should stop."""
        if self.monitor not in metrics:
            raise KeyError(f"monitored metric {self.monitor!r} not in {sorted(metrics)}")
        value = metrics[self.monitor]
        if self.improved(value):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            self.best_state = {k: v.detach().to("cpu", copy=True)
                               for k, v in model.state_dict().items()}
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def restore(self, model: nn.Module) -> None:
        """Load the best weights back into ``model`` (after training, not during it)."""
        if self.best_state is None:
            raise RuntimeError(f"no epoch has been kept yet: step() was never called, or "
                               f"every {self.monitor} was NaN (training diverged: lower "
                               "the learning rate)")
        model.load_state_dict(copy.deepcopy(self.best_state))


def fit(
    model: nn.Module,
    train_batches: Iterable[Batch],
    val_batches: Iterable[Batch],
    *,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | str,
    epochs: int = 10,
    num_classes: int = 10,
    monitor: str = "val_acc",
    mode: str = "max",
    patience: int = 3,
    scheduler: Any | None = None,
    non_blocking: bool | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Train with validation, early stopping and best-weights restore; return the history
    as a DataFrame with one row per epoch (chapter 5).

    Columns: ``epoch``, ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``lr``,
    ``seconds`` (wall time of the epoch, device synchronised) and ``best`` (the epoch whose
    weights the model holds afterwards). A ``ReduceLROnPlateau`` scheduler is stepped on the
    validation loss, any other scheduler once per epoch (chapter 6). ``non_blocking=None``
    copies batches with :func:`default_non_blocking` for ``device``.
    """
    device = _device(device)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a whole number, at least 1, got {epochs!r}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer over the model's "
                        f"parameters, such as torch.optim.Adam(model.parameters()), "
                        f"got {optimizer!r}")
    _check_classes(num_classes)
    for batches, what in ((train_batches, "training"), (val_batches, "validation")):
        _check_batches(batches, what)
        if isinstance(batches, Iterator):
            raise TypeError(f"the {what} data is a one-shot iterator ({type(batches).__name__})"
                            ", which would be empty from the second epoch on: pass a "
                            "DataLoader or a list of batches")
    known = [f"{split}_{name}" for split in ("train", "val") for name in ("loss", "acc")]
    if monitor not in known:
        raise ValueError(f"monitor {monitor!r} is not a metric fit records: use one of "
                         f"{', '.join(known)}")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    stopper = EarlyStopping(monitor=monitor, mode=mode, patience=patience)
    rows: list[dict[str, Any]] = []
    bar = progress_bar(range(1, epochs + 1), desc="epochs", disable=not progress)
    for epoch in bar:
        synchronize(device)
        start = time.perf_counter()
        train = train_epoch(model, train_batches, optimizer, loss_fn, device,
                            num_classes=num_classes, non_blocking=non_blocking)
        val = evaluate(model, val_batches, loss_fn, device,
                       num_classes=num_classes, non_blocking=non_blocking)
        synchronize(device)
        row = {"epoch": epoch,
               **{f"train_{k}": train[k] for k in ("loss", "acc")},
               **{f"val_{k}": val[k] for k in ("loss", "acc")},
               "lr": optimizer.param_groups[0]["lr"],
               "seconds": time.perf_counter() - start}
        rows.append(row)
        if scheduler is not None:
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(val["loss"])
            else:
                scheduler.step()
        bar.set_postfix(val_acc=f"{val['acc']:.4f}", val_loss=f"{val['loss']:.4f}")
        if stopper.step(epoch, row, model):
            break
    bar.close()
    stopper.restore(model)  # once, after the loop: the model ends with its best weights
    history = pd.DataFrame(rows)
    history["best"] = history["epoch"] == stopper.best_epoch
    return history
