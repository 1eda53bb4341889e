"""Bad input for helpers.plotting (chapters 3, 5): each case ends in an error that names the
bad value and what to do, or a correct result."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from helpers.plotting import (
    plot_history,
    plot_speedups,
    plot_sweep,
    plot_timings,
    readable,
    show_images,
)
from tests.support import assert_clear_error

HISTORY = pd.DataFrame({"epoch": [1, 2], "train_loss": [1.0, 0.5], "val_loss": [1.1, 0.6],
                        "train_acc": [0.5, 0.8], "val_acc": [0.4, 0.7]})

BAD = [
    (lambda: plot_history([1, 2]), TypeError, ["DataFrame", "list"]),
    (lambda: plot_history(pd.DataFrame()), KeyError, ["epoch", "train_loss"]),
    (lambda: plot_history(HISTORY.drop(columns="epoch")), KeyError, ["'epoch'"]),
    (lambda: plot_history(HISTORY.iloc[:0]), ValueError, ["no rows"]),
    (lambda: plot_history(HISTORY, metrics=("f1",)), KeyError, ["train_f1"]),
    (lambda: plot_timings([1.0, 2.0]), TypeError, ["mapping", "list"]),
    (lambda: plot_timings({}), ValueError, ["nothing to plot"]),
    (lambda: plot_timings({"cpu": "1.2"}), TypeError, ["'cpu'", "'1.2'"]),
    (lambda: plot_timings({"cpu": float("nan")}), ValueError, ["'cpu'", "nan"]),
    (lambda: plot_timings({"a": 0.0, "b": 1.0}, log=True), ValueError, ["log=False"]),
    (lambda: plot_timings({"a": 1.0}, errors={"b": 0.1}), ValueError, ["['b']"]),
    (lambda: plot_speedups({}), ValueError, ["nothing to plot"]),
    (lambda: plot_sweep(pd.DataFrame({"n": [1]}), "n", "ms", "device"), KeyError, ["'ms'"]),
    (lambda: plot_sweep(pd.DataFrame({"n": [], "ms": [], "d": []}), "n", "ms", "d"),
     ValueError, ["no rows"]),
    (lambda: plot_sweep(pd.DataFrame({"n": [1, 2], "ms": [0.0, 1.0], "d": ["a", "a"]}),
                        "n", "ms", "d"), ValueError, ["'ms'", "logy=False"]),
    (lambda: show_images(torch.zeros(0, 1, 28, 28)), ValueError, ["(0, 28, 28)"]),
    (lambda: show_images(torch.zeros(28, 28)), ValueError, ["(28, 28)"]),
    (lambda: show_images(torch.zeros(3, 3, 28, 28)), ValueError, ["greyscale"]),
    (lambda: show_images(torch.zeros(3, 28, 28), titles=["a"]), ValueError, ["1 titles"]),
    (lambda: show_images(torch.zeros(3, 28, 28), colors=["red"]), ValueError, ["1 colors"]),
    (lambda: show_images(torch.zeros(3, 28, 28), ncols=0), ValueError, ["ncols"]),
    (lambda: readable("3"), TypeError, ["'3'"]),
    (lambda: readable(None), TypeError, ["None"]),
]


@pytest.mark.parametrize("make,error,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_named(make, error, words):
    assert_clear_error(make, error, words)


def test_odd_but_valid_input_gives_a_correct_result():
    assert len(plot_history(HISTORY, metrics="loss").axes) == 1  # one metric, not letters
    assert show_images(np.zeros((2, 28, 28))) is not None  # a NumPy array is fine
    assert plot_timings({"cpu": np.float32(1.5), "gpu": np.int64(2)}) is not None
    assert readable(np.float64(2810.4)) == "2,810"
