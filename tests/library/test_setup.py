"""The package as a whole: chapter_setup (banner, seed, device, the oldest torch supported),
lazy submodules, and a docstring naming its chapter on every public helper."""

import importlib
import sys

import pytest
import torch

import helpers
from tests.conftest import ROOT


def test_chapter_setup_reports_hardware_and_returns_a_device(capsys):
    dev = helpers.chapter_setup(chapter=3, needs="cpu", best_on="gpu")
    out = capsys.readouterr().out
    assert "Chapter 3 runs on any machine" in out
    assert all(len(line) <= 100 for line in out.splitlines()), "the banner must fit a page"
    assert "one GPU" in out
    assert f"Using device: {dev}" in out
    assert isinstance(dev, torch.device)


def test_chapter_setup_for_the_appendix(capsys):
    helpers.chapter_setup(chapter="appendix", needs="cpu", best_on="gpu")
    assert capsys.readouterr().out.startswith("This appendix runs on any machine")


def test_chapter_setup_seeds_and_validates():
    helpers.chapter_setup(1, seed=123)
    a = torch.rand(3)
    helpers.chapter_setup(1, seed=123)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError, match="hardware must be one of"):
        helpers.chapter_setup(1, needs="tpu")
    with pytest.raises(ValueError, match="Devices on this machine"):
        helpers.chapter_setup(1, device="cuda:42")


def test_submodules_load_lazily():
    # The package is imported afresh in this process (torch, already here, is not): every
    # helpers module is set aside, so the import runs helpers/__init__.py and whatever it
    # imports again, as a new interpreter would, without a subprocess that imports torch
    # only to check this. The modules set aside are put back afterwards.
    ours = {name: module for name, module in sys.modules.items()
            if name == "helpers" or name.startswith("helpers.")}
    try:
        for name in ours:
            del sys.modules[name]
        fresh = importlib.import_module("helpers")
        assert fresh is not helpers, "the package was imported afresh"
        loaded = ["helpers.training" in sys.modules]
        fresh.training  # noqa: B018
        loaded.append("helpers.training" in sys.modules)
        assert loaded == [False, True]
        assert fresh.training is sys.modules["helpers.training"] is not ours.get(
            "helpers.training")
    finally:
        for name in [n for n in sys.modules if n == "helpers" or n.startswith("helpers.")]:
            del sys.modules[name]
        sys.modules.update(ours)
    with pytest.raises(AttributeError):
        helpers.no_such_module  # noqa: B018


def test_every_public_helper_has_a_docstring_naming_its_chapter():
    import importlib
    import inspect

    # Every module of the library: the lazy ones (helpers._LAZY) and those loaded at once.
    names = sorted(p.stem for p in (ROOT / "helpers").glob("*.py") if not p.stem.startswith("_"))
    assert set(helpers._LAZY) <= set(names), "a lazy module without its own file"
    missing = []
    for module in [helpers, *(importlib.import_module(f"helpers.{name}") for name in names)]:
        assert module.__all__, module.__name__
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.ismodule(obj) or not callable(obj):
                continue  # constants and submodules
            doc = inspect.getdoc(obj) or ""
            if "chapter" not in doc.lower() and "appendix" not in doc.lower():
                missing.append(f"{module.__name__}.{attr}")
    assert not missing, f"docstrings that name no chapter: {missing}"


@pytest.mark.parametrize("old", ["2.8.0+cu126", "2.5.1", "1.13.1+cpu"])
def test_chapter_setup_says_when_torch_is_too_old(old, monkeypatch, capsys):
    monkeypatch.setattr(torch, "__version__", old)
    dev = helpers.chapter_setup(chapter=1)  # warns, never fails
    out = capsys.readouterr().out
    assert isinstance(dev, torch.device)
    assert f"torch {old} is older than {helpers.MIN_TORCH}" in out
    assert "%pip install -U torch torchvision" in out and "restart" in out.lower()
    assert all(len(line) <= 100 for line in out.splitlines()), "the banner must fit a page"


@pytest.mark.parametrize("recent", [helpers.MIN_TORCH, f"{helpers.MIN_TORCH}.1+cu128", "2.14.1", "3.0.0a0", "2.10.0"])
def test_chapter_setup_is_quiet_about_a_recent_torch(recent, monkeypatch, capsys):
    monkeypatch.setattr(torch, "__version__", recent)
    helpers.chapter_setup(chapter=1)
    assert "older than" not in capsys.readouterr().out


def test_minimum_torch_is_a_version_number():
    major, minor = (int(part) for part in helpers.MIN_TORCH.split("."))
    assert (major, minor) >= (2, 9)


def test_chapter_setup_on_the_cpu_of_a_gpu_machine_does_not_say_no_gpu(monkeypatch, capsys):
    # BOOK_DEVICE=cpu on a GPU machine: the banner must not claim the machine has no GPU.
    monkeypatch.setattr(helpers.devices, "has_gpu", lambda: True)
    monkeypatch.setattr(helpers, "describe_devices", lambda device=None: "  cuda:0  Fake GPU")
    assert helpers.chapter_setup(chapter=2, device="cpu") == torch.device("cpu")
    out = capsys.readouterr().out
    assert "No GPU here" not in out
    assert "uses the CPU although a GPU is present" in out
    assert all(len(line) <= 100 for line in out.splitlines()), "the banner must fit a page"
    monkeypatch.setattr(helpers.devices, "has_gpu", lambda: False)
    helpers.chapter_setup(chapter=2, device="cpu")
    out = capsys.readouterr().out
    # No paragraph about GPU figures in the banner: each chapter says it at most once, where
    # a figure is missing.
    assert out.endswith("Using device: cpu\n") and "GPU figures" not in out


def test_the_pinned_torch_pair_is_supported():
    # The pinned environment must itself be a supported one; pip refuses a torchvision that
    # does not pair with its torch, so only the lower bound needs checking here.
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    pinned = tuple(int(x) for x in pins["torch"].split(".")[:2])
    assert pinned >= tuple(int(x) for x in helpers.MIN_TORCH.split(".")), (pins["torch"],
                                                                            helpers.MIN_TORCH)
