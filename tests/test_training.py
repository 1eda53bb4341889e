import pandas as pd
import pytest
import torch
from torch import nn

from helpers.data import TensorBatches
from helpers.training import EarlyStopping, evaluate, fit, predict, train_epoch


def blobs(n=600, seed=0):
    """Three well-separated Gaussian blobs: any working loop learns them in a few epochs."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=gen)
    centres = torch.tensor([[4.0, 0.0], [-4.0, 0.0], [0.0, 4.0]])
    x = centres[y] + torch.randn(n, 2, generator=gen)
    return x, y


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))


def test_fit_learns_and_returns_history():
    x, y = blobs()
    model = make_model()
    train = TensorBatches(x[:500], y[:500], batch_size=50, shuffle=True,
                          generator=torch.Generator().manual_seed(0))
    val = TensorBatches(x[500:], y[500:], batch_size=50)
    history = fit(model, train, val, optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
                  device="cpu", epochs=5, num_classes=3, patience=5, progress=False)
    assert isinstance(history, pd.DataFrame)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "val_loss", "val_acc",
                                     "lr", "seconds", "best"]
    assert history["val_acc"].max() > 0.95
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    assert history["best"].sum() == 1
    assert (history["seconds"] > 0).all()


def test_early_stopping_stops_and_restores_the_best_weights():
    x, y = blobs()
    model = make_model()
    train = TensorBatches(x[:500], y[:500], batch_size=500)
    val = TensorBatches(x[500:], y[500:], batch_size=100)
    # lr=0: nothing improves after epoch 1, so patience 2 stops after epoch 3.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    history = fit(model, train, val, optimizer=opt, device="cpu", epochs=10, num_classes=3,
                  patience=2, progress=False)
    assert len(history) == 3
    assert history.loc[history["best"], "epoch"].item() == 1


def test_best_weights_are_restored_after_training_not_during():
    model = nn.Linear(1, 1)
    stopper = EarlyStopping(monitor="val_acc", mode="max", patience=3)
    with torch.no_grad():
        model.weight.fill_(1.0)
    stopper.step(1, {"val_acc": 0.9}, model)
    with torch.no_grad():
        model.weight.fill_(2.0)
    assert stopper.step(2, {"val_acc": 0.5}, model) is False
    assert model.weight.item() == 2.0  # untouched while training goes on
    stopper.restore(model)
    assert model.weight.item() == 1.0


def test_early_stopping_min_mode_and_bad_arguments():
    stopper = EarlyStopping(monitor="val_loss", mode="min", patience=1)
    model = nn.Linear(1, 1)
    assert not stopper.step(1, {"val_loss": 1.0}, model)
    assert stopper.step(2, {"val_loss": 2.0}, model)
    with pytest.raises(ValueError):
        EarlyStopping(mode="up")
    with pytest.raises(ValueError):
        EarlyStopping(patience=0)
    with pytest.raises(KeyError, match="val_f1"):
        EarlyStopping(monitor="val_f1").step(1, {"val_acc": 1.0}, model)
    with pytest.raises(RuntimeError):
        EarlyStopping().restore(model)


def test_scheduler_on_plateau_is_stepped_on_validation_loss():
    x, y = blobs()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)  # loss cannot improve
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    history = fit(model, TensorBatches(x, y, batch_size=600), TensorBatches(x, y, batch_size=600),
                  optimizer=opt, device="cpu", epochs=3, num_classes=3, patience=5,
                  scheduler=sched, progress=False)
    assert len(history) == 3
    # epoch 1 sets the reference, epoch 2 does not improve on it, so epoch 3 runs at half the lr
    assert history["lr"].tolist() == pytest.approx([1e-12, 1e-12, 5e-13])


def test_train_epoch_and_evaluate_modes():
    x, y = blobs(100)
    model = nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_epoch(model, [(x, y)], opt, nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)
    assert set(out) == {"loss", "acc"}
    assert model.training
    evaluate(model, [(x, y)], nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)
    assert not model.training
    train_epoch(model, [(x, y)], opt, nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)
    assert model.training  # training mode is switched back on


def test_empty_data_is_an_error():
    model = make_model()
    with pytest.raises(ValueError, match="no batches"):
        evaluate(model, [], nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)


def test_device_mismatch_is_not_hidden():
    model = make_model().to("meta")
    x, y = blobs(10)
    with pytest.raises((RuntimeError, NotImplementedError)):
        # the loop moves the data to the given device; a model elsewhere must fail loudly
        evaluate(model, [(x, y)], nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)


def test_predict_gathers_on_the_cpu():
    x, y = blobs(50)
    preds, labels = predict(make_model(), [(x[:25], y[:25]), (x[25:], y[25:])], torch.device("cpu"))
    assert preds.shape == labels.shape == (50,)
    assert torch.equal(labels, y)


def test_fit_rejects_zero_epochs():
    with pytest.raises(ValueError):
        fit(make_model(), [], [], optimizer=torch.optim.SGD(make_model().parameters(), lr=0.1),
            device="cpu", epochs=0)


def test_accuracy_is_the_fraction_correct():
    # 9 of class 0 right, 1 of class 1 wrong: 0.9 correct (a per-class mean would say 0.5).
    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.dummy = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.tensor([[5.0, 0.0]]).repeat(len(x), 1) + 0 * self.dummy

    x, y = torch.zeros(10, 1), torch.tensor([0] * 9 + [1])
    out = evaluate(Fixed(), [(x, y)], nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=2)
    assert out["acc"] == pytest.approx(0.9)
