"""The wheelhouse for offline GPU servers (tools/wheelhouse.py). Installing from it and
running the report offline is tested end to end in tests/tools/test_gpu_report.py; here, what it
asks pip for. Resolving the real pinned set needs the package index, which CI does not have."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import ROOT
from tools import wheelhouse


def fake_pip(monkeypatch, resolved: list[tuple[str, str]]) -> list[list[str]]:
    """Record pip's commands; a --dry-run --report answers with ``resolved``."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(list(cmd))
        if "--report" in cmd:
            report = Path(cmd[cmd.index("--report") + 1])
            report.write_text(json.dumps({"install": [
                {"metadata": {"name": n, "version": v}} for n, v in resolved]}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(wheelhouse.subprocess, "run", run)
    return calls


def test_by_default_every_manylinux_tag_from_2_28_down_is_accepted(monkeypatch, tmp_path):
    # numpy >= 2.3 publishes manylinux_2_28 wheels only, and pip never widens a tag it is given
    calls = fake_pip(monkeypatch, [("numpy", "2.4.6"), ("torch", "2.14.1"),
                                   ("nvidia-cublas", "13.0"), ("nbclient", "0.11.0")])
    monkeypatch.setattr(wheelhouse, "build_helpers_wheel", lambda out: out / "helpers.whl")
    assert wheelhouse.main(["--out", str(tmp_path), "--python", "3.12", "--no-data",
                            "--packages", "numpy,nbclient,pyyaml"]) == 0
    resolve, download = calls
    for cmd in (resolve, download):
        platforms = [a.split("=", 1)[1] for a in cmd if a.startswith("--platform=")]
        assert platforms == list(wheelhouse.DEFAULT_PLATFORMS)
        assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux2014_x86_64" in platforms
        assert "--python-version=3.12" in cmd and "--only-binary=:all:" in cmd
    pins = wheelhouse.pinned_versions()
    assert f"numpy=={pins['numpy']}" in resolve and "pyyaml" in resolve
    # what a CUDA image has (torch, NVIDIA's libraries) is never downloaded
    assert download[-2:] == ["numpy==2.4.6", "nbclient==0.11.0"]
    assert (tmp_path / "requirements.txt").read_text().split() == ["numpy", "nbclient", "pyyaml"]


def test_named_platforms_replace_the_default(monkeypatch, tmp_path):
    calls = fake_pip(monkeypatch, [("numpy", "2.4.6")])
    monkeypatch.setattr(wheelhouse, "build_helpers_wheel", lambda out: out / "helpers.whl")
    wheelhouse.main(["--out", str(tmp_path), "--no-data", "--packages", "numpy",
                     "--platform", "manylinux_2_34_aarch64", "--platform", "manylinux_2_28_aarch64"])
    for cmd in calls:
        assert [a for a in cmd if a.startswith("--platform=")] == [
            "--platform=manylinux_2_34_aarch64", "--platform=manylinux_2_28_aarch64"]


def test_the_makefile_passes_each_named_platform():
    out = subprocess.run(["make", "-n", "-W", ".venv/.installed", "wheelhouse",
                          "WHEEL_PLATFORM=a_tag b_tag", "WHEEL_PYTHON=3.12"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.replace("\\\n", " ").splitlines() if "wheelhouse.py" in x)
    assert "--python 3.12" in line and "--platform a_tag --platform b_tag" in line
    default = subprocess.run(["make", "-n", "-W", ".venv/.installed", "wheelhouse"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    assert "--platform" not in default  # the script's default list applies
