import pytest
import torch
from torch import nn

from helpers.checkpoints import load_checkpoint, save_checkpoint, strip_prefixes, unwrap
from helpers.models import MnistCNN


def test_unwrap_dataparallel_and_compiled():
    net = MnistCNN()
    assert unwrap(net) is net
    assert unwrap(nn.DataParallel(net)) is net

    class Compiled(nn.Module):  # the shape torch.compile's OptimizedModule has
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    assert unwrap(Compiled(nn.DataParallel(net))) is net


def test_strip_prefixes():
    sd = {"module._orig_mod.fc.weight": 1, "_orig_mod.module.fc.bias": 2, "plain": 3}
    assert strip_prefixes(sd) == {"fc.weight": 1, "fc.bias": 2, "plain": 3}
    with pytest.raises(ValueError, match="two keys"):
        strip_prefixes({"module.a": 1, "a": 2})


def test_roundtrip_from_a_wrapped_model(tmp_path):
    torch.manual_seed(0)
    wrapped = nn.DataParallel(MnistCNN())
    path = save_checkpoint(wrapped, tmp_path / "ckpt" / "best.pt", epoch=3, val_acc=0.9)
    saved = torch.load(path, weights_only=True)
    assert not any(k.startswith("module.") for k in saved["model"])
    fresh = MnistCNN()
    extra = load_checkpoint(fresh, path)
    assert extra["epoch"] == 3 and extra["val_acc"] == 0.9
    for a, b in zip(fresh.state_dict().values(), wrapped.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_loading_a_prefixed_raw_state_dict(tmp_path):
    # What people save by mistake: DataParallel's state_dict with "module." keys.
    wrapped = nn.DataParallel(nn.Linear(3, 2))
    torch.save(wrapped.state_dict(), tmp_path / "raw.pt")
    plain = nn.Linear(3, 2)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\)"):
        plain.load_state_dict(torch.load(tmp_path / "raw.pt", weights_only=True))
    load_checkpoint(plain, tmp_path / "raw.pt")
    assert torch.equal(plain.weight, wrapped.module.weight)


def test_load_maps_to_the_models_device(tmp_path):
    path = save_checkpoint(nn.Linear(2, 2), tmp_path / "a.pt")
    meta_model = nn.Linear(2, 2).to("meta")
    load_checkpoint(meta_model, path)
    assert meta_model.weight.device.type == "meta"
    cpu_model = nn.Linear(2, 2)
    load_checkpoint(cpu_model, path, map_location="cpu")
    assert cpu_model.weight.device.type == "cpu"


def test_missing_and_wrong_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "nope.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "tensor.pt")


def test_save_leaves_nothing_half_written(tmp_path, monkeypatch):
    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    path = tmp_path / "best.pt"
    save_checkpoint(nn.Linear(1, 1), path)
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(nn.Linear(1, 1), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]


def test_weights_only_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this would run",))

    torch.save({"model": {}, "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "evil.pt")
