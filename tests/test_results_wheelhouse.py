"""The wheelhouse for offline GPU servers: built here, installed into a clean environment
with no index (as on a server without internet), its MNIST archive unpacked."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_report_installs_from_a_wheelhouse_offline(tmp_path):
    raw = tmp_path / "mnist-src"
    raw.mkdir()
    names = ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
             "train-labels-idx1-ubyte"]
    for name in names:
        (raw / name).write_bytes(name.encode() * 100)
    wheelhouse = tmp_path / "wheelhouse"
    # a tiny set: no downloads, only the helpers wheel built from this checkout, and the data
    run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "--out", str(wheelhouse),
         "--packages", "", "--mnist", str(raw)])
    assert (wheelhouse / "mnist-raw.tar.gz").exists()
    assert (wheelhouse / "requirements.txt").read_text().split() == []
    assert len(list(wheelhouse.glob("pytorch_on_the_gpu_helpers-*.whl"))) == 1

    # a clean environment that has torch & co., as a CUDA image does, but not the helpers
    env_dir = tmp_path / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    py = env_dir / "bin" / "python"
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                .stdout.strip())
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOK_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "BOOK_DATA_DIR": str(tmp_path / "data")})
    work = tmp_path / "server"
    work.mkdir()
    probe = subprocess.run([str(py), "-c", "import helpers"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0, "helpers must not be importable before the install"

    run([str(py), str(ROOT / "scripts" / "gpu_report.py"), "--wheelhouse", str(wheelhouse),
         "--install-only"], cwd=work, env=env)
    assert list(site.glob("helpers/__init__.py")), "the helpers were not installed from the wheelhouse"
    unpacked = sorted(p.name for p in (tmp_path / "data" / "MNIST" / "raw").iterdir())
    assert unpacked == names
    # the installed package carries the committed result files
    shown = run([str(py), "-c", "from helpers.results import load_results, results_dir;"
                 "print(results_dir()); print(*sorted(d['machine']['slug'] for d in load_results()))"],
                cwd=work, env=env).stdout.split("\n")
    assert shown[0].startswith(str(site))
    assert shown[1].split() == sorted(p.stem for p in (ROOT / "results").glob("*.json"))
