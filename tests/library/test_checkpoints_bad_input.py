"""Bad input for every public function of helpers.checkpoints, as a user would pass it.

Each case is written from the function's signature and docstring and ends either in a clear
error that names the bad value and says what to do, or in a correct result; a failed save
leaves no file or folder behind, and a failed load leaves the model as it was.
"""

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import checkpoints
from helpers.checkpoints import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    strip_prefixes,
    unwrap,
)
from tests.support import assert_clear_error

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def small(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def snapshot(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for t in model.state_dict().values()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class Note:
    """A plain object: pickles, but a weights-only load refuses it."""


# ---- save_checkpoint ----------------------------------------------------------------------

# (model, path relative to tmp_path or a callable making one, extra, exception, words)
SAVE_BAD = [
    ("dict instead of model", lambda: small().state_dict(), "a.pt", {}, TypeError,
     ["nn.Module", "dict", "pass the model itself"]),
    ("path first", lambda: "a.pt", "a.pt", {}, TypeError, ["nn.Module", "save_checkpoint(model, path)"]),
    ("None model", lambda: None, "a.pt", {}, TypeError, ["NoneType"]),
    ("None path", small, None, {}, TypeError, ["None", "str or Path"]),
    ("number path", small, 3.5, {}, TypeError, ["3.5", "float"]),
    ("empty path", small, "", {}, ValueError, ["empty path", "model.pt"]),
    ("blank path", small, "   ", {}, ValueError, ["empty path"]),
    ("trailing slash", small, "ckpts/", {}, CheckpointError, ["ckpts/", "names a folder", "model.pt"]),
    # Python itself refuses an extra value called "model" (or "path"): it would have replaced
    # the saved weights.
    ("extra called model", small, "a.pt", {"model": "resnet"}, TypeError, ["'model'"]),
    ("extra object", small, "a.pt", {"note": Note()}, CheckpointError,
     ["note=", "Note", "weights_only=True", "plain values"]),
    ("extra lambda", small, "a.pt", {"fn": lambda x: x}, CheckpointError, ["fn=", "function"]),
    ("extra module", small, "a.pt", {"optimizer_model": nn.Linear(1, 1)}, CheckpointError,
     ["optimizer_model=", "Linear", "state_dict()"]),
    ("meta model", lambda: small().to("meta"), "a.pt", {}, CheckpointError, ["meta device", "to_empty"]),
]


@pytest.mark.parametrize(("case", "make", "rel", "extra", "error", "words"), SAVE_BAD,
                         ids=[c[0] for c in SAVE_BAD])
def test_save_refuses_bad_input_and_writes_nothing(tmp_path, monkeypatch, case, make, rel, extra,
                                                   error, words):
    monkeypatch.chdir(tmp_path)  # relative paths land in tmp_path
    assert snapshot(tmp_path) == []
    assert_clear_error(lambda: save_checkpoint(make(), rel, **extra), error, words,
                       folder=tmp_path)


def test_save_to_an_existing_folder(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(CheckpointError, match=r"runs: it names a folder.*runs/model\.pt"):
        save_checkpoint(small(), tmp_path / "runs")
    assert snapshot(tmp_path) == ["runs"]


def test_save_below_a_file(tmp_path):
    (tmp_path / "runs").write_text("a file, not a folder")
    with pytest.raises(CheckpointError, match=r"runs is a file, not a folder"):
        save_checkpoint(small(), tmp_path / "runs" / "deeper" / "a.pt")
    assert snapshot(tmp_path) == ["runs"]


def test_save_through_a_broken_link(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(CheckpointError, match="broken link"):
        save_checkpoint(small(), tmp_path / "link" / "a.pt")
    assert snapshot(tmp_path) == ["link"]


def test_a_failed_save_removes_the_folders_it_made(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    real_save = torch.save
    monkeypatch.setattr(checkpoints, "_check_extra", lambda extra, path: None)
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(small(), tmp_path / "new" / "deeper" / "a.pt")
    monkeypatch.setattr(torch, "save", real_save)
    assert snapshot(tmp_path) == []


@pytest.mark.skipif(AS_ROOT, reason="root writes into read-only folders")
def test_save_into_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match=r"ro is not writable.*folder you can write to"):
            save_checkpoint(small(), folder / "a.pt")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_save_into_a_read_only_folder_stand_in(tmp_path, monkeypatch):
    # The same case for root, who may write anywhere: the folder refuses the temporary file.
    real_open = os.open

    def refuse(file, *args, **kwargs):
        if Path(file).parent == tmp_path / "ro":
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(PermissionError, match=r"ro is not writable"):
        save_checkpoint(small(), tmp_path / "ro" / "a.pt")
    assert snapshot(tmp_path) == [], "the folder made for the save is removed again"


@pytest.mark.skipif(AS_ROOT, reason="root overwrites read-only files")
def test_save_over_a_read_only_file_keeps_it(tmp_path):
    path = save_checkpoint(small(0), tmp_path / "a.pt")
    before = path.read_bytes()
    path.chmod(0o444)
    with pytest.raises(PermissionError, match=r"a\.pt: the file exists and is read-only"):
        save_checkpoint(small(1), path)
    assert path.read_bytes() == before


SAVE_GOOD = [
    ("str path", "a.pt"),
    ("nested new folders", "x/y/z/a.pt"),
    ("spaces and unicode", "my runs/modèle 1.pt"),
    ("no suffix", "checkpoint"),
    ("dots", "../up/a.b.c.pt"),
]


@pytest.mark.parametrize(("case", "rel"), SAVE_GOOD, ids=[c[0] for c in SAVE_GOOD])
def test_save_odd_but_valid_paths(tmp_path, monkeypatch, case, rel):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    model = small(0)
    written = save_checkpoint(model, rel, epoch=1)
    assert written.is_file() and written == Path(rel)
    fresh = small(1)
    assert load_checkpoint(fresh, rel)["epoch"] == 1
    assert same(weights(fresh), weights(model))
    assert not [p for p in written.parent.iterdir() if p.name.endswith(".tmp")]


def test_save_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    written = save_checkpoint(small(), "~/ckpt/a.pt")
    assert written == tmp_path / "ckpt" / "a.pt" and written.is_file()
    assert not Path("~").exists()


def test_good_extras_round_trip(tmp_path):
    extra = {"epoch": 3, "lr": 1e-3, "name": "run", "history": [0.5, 0.25], "flags": {"ok": True},
             "best": torch.tensor(0.9), "none": None, "shape": (2, 3)}
    path = save_checkpoint(small(), tmp_path / "a.pt", **extra)
    saved = load_checkpoint(small(), path)
    for key, value in extra.items():
        got = saved[key]
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, key


# ---- load_checkpoint ----------------------------------------------------------------------

@pytest.fixture
def ckpt(tmp_path):
    return save_checkpoint(small(0), tmp_path / "good.pt", epoch=2)


LOAD_BAD = [
    ("dict instead of model", lambda p: (small().state_dict(), p, {}), TypeError, ["nn.Module", "dict"]),
    ("path first", lambda p: (p, small(), {}), TypeError, ["load_checkpoint(model, path)"]),
    ("None path", lambda p: (small(), None, {}), TypeError, ["None", "str or Path"]),
    ("empty path", lambda p: (small(), "", {}), ValueError, ["empty path"]),
    ("missing file", lambda p: (small(), p.parent / "nope.pt", {}), FileNotFoundError,
     ["nope.pt does not exist", "check the file's name"]),
    ("missing folder", lambda p: (small(), p.parent / "gone" / "a.pt", {}), FileNotFoundError,
     ["does not exist either"]),
    ("folder", lambda p: (small(), p.parent, {}), CheckpointError, ["is a folder", "file's path"]),
    ("file as folder", lambda p: (small(), p / "inside.pt", {}), FileNotFoundError, ["inside.pt"]),
    ("strict as text", lambda p: (small(), p, {"strict": "no"}), TypeError, ["'no'", "True or False"]),
    ("map to gpu", lambda p: (small(), p, {"map_location": "gpu"}), ValueError,
     ["map_location='gpu'", "did you mean"]),
    ("map to missing gpu", lambda p: (small(), p, {"map_location": f"cuda:{torch.cuda.device_count()}"}),
     ValueError, ["map_location='cuda:", "Devices on this machine"]),
    ("map to mps:1", lambda p: (small(), p, {"map_location": "mps:1"}), ValueError, ["'mps:1'"]),
    ("map to meta", lambda p: (small(), p, {"map_location": "meta"}), CheckpointError, ["without its data"]),
    ("map to number", lambda p: (small(), p, {"map_location": 3.5}), TypeError, ["3.5", "'cpu'"]),
    ("map as dict", lambda p: (small(), p, {"map_location": {"cuda:0": "cpu"}}), TypeError,
     ["torch.load yourself"]),
    ("meta model", lambda p: (small().to("meta"), p, {}), CheckpointError, ["meta device", "to_empty"]),
]


@pytest.mark.parametrize(("case", "make", "error", "words"), LOAD_BAD, ids=[c[0] for c in LOAD_BAD])
def test_load_refuses_bad_input(ckpt, case, make, error, words):
    model, path, kwargs = make(ckpt)
    # A refused load leaves the model as it was (a meta model holds no values to compare).
    kept = model if isinstance(model, nn.Module) \
        and next(model.parameters()).device.type != "meta" else None
    assert_clear_error(lambda: load_checkpoint(model, path, **kwargs), error, words, model=kept)


class Other(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)


# Checkpoints from another model: (case, model that reads the file, strict, words)
FOREIGN = [
    ("other sizes", lambda: nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)), True,
     ["0.weight has shape (4, 3) in the file and (5, 3) in the model", "left unchanged"]),
    ("other sizes, strict=False", lambda: nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 9)),
     False, ["2.weight has shape (2, 4)", "left unchanged"]),
    ("other names", Other, True, ["missing encoder.bias", "unexpected 0.bias", "strict=False"]),
    ("other class, same names", lambda: nn.Linear(3, 4), True, ["unexpected 0.bias"]),
]


@pytest.mark.parametrize(("case", "make", "strict", "words"), FOREIGN, ids=[c[0] for c in FOREIGN])
def test_a_checkpoint_from_another_model_is_refused_before_any_copy(ckpt, case, make, strict, words):
    model = make()
    assert_clear_error(lambda: load_checkpoint(model, ckpt, strict=strict), CheckpointError,
                       [ckpt.name, *words], model=model)


def test_other_names_with_strict_false_load_nothing_and_say_so(ckpt):
    model = Other()
    before = weights(model)
    loaded = load_checkpoint(model, ckpt, strict=False)
    assert loaded.missing_keys == ["encoder.weight", "encoder.bias", "head.weight", "head.bias"]
    assert sorted(loaded.unexpected_keys) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert same(weights(model), before)


def test_a_state_dict_entry_that_is_not_a_tensor(tmp_path):
    torch.save({"weight": [[1.0]], "bias": torch.zeros(1)}, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError, match="weight is a list, not a tensor"):
        load_checkpoint(nn.Linear(1, 1), tmp_path / "odd.pt")


@pytest.mark.parametrize(("content", "words"), [
    (torch.zeros(3), ["holds a Tensor", "state dict"]),
    ([1, 2], ["holds a list"]),
    ("text", ["holds a str"]),
], ids=["tensor", "list", "str"])
def test_a_file_that_holds_no_dictionary(tmp_path, content, words):
    torch.save(content, tmp_path / "x.pt")
    assert_clear_error(lambda: load_checkpoint(small(), tmp_path / "x.pt"), CheckpointError, words)


def test_a_whole_pickled_model_is_refused_with_the_reason(tmp_path):
    torch.save(small(), tmp_path / "whole.pt")
    with pytest.raises(CheckpointError, match="Unsupported global.*add_safe_globals"):
        load_checkpoint(small(), tmp_path / "whole.pt")


@pytest.mark.skipif(AS_ROOT, reason="root reads unreadable files")
def test_an_unreadable_file(ckpt):
    ckpt.chmod(0o000)
    try:
        with pytest.raises(PermissionError, match=r"good\.pt: permission denied.*chmod u\+r"):
            load_checkpoint(small(), ckpt)
    finally:
        ckpt.chmod(0o644)


def test_an_unreadable_file_stand_in(ckpt, monkeypatch):
    monkeypatch.setattr(checkpoints.os, "access", lambda path, mode: mode != os.R_OK)
    with pytest.raises(PermissionError, match=r"good\.pt: permission denied"):
        load_checkpoint(small(), ckpt)


@pytest.mark.parametrize("location", ["cpu", torch.device("cpu"), " cpu ", "cpu:0"], ids=repr)
def test_good_map_locations(ckpt, location):
    model = small(1)
    load_checkpoint(model, ckpt, map_location=location)
    assert same(weights(model), weights(small(0)))


def test_load_accepts_str_path_and_home(ckpt, monkeypatch):
    monkeypatch.setenv("HOME", str(ckpt.parent))
    model = small(1)
    assert load_checkpoint(model, "~/good.pt")["epoch"] == 2
    assert load_checkpoint(model, str(ckpt))["epoch"] == 2


# ---- strip_prefixes and unwrap ------------------------------------------------------------

STRIP_BAD = [
    ("a model", lambda: (small(), {}), TypeError, ["Sequential", "model.state_dict()"]),
    ("a list", lambda: ([("module.a", 1)], {}), TypeError, ["list"]),
    ("prefix as str", lambda: ({"module.a": 1}, {"prefixes": "module."}), TypeError,
     ["'module.'", "tuple of strings"]),
    ("empty prefix", lambda: ({"module.a": 1}, {"prefixes": ("",)}), ValueError, ["empty string"]),
    ("prefix not str", lambda: ({"module.a": 1}, {"prefixes": (1,)}), TypeError, ["(1,)"]),
    ("reference as str", lambda: ({"module.a": 1}, {"reference_keys": "a"}), TypeError,
     ["'a'", "state_dict().keys()"]),
    ("int keys", lambda: ({0: torch.zeros(1)}, {}), TypeError, ["0", "int"]),
]


@pytest.mark.parametrize(("case", "make", "error", "words"), STRIP_BAD, ids=[c[0] for c in STRIP_BAD])
def test_strip_prefixes_refuses_bad_input(case, make, error, words):
    state, kwargs = make()
    assert_clear_error(lambda: strip_prefixes(state, **kwargs), error, words)


@pytest.mark.parametrize(("state", "expected"), [
    ({}, {}),
    ({"module.": 1}, {"": 1}),
    ({"a": 1}, {"a": 1}),
    ({"module.module.a": 1}, {"a": 1}),
], ids=["empty", "only the prefix", "nothing to strip", "twice"])
def test_strip_prefixes_edge_cases(state, expected):
    assert strip_prefixes(state) == expected


@pytest.mark.parametrize("bad", [None, {"a": 1}, "model", torch.zeros(1)], ids=repr)
def test_unwrap_needs_a_model(bad):
    with pytest.raises(TypeError, match=f"nn.Module.*{type(bad).__name__}"):
        unwrap(bad)


def test_extras_are_read_back_on_the_cpu_when_checked(tmp_path, monkeypatch):
    # The weights-only test of each extra loads it back; on the CPU, so an optimizer state or
    # a metric tensor on the GPU is not copied a second time into GPU memory.
    seen = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        seen.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "load", recording_load)
    save_checkpoint(nn.Linear(2, 2), tmp_path / "m.pt", scale=torch.ones(3), epoch=1)
    assert seen == ["cpu", "cpu"]
