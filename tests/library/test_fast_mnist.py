"""helpers.fast_mnist (chapter 14): the device loader, the net, the schedule, the optimizer, and
the captured step's logic on the CPU with a fake of CUDA graphs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers import fast_mnist as fm


class FakeGraphs:
    """Stands in for fm.CudaGraphs on the CPU: warm-up runs the calls; capture runs nothing
    (a real capture records kernels without running them) and checks the rule that every
    gradient is None, so the captured backward writes them afresh; replay runs the body with
    the gradients set to None first, as a replayed graph writes them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.warmups, self.captures, self.replays = model, 0, 0, 0

    def warm_up(self, fn, times):
        for _ in range(times):
            self.warmups += 1
            fn()

    def capture(self, fn):
        assert all(p.grad is None for p in self.model.parameters())
        self.captures += 1

        def replay():
            self.replays += 1
            for p in self.model.parameters():
                p.grad = None
            fn()

        return replay


def _data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_fastnet_gives_ten_logits_and_checks_its_widths():
    assert fm.FastNet()(torch.rand(4, 1, 28, 28)).shape == (4, 10)
    assert fm.FastNet((8, 16))(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in fm.FastNet())
    for bad in ((), (0, 8), (8.0,), (True,)):
        with pytest.raises(ValueError, match="widths"):
            fm.FastNet(bad)


def test_device_loader_draws_equal_batches_of_a_fresh_permutation_each_epoch():
    x, y = _data(100)
    loader = fm.DeviceLoader(x, y, 32, seed=3)
    assert len(loader) == 3  # the partial batch of 4 is dropped
    first = torch.cat(list(loader.index_batches()))
    second = torch.cat(list(loader.index_batches()))
    assert first.shape == (96,) and first.unique().numel() == 96
    assert not torch.equal(first, second)
    again = torch.cat(list(fm.DeviceLoader(x, y, 32, seed=3).index_batches()))
    assert torch.equal(first, again)
    xb, yb = next(iter(fm.DeviceLoader(x, y, 32, seed=3)))
    assert torch.equal(xb, x[first[:32]]) and torch.equal(yb, y[first[:32]])
    assert loader.generator.device == x.device


@pytest.mark.parametrize("args, match", [
    ((torch.rand(4, 1), torch.zeros(5)), "one length"),
    ((torch.rand(4, 1), torch.zeros(4)), "batch_size"),
])
def test_device_loader_refuses_bad_input(args, match):
    batch = 5 if match == "batch_size" else 2
    with pytest.raises(ValueError, match=match):
        fm.DeviceLoader(*args, batch)
    with pytest.raises(TypeError):
        fm.DeviceLoader([1, 2], torch.zeros(2), 1)


def test_one_cycle_rises_then_falls_to_zero():
    total, peak = 100, 0.01
    lrs = [fm.one_cycle(s, total, peak) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / 10)
    assert max(lrs) == pytest.approx(peak) and lrs.index(max(lrs)) == 25
    assert all(a < b for a, b in zip(lrs[:25], lrs[1:26], strict=True))
    assert all(a > b for a, b in zip(lrs[25:], lrs[26:], strict=False))
    assert 0 < lrs[-1] == pytest.approx(peak / 75)
    assert fm.one_cycle(0, 1, peak, warmup=0) == peak
    for bad in ((100, 100, peak), (-1, 100, peak), (0, 0, peak), (0, 10, 0.0)):
        with pytest.raises(ValueError):
            fm.one_cycle(*bad)


def test_make_optimizer_fuses_where_it_can_and_captures_on_cuda_only():
    model = fm.FastNet((4,))
    assert fm.make_optimizer(model, 0.1, fused=True).param_groups[0]["fused"] is True
    assert not fm.make_optimizer(model, 0.1).param_groups[0]["fused"]
    assert fm.fused_supported("cuda:1") and not fm.fused_supported("meta")
    with pytest.raises(ValueError, match="only a CUDA step is captured"):
        fm.make_optimizer(model, 0.1, captured=True)
    opt = fm.make_optimizer(model, 0.1)
    fm.set_lr(opt, 0.5)
    assert opt.param_groups[0]["lr"] == 0.5
    opt.param_groups[0]["lr"] = torch.tensor(0.1)
    tensor = opt.param_groups[0]["lr"]
    fm.set_lr(opt, 0.25)
    assert opt.param_groups[0]["lr"] is tensor and tensor.item() == 0.25


def test_precision_is_bf16_where_fast_else_fp16_on_cuda(monkeypatch):
    import helpers.recipes

    assert fm.precision_dtype("cpu") is None  # the short version keeps fp32
    assert fm.precision_dtype("meta") is None
    monkeypatch.setattr(helpers.recipes, "bf16_is_fast", lambda device: False)  # a T4
    assert fm.precision_dtype("cuda:0") == torch.float16
    monkeypatch.setattr(helpers.recipes, "bf16_is_fast", lambda device: True)  # an H100
    assert fm.precision_dtype("cuda:0") == torch.bfloat16


def test_fp16_step_unscales_the_gradients_before_the_optimizer():
    x, y = _data(32)
    grads = {}
    for dtype in (None, torch.float16):
        torch.manual_seed(0)
        model = fm.FastNet((8,))
        opt = fm.make_optimizer(model, 0.0)
        opt.step = lambda d=dtype, m=model: grads.__setitem__(
            d, [p.grad.clone() for p in m.parameters()])
        fm._step_body(model, opt, dtype)(x, y)
    for plain, scaled in zip(grads[None], grads[torch.float16], strict=True):
        # fp16 rounding moves each gradient by a few per cent; a missed unscale by 1024x
        assert (scaled - plain).norm() < 0.1 * plain.norm()


def test_capture_step_warms_up_then_restores_the_model_and_optimizer():
    x, y = _data(64)
    torch.manual_seed(0)
    model = fm.FastNet((8,))
    before = [t.clone() for t in (*model.parameters(), *model.buffers())]
    opt = fm.make_optimizer(model, 0.01)
    body = fm._step_body(model, opt, None)
    fake = FakeGraphs(model)
    replay = fm.capture_step(lambda: body(x, y), model, opt, backend=fake)
    assert (fake.warmups, fake.captures, fake.replays) == (3, 1, 0)
    after = [*model.parameters(), *model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    states = [v for s in opt.state.values() for v in s.values()]
    assert states and all(not v.any() for v in states)
    replay()
    assert fake.replays == 1
    assert not torch.equal(before[0], next(model.parameters()))


def test_captured_training_equals_eager_training(monkeypatch):
    # 8 steps over 2 epochs (as with 256 images in batches of 64), at half the images a step
    data, test = _data(128), _data(64, seed=1)
    recipe = replace(fm.STEPS[-2], batch_size=32, epochs=2)  # the captured step
    assert recipe.captured
    eager = fm.train(recipe, "cpu", data, test, seed=5, warmup_steps=1)
    assert not eager.captured
    built = []
    real_build = fm._build

    def build(recipe, device):
        built.append(real_build(recipe, device))
        return built[-1]

    class Graphs(FakeGraphs):
        def __init__(self):
            super().__init__(None)

        def capture(self, fn):
            self.model = built[-1][0]  # the model being trained (after the spare's)
            return super().capture(fn)

    monkeypatch.setattr(fm, "_build", build)
    graphs = Graphs()
    run = fm.train(recipe, "cpu", data, test, seed=5, warmup_steps=1, graphs=graphs)
    assert run.captured and run.model is built[-1][0]
    assert (graphs.warmups, graphs.captures) == (3, 1)
    assert graphs.replays == 2 * (128 // 32) and run.images == 256
    for a, b in zip(eager.model.parameters(), run.model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert run.accuracy == eager.accuracy


@pytest.mark.parametrize("recipe", fm.STEPS, ids=lambda r: r.key)
def test_every_step_trains_and_counts_its_images(recipe):
    from torch.utils.data import DataLoader, TensorDataset

    # 4 steps an epoch (as with 256 images in batches of 64), at half the images a step
    data, test = _data(128), _data(50, seed=1)
    small = replace(recipe, batch_size=min(recipe.batch_size, 32))
    loader = DataLoader(TensorDataset(*data), batch_size=small.batch_size, shuffle=True)
    run = fm.train(small, "cpu", data, test, loader=loader, warmup_steps=1)
    assert run.images == small.epochs * 128  # 128 is a multiple of every batch here
    assert run.seconds > 0 and run.prepare_s > 0 and 0 <= run.accuracy <= 1
    assert run.images_per_s == pytest.approx(run.images / run.seconds)
    assert not run.captured and run.model.training


def test_the_steps_change_one_thing_at_a_time():
    keys = [r.key for r in fm.STEPS]
    assert keys == ["tutorial", "device_data", "one_cycle", "bn_net", "fused", "graph",
                    "precision"]
    fields = ("loader", "model", "batch_size", "epochs", "lr", "schedule", "fused",
              "captured", "precision", "channels_last")
    changed = [{f for f in fields if getattr(a, f) != getattr(b, f)}
               for a, b in zip(fm.STEPS, fm.STEPS[1:], strict=False)]
    assert changed[0] == {"loader"} and changed[2] == {"model"}
    assert changed[3] == {"fused"} and changed[4] == {"captured"}
    assert changed[5] == {"precision", "channels_last"}


def test_train_and_busy_share_refuse_what_they_cannot_do():
    data = _data(64)
    with pytest.raises(ValueError, match="loader="):
        fm.train(fm.STEPS[0], "cpu", data, data)
    with pytest.raises(ValueError, match="CUDA"):
        fm.busy_share(fm.STEPS[1], "cpu", data)


def test_chunks_time_equal_parts_of_the_training():
    data = _data(128)
    recipe = replace(fm.STEPS[1], batch_size=16)  # 8 steps, 2 in each chunk
    run = fm.train(recipe, "cpu", data, data, warmup_steps=1, chunks=4)
    assert len(run.chunk_rates) == 4 and all(r > 0 for r in run.chunk_rates)
    assert fm.train(recipe, "cpu", data, data, warmup_steps=1).chunk_rates == ()
    with pytest.raises(ValueError, match="chunks"):
        fm.train(recipe, "cpu", data, data, chunks=0)


def test_train_without_warm_up_trains_the_same_model():
    # the chapter's CPU short version passes warmup_steps=0; the throw-away model's warm-up
    # must not change what the real one learns (it draws from its own seed)
    data, test = _data(64), _data(32, seed=1)
    recipe = replace(fm.STEPS[4], batch_size=16, epochs=1)  # 4 steps, as 128 in batches of 32
    cold = fm.train(recipe, "cpu", data, test, seed=2, warmup_steps=0)
    warm = fm.train(recipe, "cpu", data, test, seed=2, warmup_steps=2)
    assert cold.images == warm.images == 64 and cold.prepare_s > 0
    for a, b in zip(cold.model.parameters(), warm.model.parameters(), strict=True):
        assert torch.equal(a, b)
