"""Prepare a wheelhouse for the GPU report on a server without internet access.

    python tools/wheelhouse.py --out _build/wheelhouse --python 3.12   # with internet
    # copy _build/wheelhouse to the GPU server, then, in the book's folder there:
    python tools/gpu_report.py --wheelhouse _build/wheelhouse

The wheelhouse holds, for the named Python version and platforms (by default every glibc
Linux x86-64 tag from manylinux_2_28 down to manylinux2014: pip never widens a manylinux tag it
is given, and numpy >= 2.3 publishes manylinux_2_28 wheels only):

- the book's helpers package, built from this checkout (the report itself runs the
  checkout's helpers; the wheel is for running chapters outside the book's folder);
- the packages a typical CUDA image (one with torch and torchvision) lacks: the notebook
  runner and its kernel, the trainers chapter 10 compares (torchkeras, Accelerate, Lightning)
  and the libraries the chapters use, each with its dependencies; never torch, torchvision,
  triton or NVIDIA's libraries, which the image has and which must match its driver;
- ``requirements.txt``, the names ``pip install --no-index --find-links`` installs (the
  helpers wheel is installed by its file name);
- ``mnist-raw.tar.gz``, the MNIST files the chapters read, compressed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the report and the chapters need beyond torch and torchvision.
PACKAGES = ("nbclient", "nbformat", "ipykernel", "nbmake", "pytest", "ipywidgets", "torchkeras",
            "accelerate", "lightning", "torchmetrics", "numpy", "pandas", "matplotlib", "tqdm",
            "pillow", "pyyaml")
#: The wheel platform tags accepted by default, newest first: a glibc 2.28+ x86-64 server
#: (any current CUDA image) runs them all.
DEFAULT_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
                     "manylinux_2_24_x86_64", "manylinux2014_x86_64")
#: Already in a CUDA image, tied to its driver: never downloaded.
IMAGE_HAS = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions() -> dict[str, str]:
    """The versions requirements.txt pins, so the server runs what CI tested."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line.strip())
        if m:
            pins[_normal(m.group(1))] = m.group(2)
    return pins


#: What the helpers wheel is built from (pyproject.toml's package data included).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "helpers")


def build_helpers_wheel(out: Path, source: Path = ROOT) -> Path:
    """Build the helpers wheel into ``out`` from a fresh copy of its sources.

    setuptools builds in a ``build/`` folder beside pyproject.toml and reuses what it finds
    there: built in the checkout, the wheel would leave ``build/`` behind and could ship a
    module that has since been deleted from ``helpers/``. A fresh copy (symbolic links such as
    ``helpers/_results`` followed) has neither problem.
    """
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="helpers-wheel-") as tmp:
        clean = Path(tmp) / "src"
        clean.mkdir()
        for name in WHEEL_SOURCES:
            src = source / name
            if src.is_dir():
                shutil.copytree(src, clean / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc", "*.egg-info"))
            else:
                shutil.copy2(src, clean / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(clean)], check=True)
    wheels = sorted(out.glob("pytorch_on_the_gpu_helpers-*.whl"))
    if not wheels:
        raise SystemExit("building the helpers wheel produced no file")
    return wheels[-1]


def download(packages: list[str], out: Path, python: str, platforms: list[str]) -> list[str]:
    """Resolve ``packages`` for ``python``/``platforms`` without installing, then download
    every resolved wheel except those a CUDA image has. Returns the downloaded names."""
    target = [f"--python-version={python}", "--only-binary=:all:",
              *(f"--platform={p}" for p in platforms)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                        "--ignore-installed", "--target", str(Path(tmp) / "t"),
                        "--report", str(report), *target, *packages], check=True)
        resolved = json.loads(report.read_text())["install"]
    wanted = []
    for item in resolved:
        meta = item["metadata"]
        if not IMAGE_HAS.match(_normal(meta["name"])):
            wanted.append(f"{meta['name']}=={meta['version']}")
    if wanted:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", str(out), *target, *wanted], check=True)
    return wanted


def pack_mnist(raw: Path, out: Path) -> Path:
    """``MNIST/raw/*`` from ``raw`` into ``out/mnist-raw.tar.gz``."""
    files = sorted(p for p in raw.iterdir() if p.is_file())
    if not files:
        raise SystemExit(f"{raw} holds no MNIST files: run `make data` first, or pass --no-data")
    archive = out / "mnist-raw.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=f"MNIST/raw/{path.name}")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the wheelhouse folder")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the GPU server's Python version, e.g. 3.11 (default: this one)")
    parser.add_argument("--platform", action="append", default=[],
                        help="a wheel platform tag the server accepts (repeatable; default "
                             f"{', '.join(DEFAULT_PLATFORMS)})")
    parser.add_argument("--packages", default=",".join(PACKAGES),
                        help="comma-separated packages to download with their dependencies "
                             "(default: what a CUDA image lacks); empty for none")
    parser.add_argument("--mnist", type=Path, help="the MNIST raw folder (default: the book's)")
    parser.add_argument("--no-data", action="store_true", help="leave MNIST out")
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    pins = pinned_versions()
    names = [p.strip() for p in args.packages.split(",") if p.strip()]
    specs = [f"{n}=={pins[_normal(n)]}" if _normal(n) in pins else n for n in names]
    wheel = build_helpers_wheel(out)
    print(f"helpers: {wheel.name}")
    if specs:
        got = download(specs, out, args.python, args.platform or list(DEFAULT_PLATFORMS))
        print(f"downloaded {len(got)} wheel(s) for Python {args.python}")
    # The helpers wheel is installed by file name (it replaces any older copy); these are
    # the rest, resolved from the wheelhouse and what the machine already has.
    (out / "requirements.txt").write_text("".join(f"{n}\n" for n in names))
    if not args.no_data:
        if args.mnist is not None:
            raw = args.mnist
        else:
            from helpers.data import data_dir

            raw = data_dir() / "MNIST" / "raw"
        print(f"data: {pack_mnist(raw, out).name}")
    print(f"Wheelhouse ready in {out}: copy it to the GPU server and run "
          f"`python tools/gpu_report.py --wheelhouse {out}` there.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
