"""The building blocks of the book's benchmark: figures, workloads and the machine record.

Introduced in the appendix (Measured results). Each chapter that measures something adds a
workload module beside this one (``matmul``, ``regression``, ``mnist``, ``recipes``); the
runner in ``__main__`` runs them all and writes ``results/<machine>.json``.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["WORKLOADS", "Figure", "Workload", "machine_info", "machine_slug", "workload"]


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
    if not torch.cuda.is_available():
        return None
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return _nvml_driver_version()


def machine_info() -> dict[str, Any]:
    """What produced a result file: devices, versions, driver (appendix)."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({
                "index": i,
                "name": p.name,
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                "memory_gib": round(p.total_memory / 2**30, 1),
                "multiprocessors": p.multi_processor_count,
            })
    info = {
        "device_name": gpus[0]["name"] if gpus else _cpu_name(),
        "gpu_count": len(gpus),
        "gpus": gpus,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "driver": _driver_version(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if getattr(torch.version, "hip", None):  # ROCm builds report HIP instead of CUDA
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
