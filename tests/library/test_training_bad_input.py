"""Bad input for helpers.training (chapter 5), written from the signatures and docstrings:
each case ends in an error that names the bad value and what to do, or a correct result."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.models import MnistCNN
from helpers.training import (
    EarlyStopping,
    default_non_blocking,
    evaluate,
    fit,
    predict,
    train_epoch,
    train_step,
)
from tests.support import assert_clear_error

X, Y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
LOSS = nn.CrossEntropyLoss()


def model_and_opt():
    torch.manual_seed(0)
    model = MnistCNN()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def call(name, **kw):
    model, opt = model_and_opt()
    batches = kw.pop("batches", [(X, Y)])
    device = kw.pop("device", "cpu")
    if name == "train_step":
        x, y = kw.pop("xy", (X, Y))
        return train_step(model, x, y, opt, LOSS, device, **kw)
    if name == "train_epoch":
        return train_epoch(model, batches, opt, LOSS, device, **kw)
    if name == "evaluate":
        return evaluate(model, batches, LOSS, device, **kw)
    if name == "predict":
        return predict(model, batches, device)
    if name == "fit":
        kw.setdefault("optimizer", opt)
        return fit(model, batches, kw.pop("val", [(X, Y)]), device=device, progress=False,
                   **kw)
    raise AssertionError(name)


BAD = [
    # (function, arguments, error, words the message must hold)
    ("train_step", {"device": "gpu"}, ValueError, ["'gpu'", "did you mean"]),
    ("train_step", {"device": "cuda:7"}, ValueError, ["cuda:7", "Devices on this machine"]),
    ("train_step", {"device": 3.5}, TypeError, ["3.5"]),
    ("train_step", {"xy": (X, Y[:3])}, ValueError, ["(4, 1, 28, 28)", "(3,)"]),
    ("train_step", {"xy": (X.numpy(), Y)}, TypeError, ["ndarray"]),
    ("train_epoch", {"batches": []}, ValueError, ["no batches"]),
    ("train_epoch", {"batches": 5}, TypeError, ["int", "DataLoader"]),
    ("train_epoch", {"batches": [(X, Y, Y)]}, TypeError, ["3 items", "(input, label)"]),
    ("train_epoch", {"max_batches": 0}, ValueError, ["max_batches", "0"]),
    ("train_epoch", {"max_batches": 1.5}, ValueError, ["1.5"]),
    ("train_epoch", {"num_classes": 0}, ValueError, ["num_classes", "0"]),
    ("train_epoch", {"device": "tpu"}, ValueError, ["'tpu'"]),
    ("evaluate", {"batches": []}, ValueError, ["no batches"]),
    ("evaluate", {"batches": [X]}, TypeError, ["Tensor", "(inputs, labels)"]),
    ("evaluate", {"batches": [(X, Y[:2])]}, ValueError, ["batch 0", "(2,)"]),
    ("evaluate", {"device": "mps"}, ValueError, ["'mps'"]),
    ("predict", {"batches": []}, ValueError, ["no batches"]),
    ("predict", {"batches": [X]}, TypeError, ["(inputs, labels)"]),
    ("predict", {"device": "gpu:0"}, ValueError, ["did you mean"]),
    ("fit", {"epochs": 0}, ValueError, ["epochs", "0"]),
    ("fit", {"epochs": "3"}, ValueError, ["'3'"]),
    ("fit", {"optimizer": None}, TypeError, ["torch.optim.Adam"]),
    ("fit", {"monitor": "val_f1"}, ValueError, ["val_f1", "val_acc"]),
    ("fit", {"mode": "maximum"}, ValueError, ["maximum", "'max'"]),
    ("fit", {"patience": 0}, ValueError, ["patience"]),
    ("fit", {"val": []}, ValueError, ["validation", "no batches"]),
    ("fit", {"batches": iter([(X, Y)])}, TypeError, ["one-shot iterator", "DataLoader"]),
    ("fit", {"device": "cuda"}, ValueError, ["'cuda'", "not available"]),
]


@pytest.mark.parametrize("name,kwargs,error,words", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_named(name, kwargs, error, words):
    if "cuda" in str(kwargs.get("device", "")) and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    if kwargs.get("device") == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an Apple GPU")
    assert_clear_error(lambda: call(name, **dict(kwargs)), error, words)


def test_a_monitor_typo_fails_before_any_training():
    model, opt = model_and_opt()
    # Nothing was trained: the model is as it was.
    assert_clear_error(lambda: fit(model, [(X, Y)], [(X, Y)], optimizer=opt, device="cpu",
                                   monitor="acc", progress=False), ValueError, [], model=model)


def test_good_spellings_of_the_device_give_a_correct_result():
    for device in ("cpu", torch.device("cpu"), " cpu "):
        out = call("train_epoch", device=device)
        assert out["images"] == 4 and 0 <= out["acc"] <= 1


def test_a_history_has_the_documented_columns_only():
    history = call("fit", epochs=1)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "val_loss", "val_acc",
                                     "lr", "seconds", "best"]


@pytest.mark.parametrize("kwargs,error,words", [
    ({"mode": "up"}, ValueError, ["'up'", "'min'"]),
    ({"patience": "3"}, ValueError, ["'3'"]),
    ({"patience": 0}, ValueError, ["at least 1"]),
    ({"min_delta": -1}, ValueError, ["min_delta", "-1"]),
    ({"min_delta": float("nan")}, ValueError, ["min_delta"]),
    ({"monitor": ""}, TypeError, ["val_acc"]),
])
def test_early_stopping_arguments(kwargs, error, words):
    assert_clear_error(lambda: EarlyStopping(**kwargs), error, words)


def test_early_stopping_names_a_missing_metric_and_never_keeps_nan():
    model, _ = model_and_opt()
    stopper = EarlyStopping(patience=2)
    with pytest.raises(KeyError, match="val_acc"):
        stopper.step(1, {"val_loss": 1.0}, model)
    assert stopper.step(1, {"val_acc": float("nan")}, model) is False
    with pytest.raises(RuntimeError, match="NaN"):
        stopper.restore(model)


@pytest.mark.parametrize("device,error", [("gpu", ValueError), ("", ValueError),
                                          (None, TypeError), (0, TypeError)])
def test_default_non_blocking_names_a_bad_device(device, error):
    with pytest.raises(error, match="device|cpu"):
        default_non_blocking(device)


def test_default_non_blocking_answers_for_any_real_device_name():
    assert default_non_blocking("cuda:3") is True  # a question about the type, not this machine
    assert default_non_blocking("mps") is False
