import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from helpers import plotting


def history():
    return pd.DataFrame({"epoch": [1, 2, 3], "train_loss": [1.0, 0.5, 0.4],
                         "val_loss": [0.9, 0.6, 0.7], "train_acc": [0.6, 0.8, 0.85],
                         "val_acc": [0.65, 0.8, 0.78], "best": [False, True, False]})


def test_plot_history_draws_train_and_validation():
    fig = plotting.plot_history(history())
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    loss_ax = fig.axes[0]
    labels = [line.get_label() for line in loss_ax.get_lines()]
    assert "train" in labels and "val" in labels and "best (epoch 2)" in labels


def test_plot_history_names_missing_columns():
    with pytest.raises(KeyError, match="train_f1"):
        plotting.plot_history(history(), metrics=("f1",))


def test_plot_timings_and_speedups():
    fig = plotting.plot_timings({"cpu": 2.0, "gpu": 0.1}, errors={"cpu": 0.1}, title="t", log=True)
    assert len(fig.axes[0].patches) == 2
    fig = plotting.plot_speedups({"gpu": 20.0})
    assert fig.axes[0].get_xlabel() == "x faster"
    with pytest.raises(ValueError):
        plotting.plot_timings({})


def test_plot_sweep_one_line_per_group():
    frame = pd.DataFrame({"n": [1, 2, 1, 2], "s": [1.0, 2.0, 0.5, 0.7], "device": ["cpu"] * 2 + ["gpu"] * 2})
    fig = plotting.plot_sweep(frame, "n", "s", "device")
    assert len(fig.axes[0].get_lines()) == 2
    with pytest.raises(KeyError):
        plotting.plot_sweep(frame, "n", "missing", "device")


def test_show_images_grid():
    fig = plotting.show_images(torch.rand(10, 1, 28, 28), titles=[str(i) for i in range(10)],
                               ncols=5, colors=["red"] * 10)
    assert len(fig.axes) == 10
    assert fig.axes[0].get_title() == "0"
    with pytest.raises(ValueError):
        plotting.show_images(torch.rand(28, 28))


def test_history_ticks_are_whole_epochs():
    fig = plotting.plot_history(history())
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_bar_labels_are_readable():
    fig = plotting.plot_timings({"a": 2810.4, "b": 0.01234, "c": 1.5, "d": 123456.0})
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["2,810", "0.0123", "1.50", "123,456"]
    assert plotting.readable(0.0) == "0" and plotting.readable(3.14159e-5) == "0.0000314"
