"""Prepare a wheelhouse for the GPU report on a server without internet access.

    python tools/wheelhouse.py --out _build/wheelhouse --python 3.12   # with internet
    # copy _build/wheelhouse to the GPU server, then, in the book's folder there:
    python tools/gpu_report.py --wheelhouse _build/wheelhouse

Two kinds, for the named Python version and platforms (by default every glibc Linux x86-64 tag
from manylinux_2_28 down to manylinux2014: pip never widens a manylinux tag it is given, and
numpy >= 2.3 publishes manylinux_2_28 wheels only):

- the default, for a server image that has torch and the scientific stack (the H200 image's
  listing, :data:`SERVER_IMAGE_HAS`, or ``--server-has FILE``, a ``pip list --format=freeze``
  of the server): only what it lacks, the notebook runner and its kernel, ipywidgets and
  torchkeras (:data:`SERVER_PACKAGES`) with the dependencies the image lacks, at most
  ``--max-mb`` (35 MB) with the data. The report installs them with ``pip install --no-index
  --no-deps``, so nothing the server has is replaced or upgraded (it refuses a wheel of a
  package the server has in another version, and says which);
- ``--full``, for a bare server (one with torch only): the notebook runner and its kernel,
  the trainers chapter 10 compares (torchkeras, Accelerate, Lightning) and the libraries the
  chapters use (:data:`PACKAGES`), each with its dependencies; never torch, torchvision,
  triton or NVIDIA's libraries, which the image has and which must match its driver.

Either is refused when a requirement of one of its wheels, its markers evaluated for the
server's Python, is met neither by another of its wheels nor by what the server has
(:func:`unmet_requirements`): it is installed without dependencies.

Both hold the book's helpers package, built from this checkout (the report itself runs the
checkout's helpers; the wheel is for running chapters outside the book's folder);
``requirements.txt``, the names asked for; ``wheelhouse.json``, what was resolved and why each
dependency was left out; and ``mnist-raw.tar.xz``, the MNIST files the chapters read,
compressed.
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
#: What a server image with torch and the scientific stack lacks for the report and the
#: chapters: the notebook runner (nbmake, nbclient, nbformat), the kernel, the progress bars'
#: widgets and chapter 10's torchkeras. The rest the chapters import (torchvision,
#: torchmetrics, accelerate, lightning, numpy, pandas, matplotlib, tqdm, pillow, pyyaml,
#: pytest, pytest-xdist) such an image has.
SERVER_PACKAGES = ("nbmake", "nbclient", "nbformat", "ipykernel", "ipywidgets", "torchkeras")
#: The distributions the H200 server's image ('cuda') holds, as listed on 2026-11-17
#: (/work/.library/device/KINDS.md; torch 2.11, torchvision 0.26, torchmetrics 1.9,
#: accelerate 1.15, lightning 2.6.6). ``--server-has FILE`` replaces it for another server.
SERVER_IMAGE_HAS = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
#: The server wheelhouse's limit, the data included: it travels with each short GPU run.
MAX_MB = 35.0
MANIFEST = "wheelhouse.json"
#: xz: 9.5 MB against gzip's 11.6 (what the server wheelhouse's 35 MB allows).
MNIST_NAME = "mnist-raw.tar.xz"


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


def server_listing(path: Path) -> frozenset[str]:
    """The distribution names in ``pip list --format=freeze`` (or ``pip freeze``, or one name
    a line) output, normalised."""
    names = set()
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9_.-]*)", line)
        if m and not line.lstrip().startswith("#"):
            names.add(_normal(m.group(1)))
    if not names:
        raise SystemExit(f"{path} lists no package: write it with `python -m pip list "
                         "--format=freeze` on the server")
    return frozenset(names)


def download(packages: list[str], out: Path, python: str, platforms: list[str],
             server_has: frozenset[str] = frozenset()) -> list[str]:
    """Resolve ``packages`` for ``python``/``platforms`` without installing, then download
    every resolved wheel except those a CUDA image has and those in ``server_has``. Returns
    the downloaded names."""
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
        name = _normal(meta["name"])
        if not IMAGE_HAS.match(name) and name not in server_has:
            wanted.append(f"{meta['name']}=={meta['version']}")
    if wanted:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", str(out), *target, *wanted], check=True)
    return wanted


def target_environment(python: str, platforms: list[str]) -> dict[str, str]:
    """The environment markers of a server running CPython ``python`` on the platform of the
    first of ``platforms`` (pip evaluates markers for the Python that runs it, whatever
    ``--python-version`` says: they are checked again here for the server's)."""
    found = re.search(r"(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", platforms[0])
    machine = found.group(1) if found else "x86_64"
    return {"python_version": python, "python_full_version": f"{python}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": machine}


def unmet_requirements(out: Path, provided: frozenset[str], python: str,
                       platforms: list[str]) -> list[str]:
    """Each requirement of a wheel in ``out`` (its markers evaluated for the server, the extras
    asked for followed) that neither a wheel in ``out`` (in a version it allows) nor a
    distribution of ``provided`` (the server's: its version unknown here) meets."""
    import zipfile
    from email.parser import HeaderParser

    from packaging.requirements import Requirement

    wheels = {}
    for path in out.glob("*.whl"):
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            headers = HeaderParser().parsestr(z.read(meta).decode("utf-8", "replace"))
        wheels[_normal(headers["Name"])] = (headers["Version"],
                                            headers.get_all("Requires-Dist") or [])
    env = target_environment(python, platforms)
    unmet, seen = [], set()
    todo = [(name, "") for name in wheels]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for line in wheels[name][1]:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
                continue
            dep = _normal(req.name)
            if dep in wheels:
                if not req.specifier.contains(wheels[dep][0], prereleases=True):
                    unmet.append(f"{name} needs {req}, the wheelhouse has {wheels[dep][0]}")
                todo += [(dep, _normal(e)) for e in req.extras]
            elif dep not in provided and not IMAGE_HAS.match(dep):
                unmet.append(f"{name} needs {req}, which neither the wheelhouse nor the "
                             "server has")
    return sorted(set(unmet))


def pack_mnist(raw: Path, out: Path) -> Path:
    """``MNIST/raw/*`` from ``raw`` into ``out/``:data:`MNIST_NAME`."""
    files = sorted(p for p in raw.iterdir() if p.is_file())
    if not files:
        raise SystemExit(f"{raw} holds no MNIST files: run `make data` first, or pass --no-data")
    archive = out / MNIST_NAME
    with tarfile.open(archive, "w:xz") as tar:
        for path in files:
            tar.add(path, arcname=f"MNIST/raw/{path.name}")
    return archive


def wheel_name(path: Path) -> tuple[str, str]:
    """A wheel file's distribution name (normalised) and version."""
    name, version = path.name.split("-")[:2]
    return _normal(name), version


def megabytes(out: Path) -> float:
    return sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the wheelhouse folder")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the GPU server's Python version, e.g. 3.12 (default: this one)")
    parser.add_argument("--platform", action="append", default=[],
                        help="a wheel platform tag the server accepts (repeatable; default "
                             f"{', '.join(DEFAULT_PLATFORMS)})")
    parser.add_argument("--full", action="store_true",
                        help="for a bare server (torch only): the notebook runner, the trainers "
                             "and the scientific stack, with every dependency")
    parser.add_argument("--server-has", type=Path, metavar="FILE",
                        help="the server's `pip list --format=freeze`: what it has is left out "
                             "(default: the H200 image's listing)")
    parser.add_argument("--packages",
                        help="comma-separated packages to download with their dependencies "
                             "(default: what the server lacks; with --full, what a CUDA image "
                             "lacks); empty for none")
    parser.add_argument("--max-mb", type=float,
                        help=f"refuse a wheelhouse larger than this (default {MAX_MB:g} MB, "
                             "none with --full)")
    parser.add_argument("--mnist", type=Path, help="the MNIST raw folder (default: the book's)")
    parser.add_argument("--no-data", action="store_true", help="leave MNIST out")
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    # A wheel left from an earlier build would be installed with these: start empty.
    for old in [*out.glob("*.whl"), out / MNIST_NAME, out / "requirements.txt", out / MANIFEST]:
        old.unlink(missing_ok=True)
    if args.full and args.server_has:
        raise SystemExit("--full is for a bare server: it leaves nothing out, so --server-has "
                         "does not apply")
    server_has = (frozenset() if args.full else
                  server_listing(args.server_has) if args.server_has else SERVER_IMAGE_HAS)
    limit = args.max_mb if args.max_mb is not None else (None if args.full else MAX_MB)
    default = PACKAGES if args.full else SERVER_PACKAGES
    packages = ",".join(default) if args.packages is None else args.packages
    pins = pinned_versions()
    names = [p.strip() for p in packages.split(",") if p.strip()]
    specs = [f"{n}=={pins[_normal(n)]}" if _normal(n) in pins else n for n in names]
    platforms = args.platform or list(DEFAULT_PLATFORMS)
    wheel = build_helpers_wheel(out)
    print(f"helpers: {wheel.name}")
    got: list[str] = []
    if specs:
        got = download(specs, out, args.python, platforms, server_has)
        print(f"downloaded {len(got)} wheel(s) for Python {args.python}")
    unmet = unmet_requirements(out, server_has, args.python, platforms)
    if unmet:
        raise SystemExit("the wheelhouse would leave requirements unmet on the server (it is "
                         "installed without dependencies): " + "; ".join(unmet) + ". Pass "
                         "--server-has with the server's `pip list --format=freeze`, or ask "
                         "for the missing package with --packages")
    # The names asked for (the helpers wheel is installed by its file name, if at all).
    (out / "requirements.txt").write_text("".join(f"{n}\n" for n in names))
    if not args.no_data:
        if args.mnist is not None:
            raw = args.mnist
        else:
            from helpers.data import data_dir

            raw = data_dir() / "MNIST" / "raw"
        print(f"data: {pack_mnist(raw, out).name}")
    size = megabytes(out)
    manifest = {"kind": "full" if args.full else "server", "python": args.python,
                "platforms": platforms, "asked": names,
                "wheels": got, "megabytes": round(size, 1),
                "server_has": "none (a bare server)" if args.full else
                str(args.server_has or "the H200 image's listing (2026-11-17)")}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(got) + 1} wheel(s){'' if args.no_data else ' and MNIST'}: {size:.1f} MB")
    if limit is not None and size > limit:
        (out / "requirements.txt").unlink()  # the report installs no refused wheelhouse
        biggest = sorted(out.iterdir(), key=lambda p: p.stat().st_size, reverse=True)[:5]
        raise SystemExit(f"the wheelhouse is {size:.1f} MB, over its {limit:g} MB: the "
                         "largest files are " + ", ".join(
                             f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in biggest)
                         + "; --max-mb raises the limit")
    print(f"Wheelhouse ready in {out}: copy it to the GPU server and run "
          f"`python tools/gpu_report.py --wheelhouse {out}` there.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
