"""Helpers shared by the chapters of *PyTorch on the GPU*.

Each module holds what repeats across chapters, never the lesson itself; every public
function names, in its docstring, the chapter that introduces it.

- :mod:`helpers.checks`: claims that depend on the hardware, and ``%%gpu_only`` cells (chapter 1)
- :mod:`helpers.devices`: choosing, describing and checking devices (chapter 1)
- :mod:`helpers.checkpoints`: checkpoints across devices and wrappers (chapters 2, 7)
- :mod:`helpers.timing`: honest timing and FLOP/s (chapter 3)
- :mod:`helpers.matmul`: matrix-multiply timing, number formats and sweep sizes (chapter 3)
- :mod:`helpers.data`: MNIST read and checked, regression data (chapters 4, 5)
- :mod:`helpers.models`: the book's models (chapters 4, 5, 8)
- :mod:`helpers.regression`: the linear-regression training loop (chapter 4)
- :mod:`helpers.training`: the training loop (chapter 5)
- :mod:`helpers.images`: a folder of image files described by a CSV (chapter 6)
- :mod:`helpers.plotting`: plots (chapters 3, 5)
- :mod:`helpers.launch`: torchrun and scripts in other processes, with a time limit (chapters 7, 10)
- :mod:`helpers.ddp_mnist`: the DDP training script, ``torchrun -m helpers.ddp_mnist`` (chapter 7)
- :mod:`helpers.cuda_semantics`: late errors and copy/compute overlap (chapter 11)
- :mod:`helpers.recipes`: performance recipes for one training step (chapter 12)
- :mod:`helpers.memory`: training memory predicted on ``meta`` and measured (chapter 13)
- :mod:`helpers.results`: the committed benchmark results, as tables and plots (chapter 3, appendix)

The book's benchmark (``bench/``) and its maintainers' tools (``tools/``) live beside this
package in the book's repository; this package never imports them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

# On a machine that has a CUDA toolkit (nvcc) but no GPU, importing torch.utils.benchmark makes
# torch.utils.cpp_extension log "No CUDA runtime is found". That message is about compiling C++
# extensions, which the book never does, so it is noise in every executed chapter.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
# torch's profiler (kineto) writes log lines of its own to the process's stderr, which Jupyter
# shows under the cell: "profiler_start" and "profiler_stop" for every profile (torch 2.14), and
# "gpuGetDeviceCount failed with code 35" wherever a CUDA build of torch finds no GPU driver
# (2.9 on). None is about the reader's code; what the profiler recorded is in its results, which
# the chapters read and check. Above every level kineto has (read when the first profile
# starts); a reader's own KINETO_LOG_LEVEL is kept.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from . import checks, devices  # noqa: E402
from .devices import best_device, describe_devices, has_gpu  # noqa: E402

# The other modules are imported on first use (helpers.data, helpers.timing, ...): importing
# the package stays quick, and a module run as a script (`torchrun -m helpers.ddp_mnist`) is
# not imported twice.
_LAZY = ("checkpoints", "cuda_semantics", "data", "images", "launch", "matmul", "memory", "models",
         "plotting", "recipes", "regression", "results", "timing", "training")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")

__version__ = "0.1.0"

DISTRIBUTION = "pytorch-on-the-gpu-helpers"


def _minimum(package: str) -> str:
    """The lower bound on ``package`` in this package's dependencies: pyproject.toml is the one
    place the book states its oldest supported torch. Read from the installed package's
    metadata, or from the checkout's pyproject.toml where the package runs uninstalled."""
    from importlib import metadata

    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        text = pyproject.read_text() if pyproject.is_file() else ""
        requirements = re.findall(r'^\s*"([^"]+)",?\s*$', text, re.M)
    for requirement in requirements:
        found = re.fullmatch(rf"{re.escape(package)}\s*>=\s*([\d.]+)", requirement.strip())
        if found:
            return found.group(1)
    raise RuntimeError(f"{DISTRIBUTION} states no lower bound on {package}: reinstall the helpers")


#: The oldest torch the book supports, from pyproject.toml (``make oldest`` runs every chapter on it).
MIN_TORCH = _minimum("torch")


__all__ = ["MIN_TORCH", "best_device", "chapter_setup", "checks", "describe_devices", "devices",
           "has_gpu", *_LAZY]

def _release(version: str) -> tuple[int, ...]:
    # "2.10.0+cu128" -> (2, 10): compared as numbers, since "2.10" < "2.9" as strings.
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _torch_too_old_notice() -> str:
    """Lines for the setup banner when this torch is older than the book's minimum, else ''."""
    if _release(str(torch.__version__)) >= _release(MIN_TORCH):
        return ""
    return (f"Note: torch {torch.__version__} is older than {MIN_TORCH}, the oldest the book\n"
            "supports, so some cells will fail. On Colab, run `%pip install -U torch torchvision`\n"
            "in a cell, restart the runtime (Runtime > Restart session) and run from the top;\n"
            f"elsewhere, install torch>={MIN_TORCH} with a matching torchvision.")


_HARDWARE = {"cpu": "any machine, a CPU is enough", "gpu": "one GPU", "multi-gpu": "two or more GPUs"}


def chapter_setup(chapter: int | str, needs: str = "cpu", best_on: str = "gpu",
                  device: str | torch.device | None = None, seed: int = 0) -> torch.device:
    """Print what a chapter needs and what this machine offers; return the device to use.

    Called at the end of every chapter's setup cell (introduced in chapter 1). ``needs`` is
    the least hardware on which every cell runs and ``best_on`` the hardware the chapter's
    measurements are meant for, each one of ``"cpu"``, ``"gpu"`` or ``"multi-gpu"``; the
    notebook's metadata declares the same two values. Seeds torch's generators with ``seed``.
    ``chapter`` is the chapter's number, or a word such as ``"appendix"``. A torch older
    than :data:`MIN_TORCH` is reported with what to do, without failing.
    """
    for value in (needs, best_on):
        if value not in _HARDWARE:
            raise ValueError(f"hardware must be one of {sorted(_HARDWARE)}, got {value!r}")
    torch.manual_seed(seed)
    chosen = best_device(device)
    name = f"Chapter {chapter}" if isinstance(chapter, int) else f"This {chapter}"
    print(f"{name} runs on {_HARDWARE[needs]};")
    print(f"its measurements are meant for {_HARDWARE[best_on]}.")
    print(describe_devices(chosen))
    print(f"Using device: {chosen}")
    notice = _torch_too_old_notice()
    if notice:
        print(notice)
    if chosen.type == "cpu" and best_on != "cpu" and devices.has_gpu():
        # BOOK_DEVICE=cpu (or device="cpu") on a GPU machine: the GPU is there, just unused.
        print("This run uses the CPU although a GPU is present.")
    if best_on == "multi-gpu" and devices.gpu_count() < 2:
        print("Cells that need two or more GPUs say so and are skipped here.")
    checks.register_magics(chosen)
    _figures_with_alt_text()
    return chosen


def _figures_with_alt_text() -> None:
    """In a Jupyter kernel, every figure the chapter shows carries alt text from its first
    cell on, matplotlib's own included (helpers.plotting.install_alt_text; issue 30)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - the book's environments have IPython
        return
    shell = get_ipython()
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from . import plotting

        plotting.install_alt_text(shell)
