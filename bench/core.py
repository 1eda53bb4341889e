"""The building blocks of the book's benchmark: figures, workloads and the machine record.

Introduced in the appendix (Measured results). Each chapter that measures something adds a
workload module beside this one (``matmul``, ``regression``, ``mnist``, ``recipes``); the
runner in ``__main__`` runs them all and writes ``results/<machine>.json``.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["WORKLOADS", "Figure", "Workload", "book_commit", "book_root", "machine_info",
           "machine_slug", "precision_flags", "workload"]


@dataclass(frozen=True)
class Figure:
    """One measured number: name, value, unit, spread (IQR or similar, same unit), device."""

    name: str
    value: float
    unit: str
    device: str
    spread: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Workload:
    """A named measurement of one chapter: ``fn(device, quick=...) -> list[Figure]``."""

    name: str
    chapter: int | str
    fn: Callable[..., list[Figure]] = field(repr=False)
    description: str = ""


#: Every registered workload, in registration order.
WORKLOADS: dict[str, Workload] = {}


def workload(name: str, chapter: int | str, description: str = ""):
    """Register ``fn(device: torch.device, *, quick: bool) -> list[Figure]`` as a workload.

    ``quick`` asks for a smaller, faster version (used by the tests); a full run is the one
    whose figures are committed.
    """

    def register(fn: Callable[..., list[Figure]]) -> Callable[..., list[Figure]]:
        if name in WORKLOADS:
            raise ValueError(f"workload {name!r} is registered twice")
        WORKLOADS[name] = Workload(name, chapter, fn, description or (fn.__doc__ or "").strip())
        return fn

    return register


def _cpu_name() -> str:
    if platform.system() == "Darwin":  # no /proc there; sysctl names the Apple chip
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=10, check=True)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_driver_version() -> str | None:
    """The NVIDIA driver version through NVML, for machines without ``nvidia-smi`` on PATH."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        buffer = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(96)) != 0:
            return None
        return buffer.value.decode() or None
    except (AttributeError, OSError):
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except (AttributeError, OSError):
            pass


def _driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, else from NVML; None without a GPU."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return _nvml_driver_version()


def _accelerator() -> tuple[str | None, list[dict[str, Any]]]:
    """The accelerator kind (``cuda``, ``rocm``, ``xpu``, ``mps``) and one record per device."""
    if torch.cuda.is_available():  # ROCm builds answer through torch.cuda too
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({
                "index": i,
                "name": p.name,
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                "memory_gib": round(p.total_memory / 2**30, 1),
                "multiprocessors": p.multi_processor_count,
            })
        return ("rocm" if getattr(torch.version, "hip", None) else "cuda"), gpus
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        gpus = []
        for i in range(xpu.device_count()):
            p = xpu.get_device_properties(i)
            gpus.append({"index": i, "name": p.name,
                         "memory_gib": round(p.total_memory / 2**30, 1)})
        return "xpu", gpus
    if torch.backends.mps.is_available():  # one Apple GPU, sharing the CPU's memory
        return "mps", [{"index": 0, "name": f"{_cpu_name()} GPU (MPS)"}]
    return None, []


def _legacy_flag(read: Any) -> bool | None:
    """A legacy ``allow_tf32`` flag, or None where torch cannot answer it: torch >= 2.9 raises
    when the new per-operation settings disagree (cuDNN conv and RNN set differently)."""
    try:
        return bool(read())
    except RuntimeError:
        return None


def precision_flags() -> dict[str, Any]:
    """The TF32 and cuDNN settings in force, which change what a matmul or convolution measures."""
    with warnings.catch_warnings():  # some torch versions deprecate reading the old flags
        warnings.simplefilter("ignore")
        flags: dict[str, Any] = {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": _legacy_flag(lambda: torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": _legacy_flag(lambda: torch.backends.cudnn.allow_tf32),
            "cudnn_enabled": bool(torch.backends.cudnn.enabled),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        }
        # torch >= 2.9's per-operation settings: cudnn.fp32_precision is the CUDA-wide
        # default ("cuda", "all"); convolutions and RNNs read cudnn.conv and cudnn.rnn.
        cudnn = torch.backends.cudnn
        for name, owner in (("cuda_matmul_fp32_precision", torch.backends.cuda.matmul),
                            ("cuda_fp32_precision", cudnn),
                            ("cudnn_conv_fp32_precision", getattr(cudnn, "conv", None)),
                            ("cudnn_rnn_fp32_precision", getattr(cudnn, "rnn", None))):
            value = getattr(owner, "fp32_precision", None)
            if isinstance(value, str):
                flags[name] = value
    return flags


def book_root() -> Path | None:
    """The book's checkout this benchmark runs from, or None for a copy outside one."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "chapters").is_dir():
        return root
    return None


def book_commit() -> str:
    """The book's git commit: ``$BOOK_COMMIT``, else ``git rev-parse HEAD`` in the checkout,
    else ``"unknown"`` (an installed package, or a copy without its ``.git``)."""
    if os.environ.get("BOOK_COMMIT", "").strip():
        return os.environ["BOOK_COMMIT"].strip()
    root = book_root()
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine_info() -> dict[str, Any]:
    """What produced a result file: devices, versions, driver, flags, the book's commit
    (appendix). ``gpu_count`` counts the accelerators of any kind (CUDA, ROCm, XPU, MPS)."""
    kind, gpus = _accelerator()
    info = {
        "device_name": gpus[0]["name"] if gpus else _cpu_name(),
        "gpu_count": len(gpus),
        "gpus": gpus,
        "accelerator": kind,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "driver": _driver_version() if kind == "cuda" else None,
        "cuda": torch.version.cuda if kind == "cuda" else None,
        "cudnn": torch.backends.cudnn.version() if kind in ("cuda", "rocm") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "book_commit": book_commit(),
        "flags": precision_flags(),
    }
    if kind == "rocm":  # ROCm builds report HIP instead of CUDA, and no NVIDIA driver
        info["hip"] = torch.version.hip
    return info


def machine_slug(info: dict[str, Any] | None = None) -> str:
    """File-name stem for a machine: ``gpu-nvidia-h100-80gb-hbm3-x1`` or ``cpu-<model>-2c``."""
    info = info or machine_info()
    if info["gpu_count"]:
        stem = f"gpu-{info['device_name']}-x{info['gpu_count']}"
    else:
        stem = f"cpu-{info['cpu']}-{info['cpu_count']}c"
    stem = re.sub(r"\((r|tm)\)|cpu @.*?(?=-\d+c$)", "", stem, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
