import importlib
import os
import stat

import pytest
import torch
from torch import nn

from helpers.checkpoints import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    strip_prefixes,
    unwrap,
)
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


def test_strip_prefixes_only_where_every_key_carries_them():
    sd = {"module._orig_mod.fc.weight": 1, "module._orig_mod.fc.bias": 2}
    assert strip_prefixes(sd) == {"fc.weight": 1, "fc.bias": 2}
    mixed = {"module.a": 1, "head.b": 2}  # a model that has a submodule called "module"
    assert strip_prefixes(mixed) == mixed
    # The model's own keys start with "module.": a DataParallel file loses one prefix, not two.
    nested = {"module.module.w": 1}
    assert strip_prefixes(nested, reference_keys=["module.w"]) == {"module.w": 1}
    assert strip_prefixes({"module.w": 1}, reference_keys=["module.w"]) == {"module.w": 1}


# DataParallel on a one-GPU host moves the model it wraps to that GPU (its constructor calls
# module.to(device_ids[0]), torch 2.9 to 2.14), and torch.equal refuses a CPU and a CUDA
# tensor. So the tests below compare what was loaded (on the CPU, where the fresh model is)
# with a CPU copy of the weights taken *before* wrapping, never with the wrapped model, and
# they run twice: on this host, and on a one-GPU host faked as below.

_GPU_EQUAL_ERROR = ("Expected all tensors to be on the same device, but got other is on cuda:0, "
                    "different from other tensors on cpu (when checking argument in method "
                    "wrapper_CUDA__equal)")


@pytest.fixture(params=["this host", "a one-GPU host"])
def host(request, monkeypatch):
    """On "a one-GPU host", DataParallel sees one CUDA GPU and moves the module it wraps
    "there": into new storages, which torch.equal then refuses to compare with any other
    tensor, in the words the H200 printed (torch 2.11). Yields the storages moved so far."""
    moved: list[torch.Tensor] = []  # kept alive, so no CPU tensor reuses their addresses
    if request.param == "a one-GPU host":
        # the module, not the function torch.nn.parallel re-exports under the same name
        data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")
        monkeypatch.setattr(data_parallel, "_get_available_device_type", lambda: "cuda")
        monkeypatch.setattr(data_parallel, "_get_all_device_indices", lambda: [0])
        monkeypatch.setattr(data_parallel, "_check_balance", lambda device_ids: None)
        real_to, real_equal = nn.Module.to, torch.equal

        def to(self, *args, **kwargs):
            if args and args[0] == torch.device("cuda", 0) and not kwargs:
                def copy(t):
                    moved.append(t.detach().clone())
                    return moved[-1]
                return self._apply(copy)
            return real_to(self, *args, **kwargs)

        def on_gpu(t):
            return any(t.untyped_storage().data_ptr() == m.untyped_storage().data_ptr()
                       for m in moved)

        def equal(a, b):
            if on_gpu(a) != on_gpu(b):
                raise RuntimeError(_GPU_EQUAL_ERROR)
            return real_equal(a, b)

        monkeypatch.setattr(nn.Module, "to", to)
        monkeypatch.setattr(torch, "equal", equal)
    return moved


def cpu_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def assert_loaded(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert list(state) == list(expected)
    for name, value in state.items():
        assert value.device.type == "cpu", f"{name} was loaded onto {value.device}"
        assert torch.equal(value, expected[name]), name


def test_the_fake_gpu_host_moves_and_refuses_as_a_gpu_does(host, request):
    weights = nn.Linear(3, 2)
    before = cpu_copy(weights)
    wrapped = nn.DataParallel(weights)
    if request.node.callspec.params["host"] == "this host":
        # DataParallel moves the module only where it sees exactly one GPU (two or more:
        # it stays where it is, replicated at each forward); a CPU moves nothing.
        one_gpu = torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert wrapped.module.weight.device.type == ("cuda" if one_gpu else "cpu")
        assert not host, "the fake stays out of this host's run"
        return
    assert host, "DataParallel moved the module to the (fake) GPU"
    assert wrapped.module.weight.tolist() == before["weight"].tolist(), "with its values"
    assert torch.equal(wrapped.module.weight, wrapped.module.weight)
    with pytest.raises(RuntimeError, match="same device"):
        torch.equal(before["weight"], wrapped.module.weight)


def test_roundtrip_from_a_wrapped_model(tmp_path, host):
    torch.manual_seed(0)
    model = MnistCNN()
    expected = cpu_copy(model)
    wrapped = nn.DataParallel(model)
    path = save_checkpoint(wrapped, tmp_path / "ckpt" / "best.pt", epoch=3, val_acc=0.9)
    saved = torch.load(path, weights_only=True)
    assert not any(k.startswith("module.") for k in saved["model"])
    fresh = MnistCNN()
    extra = load_checkpoint(fresh, path)
    assert extra["epoch"] == 3 and extra["val_acc"] == 0.9
    assert_loaded(fresh, expected)


def test_loading_a_prefixed_raw_state_dict(tmp_path, host):
    # What people save by mistake: DataParallel's state_dict with "module." keys.
    layer = nn.Linear(3, 2)
    expected = cpu_copy(layer)
    wrapped = nn.DataParallel(layer)
    torch.save(wrapped.state_dict(), tmp_path / "raw.pt")
    plain = nn.Linear(3, 2)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\)"):
        plain.load_state_dict(torch.load(tmp_path / "raw.pt", weights_only=True))
    load_checkpoint(plain, tmp_path / "raw.pt")
    assert_loaded(plain, expected)


def test_load_maps_to_the_models_device(tmp_path):
    path = save_checkpoint(nn.Linear(2, 2), tmp_path / "a.pt")
    cpu_model = nn.Linear(2, 2)
    load_checkpoint(cpu_model, path, map_location="cpu")
    assert cpu_model.weight.device.type == "cpu"


def test_missing_and_wrong_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "nope.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
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
    with pytest.raises(CheckpointError, match="Unsupported global") as info:
        load_checkpoint(nn.Linear(1, 1), tmp_path / "evil.pt")
    assert "evil.pt" in str(info.value)
    assert "weights_only=False" not in str(info.value)


# ---- meta models, partial loads, wrapper-like names, broken files, permissions -------------

def test_loading_into_a_meta_model_is_refused(tmp_path):
    path = save_checkpoint(nn.Linear(2, 2), tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="meta device.*to_empty"):
        load_checkpoint(nn.Linear(2, 2).to("meta"), path)


def test_saving_a_meta_model_is_refused_and_writes_nothing(tmp_path):
    with pytest.raises(CheckpointError, match="meta device"):
        save_checkpoint(nn.Linear(2, 2).to("meta"), tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_file_saved_from_meta_is_refused_in_one_message(tmp_path):
    torch.save(nn.Linear(2, 2).to("meta").state_dict(), tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"m\.pt holds no data.*weight, bias"):
        load_checkpoint(nn.Linear(2, 2), tmp_path / "m.pt")


def test_strict_false_reports_missing_and_unexpected_keys(tmp_path):
    torch.save({"weight": torch.zeros(2, 2), "extra": torch.zeros(1)}, tmp_path / "p.pt")
    model = nn.Linear(2, 2)
    loaded = load_checkpoint(model, tmp_path / "p.pt", strict=False)
    assert loaded.missing_keys == ["bias"]
    assert loaded.unexpected_keys == ["extra"]
    assert torch.equal(model.weight, torch.zeros(2, 2))
    full = load_checkpoint(model, save_checkpoint(model, tmp_path / "f.pt"))
    assert full.missing_keys == [] and full.unexpected_keys == []


class HasModule(nn.Module):
    """An ordinary model whose only submodule is called ``module``."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)


class HasModuleAndHead(HasModule):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(2, 1)


@pytest.mark.parametrize("cls", [HasModule, HasModuleAndHead])
def test_a_submodule_called_module_reloads(tmp_path, cls, host):
    torch.manual_seed(0)
    original = cls()
    expected = cpu_copy(original)
    fresh = cls()
    load_checkpoint(fresh, save_checkpoint(original, tmp_path / "own.pt"))
    assert_loaded(fresh, expected)
    # Saved through DataParallel by mistake: exactly one "module." comes off.
    torch.save(nn.DataParallel(original).state_dict(), tmp_path / "dp.pt")
    again = cls()
    load_checkpoint(again, tmp_path / "dp.pt")
    assert_loaded(again, expected)


def test_an_empty_file_is_named(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt is empty \(0 bytes\)"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "empty.pt")


def test_a_truncated_file_is_named(tmp_path):
    good = save_checkpoint(nn.Linear(50, 50), tmp_path / "good.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.pt is truncated") as info:
        load_checkpoint(nn.Linear(50, 50), tmp_path / "cut.pt")
    assert "weights_only" not in str(info.value)


@pytest.mark.parametrize("junk", [b"hello world, not a checkpoint", b"\x89PNG\r\n\x1a\n...."])
def test_a_garbage_file_is_named_and_never_told_to_disable_weights_only(tmp_path, junk):
    (tmp_path / "junk.pt").write_bytes(junk)
    with pytest.raises(CheckpointError, match=r"junk\.pt is not a PyTorch checkpoint") as info:
        load_checkpoint(nn.Linear(1, 1), tmp_path / "junk.pt")
    assert "weights_only" not in str(info.value)


def test_a_pickle_of_garbage_is_called_corrupt(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"\x80\x02garbage that is not a pickle stream")
    with pytest.raises(CheckpointError, match=r"bad\.pt is corrupt or not a checkpoint "
                                              r"\(the unpickler stopped at: Unsupported") as info:
        load_checkpoint(nn.Linear(1, 1), tmp_path / "bad.pt")
    assert "weights_only" not in str(info.value)


def test_a_folder_and_a_meta_map_location_are_explained(tmp_path):
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file"):
        load_checkpoint(nn.Linear(1, 1), tmp_path)
    path = save_checkpoint(nn.Linear(1, 1), tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="map_location='meta' would load .*a.pt without"):
        load_checkpoint(nn.Linear(1, 1), path, map_location="meta")


def test_files_keep_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        ours = save_checkpoint(nn.Linear(1, 1), tmp_path / "ours.pt")
        torch.save({}, tmp_path / "theirs.pt")
        os.umask(0o077)
        private = save_checkpoint(nn.Linear(1, 1), tmp_path / "private.pt")
    finally:
        os.umask(old)
    mode = stat.S_IMODE
    assert mode(ours.stat().st_mode) == mode((tmp_path / "theirs.pt").stat().st_mode) == 0o644
    assert mode(private.stat().st_mode) == 0o600
