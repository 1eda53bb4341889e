"""Choosing, describing and checking devices.

Introduced in chapter 1 (Devices); the same-device check is taught in chapter 2 (Moving
tensors and modules) and used again in chapter 8 (Device pitfalls).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = [
    "DEVICE_ENV_VAR",
    "DeviceMismatchError",
    "available_devices",
    "best_device",
    "check_same_device",
    "describe_devices",
    "device_of",
    "gpu_count",
    "has_gpu",
    "module_device",
    "resolve_device",
]

#: Environment variable that overrides :func:`best_device` (for example ``cpu`` or ``cuda:1``).
DEVICE_ENV_VAR = "BOOK_DEVICE"

# Preference order of accelerator types; the CPU is the fallback.
_ACCELERATOR_ORDER = ("cuda", "mps", "xpu")


class DeviceMismatchError(RuntimeError):
    """Raised by :func:`check_same_device` when objects live on different devices (chapter 2)."""


def _type_available(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return kind == "cpu"


def _type_count(kind: str) -> int:
    if not _type_available(kind):
        return 0
    if kind == "cuda":
        return torch.cuda.device_count()
    if kind == "xpu":
        return torch.xpu.device_count()
    return 1


def available_devices() -> list[str]:
    """Every device this machine can run on, best first: ``['cuda:0', 'cuda:1', 'cpu']`` (chapter 1).

    The ``meta`` device (shapes without data, present everywhere) is not listed: it runs no
    computation, though :func:`resolve_device` accepts it for the device-pitfall chapters.
    """
    names: list[str] = []
    for kind in _ACCELERATOR_ORDER:
        count = _type_count(kind)
        if kind == "mps":
            names += ["mps"] * min(count, 1)
        else:
            names += [f"{kind}:{i}" for i in range(count)]
    names.append("cpu")
    return names


def gpu_count() -> int:
    """Number of accelerators of the best available type (0 on a CPU-only machine) (chapter 1)."""
    for kind in _ACCELERATOR_ORDER:
        count = _type_count(kind)
        if count:
            return count
    return 0


def has_gpu() -> bool:
    """True when any accelerator (CUDA, MPS or XPU) is usable (chapter 1)."""
    return gpu_count() > 0


def resolve_device(spec: str | torch.device | int) -> torch.device:
    """Turn ``spec`` into a :class:`torch.device` that exists on this machine (chapter 1).

    Accepts ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"xpu:0"``, ``"meta"``, an
    integer GPU index or a ``torch.device``. Anything this machine does not have raises a
    ``ValueError`` that lists the devices it does have.
    """
    if isinstance(spec, int):
        spec = f"cuda:{spec}"
    text = str(spec).strip()
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(
            f"{text!r} is not a device name PyTorch understands ({exc}). "
            f"Devices on this machine: {', '.join(available_devices())}."
        ) from None
    if device.type == "meta":
        return device
    if device.type not in ("cpu", *_ACCELERATOR_ORDER):
        raise ValueError(
            f"device type {device.type!r} is not supported by the book's helpers. "
            f"Devices on this machine: {', '.join(available_devices())}."
        )
    count = _type_count(device.type)
    if count == 0:
        raise ValueError(
            f"device {text!r} is not available on this machine. "
            f"Devices on this machine: {', '.join(available_devices())}."
        )
    if device.type in ("cuda", "xpu"):
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ValueError(
                f"device {text!r} does not exist: this machine has {count} {device.type} "
                f"device(s), numbered 0 to {count - 1}. "
                f"Devices on this machine: {', '.join(available_devices())}."
            )
        return torch.device(device.type, index)
    return torch.device(device.type)


def best_device(override: str | torch.device | int | None = None) -> torch.device:
    """The device a chapter should use: ``cuda`` > ``mps`` > ``xpu`` > ``cpu`` (chapter 1).

    ``override`` (or else the ``BOOK_DEVICE`` environment variable) forces a device; it is
    checked by :func:`resolve_device`, so a device that does not exist raises a clear error.
    """
    if override is None:
        override = os.environ.get(DEVICE_ENV_VAR) or None
    if override is not None:
        return resolve_device(override)
    return torch.device(available_devices()[0])


def device_of(obj: Any) -> torch.device | None:
    """The device a tensor or module lives on, or ``None`` for anything else (chapter 2)."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, nn.Module):
        return module_device(obj)
    return None


def module_device(module: nn.Module) -> torch.device:
    """The single device holding all of ``module``'s parameters and buffers (chapter 2).

    Raises ``ValueError`` for a module without tensors and :class:`DeviceMismatchError`
    when its tensors are split across devices (naming which tensor lives where).
    """
    where: dict[torch.device, str] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        where.setdefault(tensor.device, name)
    if not where:
        raise ValueError(
            f"{type(module).__name__} has no parameters or buffers, so it has no device; "
            "look at the device of its inputs instead."
        )
    if len(where) > 1:
        detail = ", ".join(f"{name!r} on {dev}" for dev, name in where.items())
        raise DeviceMismatchError(
            f"{type(module).__name__} is split across devices: {detail}. "
            "Move the whole module with module.to(device)."
        )
    return next(iter(where))


def check_same_device(*objects: Any, **named: Any) -> torch.device:
    """Check that tensors and modules share one device, and return it (chapter 2).

    Pass objects by name (``check_same_device(model=net, x=x)``) for the clearest message;
    positional objects are called ``arg0``, ``arg1``... Anything that is neither a tensor nor
    a module is ignored. Raises :class:`DeviceMismatchError` listing where each one lives.
    """
    items: list[tuple[str, Any]] = [(f"arg{i}", o) for i, o in enumerate(objects)]
    items += list(named.items())
    placed = [(name, device_of(obj)) for name, obj in items]
    placed = [(name, dev) for name, dev in placed if dev is not None]
    if not placed:
        raise ValueError("check_same_device needs at least one tensor or module.")
    devices = {dev for _, dev in placed}
    if len(devices) > 1:
        detail = ", ".join(f"{name} is on {dev}" for name, dev in placed)
        raise DeviceMismatchError(
            f"expected one device but found {len(devices)}: {detail}. "
            "Move them to the same device with .to(device) (and assign the result for tensors)."
        )
    return placed[0][1]


def _gpu_lines() -> Iterable[str]:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            major, minor = torch.cuda.get_device_capability(i)
            free, total = torch.cuda.mem_get_info(i)
            yield (
                f"  cuda:{i}  {p.name}, compute capability {major}.{minor}, "
                f"{p.multi_processor_count} SMs, {total / 2**30:.1f} GiB "
                f"({free / 2**30:.1f} GiB free)"
            )
    if _type_available("mps"):
        yield "  mps     Apple GPU (Metal Performance Shaders)"
    if _type_available("xpu"):
        for i in range(torch.xpu.device_count()):
            yield f"  xpu:{i}  {torch.xpu.get_device_name(i)}"


def describe_devices() -> str:
    """A readable, multi-line description of this machine's devices and versions (chapter 1)."""
    cuda = torch.version.cuda or "none (this torch build has no CUDA)"
    lines = [
        f"torch {torch.__version__} (CUDA runtime {cuda}), Python {platform.python_version()}",
        f"  cpu     {platform.machine()} processor, {os.cpu_count()} logical cores, "
        f"{torch.get_num_threads()} torch threads",
    ]
    gpus = list(_gpu_lines())
    lines += gpus or ["  no GPU: CUDA, MPS and XPU are all unavailable on this machine"]
    return "\n".join(lines)
