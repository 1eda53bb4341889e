import pandas as pd
import pytest
import torch
from torch import nn

from helpers.cuda_semantics import sync_debug
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
    assert set(out) == {"loss", "acc", "images"}
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


# --- what the training step waits for -------------------------------------------------------

# The tensor methods that copy a value to the host, so on a GPU they wait for it to finish.
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy,
              torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
              torch.unique, torch.Tensor.unique, torch.Tensor.nonzero, torch.nonzero}


class CountHostReads(torch.overrides.TorchFunctionMode):
    """Counts every call, made anywhere below it (torchmetrics included), of a HOST_READS function."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def host_reads_in_one_epoch(n_batches: int) -> list[str]:
    x, y = blobs(20 * n_batches)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = list(zip(x.split(20), y.split(20), strict=True))
    with CountHostReads() as mode:
        train_epoch(model, batches, opt, nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)
        evaluate(model, batches, nn.CrossEntropyLoss(), torch.device("cpu"), num_classes=3)
    return mode.calls


def test_the_counter_sees_what_torchmetrics_argument_checks_do():
    # With its argument checks on, the metric calls torch.unique at every update given class
    # indices: the counter must see that, or the next test would prove nothing.
    import torchmetrics

    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
    _, y = blobs(40)
    with CountHostReads() as mode:
        for yb in y.split(10):
            metric.update(torch.randint(0, 3, yb.shape), yb)
            float(yb.sum())
    assert mode.calls.count("unique") >= 4 and mode.calls.count("__float__") == 4


def test_an_epoch_reads_from_the_device_once_whatever_its_length():
    short, long = host_reads_in_one_epoch(2), host_reads_in_one_epoch(8)
    assert short == long, f"host reads grow with the number of steps: {short} vs {long}"
    assert short == ["tolist", "tolist"], short  # one read for training, one for validation


def test_the_loop_turns_metric_argument_checks_off():
    from helpers.training import accuracy_metric

    assert accuracy_metric(10, torch.device("cpu")).validate_args is False


def test_batches_are_copied_non_blocking_to_cuda_only():
    from helpers.training import default_non_blocking

    assert default_non_blocking("cuda") and default_non_blocking(torch.device("cuda", 1))
    for device in ("cpu", "mps", "meta", "xpu"):
        assert not default_non_blocking(device)


class RecordCopies(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.non_blocking: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            self.non_blocking.append(kwargs.get("non_blocking", False))
        return func(*args, **kwargs)


def test_train_step_passes_non_blocking_through():
    from helpers.training import train_step

    x, y = blobs(20)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for asked in (True, False):
        with RecordCopies() as mode:
            train_step(model, x, y, opt, nn.CrossEntropyLoss(), torch.device("cpu"),
                       non_blocking=asked)
        assert mode.non_blocking[:2] == [asked, asked]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_a_training_step_never_waits_for_the_gpu():
    from helpers.models import MnistCNN
    from helpers.training import accuracy_metric, train_step

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = MnistCNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    metric = accuracy_metric(10, device)
    pageable = [(torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,))) for _ in range(3)]
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in pageable]
    loss_fn = nn.CrossEntropyLoss()
    # Warm-up, outside the check: the first step initialises cuDNN and the optimiser state.
    train_step(model, *pageable[0], opt, loss_fn, device, metric=metric)
    torch.cuda.synchronize(device)
    losses = []
    with sync_debug(device, "error"):  # any synchronising call below raises
        for x, y in pageable + pinned:
            loss, _ = train_step(model, x, y, opt, loss_fn, device, metric=metric)
            losses.append(loss)
    assert torch.isfinite(torch.stack(losses)).all()
    assert 0.0 <= metric.compute().item() <= 1.0


@cuda
def test_the_check_catches_a_blocking_copy_and_item():
    # The debug mode must catch what the step avoids, or the test above proves nothing.
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.rand(64, 1, 28, 28)
    torch.zeros(1, device=device)
    with pytest.raises(RuntimeError, match="synchronizing"):
        with sync_debug(device, "error"):
            x.to(device)
    with sync_debug(device, "error"):
        on_gpu = x.to(device, non_blocking=True)
    with pytest.raises(RuntimeError, match="synchronizing"):
        with sync_debug(device, "error"):
            on_gpu.sum().item()


@cuda
def test_an_epoch_synchronises_a_fixed_number_of_times():
    from helpers.models import MnistCNN

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = MnistCNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [(torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,))) for _ in range(6)]
    train_epoch(model, data[:1], opt, nn.CrossEntropyLoss(), device)  # warm-up
    counts = []
    for n in (2, 6):
        torch.cuda.synchronize(device)
        with sync_debug(device) as calls:
            train_epoch(model, data[:n], opt, nn.CrossEntropyLoss(), device)
        counts.append(len(calls))
    assert counts[0] == counts[1] >= 1, counts
