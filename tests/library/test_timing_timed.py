"""helpers.timing.timed: one call of a function, the device synchronised around it (chapter 5)."""

from __future__ import annotations

import time

import pytest
import torch

from helpers import timing, training


def test_timed_calls_once_and_returns_its_seconds() -> None:
    calls = []

    def work() -> None:
        calls.append(1)
        time.sleep(0.02)

    seconds = timing.timed(work, "cpu")
    assert calls == [1]
    assert isinstance(seconds, float) and seconds >= 0.02


def test_timed_synchronises_before_and_after(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append(f"sync {device}"))
    timing.timed(lambda: events.append("call"), torch.device("cpu"))
    assert events == ["sync cpu", "call", "sync cpu"]


def test_timed_times_a_training_epoch_like_the_chapter() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(2)]
    seen = []
    seconds = timing.timed(lambda: seen.append(training.train_epoch(
        model, batches, opt, torch.nn.functional.cross_entropy, "cpu", num_classes=3,
        accuracy=False)["images"]), "cpu")
    assert seen == [10] and seconds > 0


@pytest.mark.parametrize(("fn", "device", "error", "words"), [
    (None, "cpu", TypeError, "fn must be a function"),
    (3.5, "cpu", TypeError, "fn must be a function"),
    (lambda: None, "cuda:7", ValueError, "cuda:7"),
    (lambda: None, "gpu", ValueError, "gpu"),
    (lambda: None, None, TypeError, "device"),
])
def test_timed_bad_input(fn, device, error, words) -> None:
    with pytest.raises(error, match=words):
        timing.timed(fn, device)


def test_timed_lets_the_functions_error_through() -> None:
    def broken() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        timing.timed(broken, "cpu")
