"""The oldest supported torch is stated in four places; they must agree: pyproject.toml's lower
bound, the Makefile's oldest-torch run (`make oldest`), helpers.MIN_TORCH (which the setup cell's
banner compares against) and the README."""

from __future__ import annotations

import re

import tomllib

import helpers
from tests.conftest import ROOT


def _bound(requirement: str) -> str:
    match = re.fullmatch(r"torch(?:vision)?>=(\d+\.\d+)", requirement)
    assert match, f"expected a plain lower bound, got {requirement!r}"
    return match.group(1)


def test_the_oldest_torch_agrees_everywhere():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(d for d in deps if d.startswith("torch>") or d == "torch")
    minimum = _bound(torch_req)
    makefile = (ROOT / "Makefile").read_text()
    oldest = re.search(r"^OLDEST_TORCH := (\S+)$", makefile, re.M).group(1)
    assert oldest.rsplit(".", 1)[0] == minimum, (oldest, minimum)
    assert helpers.MIN_TORCH == minimum, (helpers.MIN_TORCH, minimum)
    assert f"torch {minimum} or newer" in (ROOT / "README.md").read_text()


def test_the_oldest_torchvision_matches_the_oldest_torch():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    vision = _bound(next(d for d in deps if d.startswith("torchvision")))
    makefile = (ROOT / "Makefile").read_text()
    oldest_vision = re.search(r"^OLDEST_TORCHVISION := (\S+)$", makefile, re.M).group(1)
    assert oldest_vision.rsplit(".", 1)[0] == vision
    # torchvision 0.N pairs with torch 2.(N - 15): 0.24 with 2.9, 0.29 with 2.14.
    torch_minor = int(re.search(r"^OLDEST_TORCH := 2\.(\d+)", makefile, re.M).group(1))
    assert int(vision.split(".")[1]) == torch_minor + 15


def test_the_pinned_pair_is_at_or_above_the_minimum():
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    minimum = tuple(int(x) for x in helpers.MIN_TORCH.split("."))
    assert tuple(int(x) for x in pins["torch"].split(".")[:2]) >= minimum
    assert int(pins["torchvision"].split(".")[1]) == int(pins["torch"].split(".")[1]) + 15
