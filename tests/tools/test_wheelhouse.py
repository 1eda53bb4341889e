"""The wheelhouse for offline GPU servers (tools/wheelhouse.py). Installing from it and
running the report offline is tested end to end in tests/tools/test_gpu_report.py; here, what it
asks pip for. Resolving the real pinned set needs the package index, which CI does not have."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

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
    assert wheelhouse.main(["--out", str(tmp_path), "--python", "3.12", "--no-data", "--full",
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
    assert "--python 3.12" in default  # the H200 image's Python, as its listing
    assert "--full" not in default and "--server-has" not in default  # the server's kind
    full = subprocess.run(["make", "-n", "-W", ".venv/.installed", "wheelhouse", "WHEEL_FULL=1",
                           "WHEEL_SERVER_HAS="], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert "--full" in full and "--server-has" not in full
    other = subprocess.run(["make", "-n", "-W", ".venv/.installed", "wheelhouse",
                            "WHEEL_SERVER_HAS=s.txt"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    assert "--server-has s.txt" in other and "--full" not in other


#: What pip resolved for the server wheelhouse's packages (Python 3.12, 2026-11-28), with the
#: wheels' real sizes in bytes (those the H200 image has, never downloaded, approximate):
#: recorded so this test runs offline.
RESOLVED_FOR_THE_SERVER = {
    "nbclient": ("0.11.0", 25_288), "nbformat": ("5.11.1", 79_849),
    "ipykernel": ("7.4.0", 123_184), "nbmake": ("1.5.5", 12_818),
    "ipywidgets": ("8.1.9", 140_101), "torchkeras": ("4.0.5", 6_624_558),
    "jupyterlab_widgets": ("3.0.17", 217_292), "widgetsnbextension": ("4.0.16", 2_225_148),
    "comm": ("0.2.3", 7_294), "debugpy": ("1.8.22", 5_374_857),
    "fastjsonschema": ("2.22.3", 28_442), "ipython": ("9.18.1", 649_819),
    "prompt_toolkit": ("3.0.53", 392_288), "ipython_pygments_lexers": ("1.1.1", 8_074),
    "jedi": ("0.20.1", 4_885_980), "parso": ("0.8.7", 107_025),
    "jsonschema": ("4.26.0", 90_630), "attrs": ("26.1.0", 67_000),
    "jsonschema-specifications": ("2025.9.1", 18_437), "jupyter_client": ("8.10.0", 110_184),
    "jupyter_core": ("5.9.1", 29_032), "matplotlib-inline": ("0.2.2", 9_534),
    "nest-asyncio2": ("1.7.4", 8_543), "packaging": ("26.4", 74_000),
    "pexpect": ("4.9.0", 63_772), "platformdirs": ("4.14.8", 94_267),
    "psutil": ("7.2.2", 291_000), "ptyprocess": ("0.7.0", 13_993),
    "Pygments": ("2.21.0", 1_231_000), "pytest": ("9.2.0", 374_000),
    "pluggy": ("1.7.0", 20_000), "iniconfig": ("2.3.1", 7_000),
    "python-dateutil": ("4.0.0", 230_000), "pyzmq": ("27.3.0", 855_178),
    "referencing": ("0.37.0", 26_766), "rpds-py": ("2026.9.1", 371_261),
    "stack-data": ("0.6.3", 24_521), "asttokens": ("3.0.2", 28_702),
    "executing": ("2.3.0", 29_393), "tornado": ("6.6.1", 534_470),
    "traitlets": ("5.16.1", 86_211), "typing_extensions": ("4.16.0", 44_000),
    "wcwidth": ("0.9.4", 785_946), "pure_eval": ("0.2.4", 11_893),
    "tzdata": ("2026.6", 348_210),
}
#: MNIST's four files compressed with xz (what pack_mnist writes for the real data).
MNIST_XZ_BYTES = 9_451_316


def fake_index(monkeypatch, resolved: dict[str, tuple[str, int]]) -> list[list[str]]:
    """pip as a package index answers: the resolution, then each wheel at its size."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(list(cmd))
        if "--report" in cmd:
            Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps({"install": [
                {"metadata": {"name": n, "version": v}} for n, (v, _) in resolved.items()]}))
        elif "download" in cmd:
            dest = Path(cmd[cmd.index("--dest") + 1])
            for spec in (a for a in cmd if "==" in a):
                name, version = spec.split("==")
                make_wheel(dest, name, version, size=resolved[name][1])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(wheelhouse.subprocess, "run", run)
    monkeypatch.setattr(wheelhouse, "build_helpers_wheel", lambda out: _helpers_wheel(out))
    monkeypatch.setattr(wheelhouse, "pack_mnist", _fake_mnist)
    return calls


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (),
               size: int = 0) -> Path:
    """A wheel with the METADATA pip reads (name, version, Requires-Dist) of about ``size``
    bytes."""
    import zipfile

    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
        z.writestr("padding", b"w" * max(size - 300, 0))
    return path


def _helpers_wheel(out: Path) -> Path:
    return make_wheel(out, "pytorch_on_the_gpu_helpers", "0.1.0", size=110_000,
                      requires=("torch>=2.9", "numpy", "matplotlib"))


def _fake_mnist(raw, out: Path) -> Path:
    path = out / wheelhouse.MNIST_NAME
    path.write_bytes(b"m" * MNIST_XZ_BYTES)
    return path


def test_the_server_wheelhouse_holds_only_what_the_server_lacks_within_35_mb(
        monkeypatch, tmp_path):
    calls = fake_index(monkeypatch, RESOLVED_FOR_THE_SERVER)
    assert wheelhouse.main(["--out", str(tmp_path), "--python", "3.12"]) == 0
    resolve = calls[0]
    asked = [a.split("==")[0] for a in resolve if "==" in a]
    assert asked == list(wheelhouse.SERVER_PACKAGES)
    names = {wheelhouse.wheel_name(p)[0] for p in tmp_path.glob("*.whl")}
    # the notebook runner, the kernel, the widgets and torchkeras, with what they need
    for needed in ("nbmake", "nbclient", "nbformat", "ipykernel", "ipywidgets", "torchkeras",
                   "jupyter-client", "pyzmq", "tornado", "ipython"):
        assert needed in names, needed
    # nothing the H200 image has: not its torch stack, not pytest, packaging or attrs
    assert not names & wheelhouse.SERVER_IMAGE_HAS
    for image_has in ("torch", "numpy", "pandas", "matplotlib", "accelerate", "lightning",
                      "torchmetrics", "pytest", "packaging", "psutil", "pygments"):
        assert image_has not in names, image_has
    manifest = json.loads((tmp_path / wheelhouse.MANIFEST).read_text())
    assert manifest["kind"] == "server" and "H200" in manifest["server_has"]
    size = wheelhouse.megabytes(tmp_path)
    assert size <= wheelhouse.MAX_MB == 35 and manifest["megabytes"] == round(size, 1)
    assert (tmp_path / wheelhouse.MNIST_NAME).exists()


def test_a_server_wheelhouse_over_its_limit_is_refused_naming_the_largest_files(
        monkeypatch, tmp_path):
    fake_index(monkeypatch, {**RESOLVED_FOR_THE_SERVER, "nbmake": ("1.5.5", 12_000_000)})
    with pytest.raises(SystemExit, match=r"over its 35 MB.*nbmake-1\.5\.5"):
        wheelhouse.main(["--out", str(tmp_path), "--python", "3.12"])
    from tools import gpu_report

    with pytest.raises(SystemExit, match="has no requirements.txt"):
        gpu_report.install_wheelhouse(tmp_path)  # what was refused is never installed


def test_another_servers_listing_decides_what_is_left_out(monkeypatch, tmp_path):
    listing = tmp_path / "server.txt"
    listing.write_text("# pip list --format=freeze\ntorch==2.11.0\nJupyter_Client==8.9\n"
                       "tornado==6.5\nnumpy==2.5.2\nmatplotlib==3.10.8\n")
    fake_index(monkeypatch, RESOLVED_FOR_THE_SERVER)
    out = tmp_path / "w"
    wheelhouse.main(["--out", str(out), "--server-has", str(listing), "--max-mb", "100"])
    names = {wheelhouse.wheel_name(p)[0] for p in out.glob("*.whl")}
    assert "jupyter-client" not in names and "tornado" not in names
    assert "pytest" in names and "packaging" in names  # this server lacks them
    with pytest.raises(SystemExit, match="lists no package"):
        empty = tmp_path / "empty.txt"
        empty.write_text("# nothing\n")
        wheelhouse.main(["--out", str(out), "--server-has", str(empty)])


def test_the_full_wheelhouse_for_a_bare_server_has_no_limit_and_leaves_nothing_out(
        monkeypatch, tmp_path):
    resolved = {**RESOLVED_FOR_THE_SERVER, "numpy": ("2.4.6", 40_000_000),
                "matplotlib": ("3.11.2", 8_000_000)}
    calls = fake_index(monkeypatch, resolved)
    assert wheelhouse.main(["--out", str(tmp_path), "--full"]) == 0
    assert [a.split("==")[0] for a in calls[0] if "==" in a][:3] == ["nbclient", "nbformat",
                                                                     "ipykernel"]
    names = {wheelhouse.wheel_name(p)[0] for p in tmp_path.glob("*.whl")}
    assert {"numpy", "pytest", "packaging"} <= names
    assert json.loads((tmp_path / wheelhouse.MANIFEST).read_text())["kind"] == "full"


def test_wheels_of_an_earlier_build_are_removed(monkeypatch, tmp_path):
    (tmp_path / "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"old")
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    fake_index(monkeypatch, RESOLVED_FOR_THE_SERVER)
    wheelhouse.main(["--out", str(tmp_path)])
    assert not list(tmp_path.glob("numpy-*")) and keep.read_text() == "mine"


def test_mnist_is_packed_with_xz_and_the_report_reads_it(tmp_path):
    import tarfile

    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (raw / name).write_bytes(bytes(1000))
    archive = wheelhouse.pack_mnist(raw, tmp_path)
    assert archive.name == wheelhouse.MNIST_NAME == "mnist-raw.tar.xz"
    with tarfile.open(archive) as tar:  # what gpu_report.unpack_mnist opens
        assert sorted(tar.getnames()) == ["MNIST/raw/train-images-idx3-ubyte",
                                          "MNIST/raw/train-labels-idx1-ubyte"]
    from tools import gpu_report

    assert wheelhouse.MNIST_NAME in gpu_report.MNIST_ARCHIVES


def test_every_requirement_is_met_for_the_servers_python_and_platform(tmp_path):
    """The wheelhouse is installed without dependencies: each requirement of each wheel, its
    markers evaluated for the server's Python (pip evaluates them for its own) and the extras
    asked for followed, is met by a wheel there in a version it allows, or by the server."""
    make_wheel(tmp_path, "a", "1.0", requires=(
        "b>=2", "c; python_version >= '3.12'", "d; python_version < '3.12'", "e[x]",
        "numpy>=2", "torch", "g; sys_platform == 'win32'", "h; platform_machine == 'aarch64'"))
    make_wheel(tmp_path, "b", "1.0")
    make_wheel(tmp_path, "e", "1.0", requires=("f; extra == 'x'", "k; extra == 'other'"))
    x86 = ["manylinux_2_28_x86_64"]
    assert wheelhouse.unmet_requirements(tmp_path, frozenset({"numpy"}), "3.12", x86) == [
        "a needs b>=2, the wheelhouse has 1.0",
        "a needs c; python_version >= \"3.12\", which neither the wheelhouse nor the server "
        "has",
        "e needs f; extra == \"x\", which neither the wheelhouse nor the server has"]
    on_311 = wheelhouse.unmet_requirements(tmp_path, frozenset({"numpy"}), "3.11",
                                           ["manylinux_2_34_aarch64"])
    assert any(u.startswith("a needs d;") for u in on_311)
    assert any(u.startswith("a needs h;") for u in on_311)
    assert not any(u.startswith("a needs c;") for u in on_311)


def test_a_wheelhouse_that_leaves_a_requirement_unmet_is_refused(monkeypatch, tmp_path):
    fake_index(monkeypatch, RESOLVED_FOR_THE_SERVER)
    real = make_wheel

    def wheel_needing_more(folder, name, version, requires=(), size=0):
        if name == "nbmake":
            requires = ("pytest>=6", "nbconvert>=7")
        return real(folder, name, version, requires, size)

    monkeypatch.setitem(globals(), "make_wheel", wheel_needing_more)
    with pytest.raises(SystemExit, match=r"nbmake needs nbconvert>=7, which neither"):
        wheelhouse.main(["--out", str(tmp_path), "--python", "3.12"])
