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

    Accelerators carry their index, as their tensors report it: a Mac lists ``'mps:0'``.
    The ``meta`` device (shapes without data, present everywhere) is not listed: it runs no
    computation, though :func:`resolve_device` accepts it for the device-pitfall chapters.
    """
    names: list[str] = []
    for kind in _ACCELERATOR_ORDER:
        names += [f"{kind}:{i}" for i in range(_type_count(kind))]
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


def _did_you_mean(text: str) -> str:
    # PyTorch has no "gpu" device type. Suggest this machine's accelerator type: "cuda" for
    # NVIDIA (and ROCm) GPUs, "mps" on a Mac, "xpu" for Intel GPUs; "cuda" where there is none.
    kind, sep, rest = text.lower().partition(":")
    if kind.startswith("gpu"):
        here = next((k for k in _ACCELERATOR_ORDER if _type_available(k)), "cuda")
        suggestion = "mps" if here == "mps" else here + sep + rest
        return f"there is no 'gpu' device type: did you mean {suggestion!r}?"
    return ""


def _current_index(kind: str) -> int:
    # PyTorch drives a single Apple GPU, always index 0 (ATen's MPSGuardImpl).
    return 0 if kind == "mps" else getattr(torch, kind).current_device()


def resolve_device(spec: str | torch.device | int) -> torch.device:
    """Turn ``spec`` into a :class:`torch.device` that exists on this machine (chapter 1).

    Accepts ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"xpu:0"``, ``"meta"``, an
    integer GPU index or a ``torch.device``. Accelerators come back with their index filled
    in (``"cuda"`` gives the current GPU, ``"mps"`` gives ``mps:0``), so the result equals
    the ``.device`` of the tensors created on it. Anything this machine does not have raises
    a ``ValueError`` that lists the devices it does have; a value that is no device name at
    all (``None``, ``3.5``) raises a ``TypeError``. ``"meta"`` (shapes without data) is
    accepted here for the device-pitfall demonstrations, but :func:`best_device` refuses it.
    """
    here = f"Devices on this machine: {', '.join(available_devices())}."
    if isinstance(spec, bool) or not isinstance(spec, str | torch.device | int):
        raise TypeError(
            f"a device must be a name such as 'cuda:0' or 'cpu', a torch.device or a GPU index, "
            f"not {spec!r} ({type(spec).__name__}). {here}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"GPU index {spec} is negative: GPUs are numbered from 0. {here}")
        spec = f"cuda:{spec}"
    text = str(spec).strip()
    if not text:
        raise ValueError(f"the device name is empty: pass one of the devices listed. {here}")
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        kind = text.partition(":")[0]
        reason = _did_you_mean(text) or (
            f"did you mean {text.lower()!r}? (device types are lower-case)"
            if kind != kind.lower() and kind.lower() in ("cpu", "meta", *_ACCELERATOR_ORDER)
            else str(exc))
        raise ValueError(f"{text!r} is not a device name PyTorch understands: {reason} {here}") from None
    if device.type == "meta":
        return torch.device("meta")  # meta tensors report "meta", without an index
    if device.type not in ("cpu", *_ACCELERATOR_ORDER):
        raise ValueError(f"device type {device.type!r} is not supported by the book's helpers. {here}")
    if device.type == "cpu":
        if device.index:
            raise ValueError(f"device {text!r} does not exist: there is one CPU device, 'cpu'. {here}")
        return torch.device("cpu")  # CPU tensors report "cpu", without an index
    count = _type_count(device.type)
    if count == 0:
        raise ValueError(f"device {text!r} is not available on this machine: pass one of the "
                         f"devices listed, or leave the device out to use the best one. {here}")
    # Without an index, "cuda" means the current GPU (cuda:0 unless set_device changed it).
    index = _current_index(device.type) if device.index is None else device.index
    if index >= count:
        only = " (PyTorch drives one Apple GPU, as mps:0)" if device.type == "mps" else ""
        raise ValueError(
            f"device {text!r} does not exist: this machine has {count} {device.type} "
            f"device(s), numbered 0 to {count - 1}{only}. {here}"
        )
    return torch.device(device.type, index)


def best_device(override: str | torch.device | int | None = None) -> torch.device:
    """The device a chapter should use: ``cuda`` > ``mps`` > ``xpu`` > ``cpu`` (chapter 1).

    ``override`` (or else the ``BOOK_DEVICE`` environment variable) forces a device; it is
    checked by :func:`resolve_device`, so a device that does not exist raises a clear error,
    which names ``$BOOK_DEVICE`` when the value came from there. The ``meta`` device is
    refused: it holds no data, so a chapter run on it would fail far from the cause.
    """
    source = ""
    if override is None:
        # An empty or blank BOOK_DEVICE counts as unset, as an empty shell variable does.
        override = os.environ.get(DEVICE_ENV_VAR, "").strip() or None
        source = f"${DEVICE_ENV_VAR}={override!r} (set in the environment): "
    if override is None:
        return torch.device(available_devices()[0])
    try:
        device = resolve_device(override)
    except (TypeError, ValueError) as exc:
        if not source:
            raise
        raise ValueError(f"{source}{exc} Fix or unset {DEVICE_ENV_VAR}.") from None
    if device.type == "meta":
        fix = f" Fix or unset {DEVICE_ENV_VAR}." if source else ""
        raise ValueError(
            f"{source}the meta device holds no data, so no chapter can compute on it; "
            f"choose one of: {', '.join(available_devices())}.{fix}"
        )
    return device


def device_of(obj: Any) -> torch.device | None:
    """The device a tensor or module lives on, or ``None`` for anything else (chapter 2).

    A module without parameters or buffers (``nn.ReLU()``) runs wherever its input is, so
    it has no device of its own and gives ``None`` too.
    """
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, nn.Module):
        if next(obj.parameters(), None) is None and next(obj.buffers(), None) is None:
            return None
        return module_device(obj)
    return None


def module_device(module: nn.Module) -> torch.device:
    """The single device holding all of ``module``'s parameters and buffers (chapter 2).

    Raises ``ValueError`` for a module without tensors and :class:`DeviceMismatchError`
    when its tensors are split across devices (naming which tensor lives where).
    """
    if not isinstance(module, nn.Module):
        hint = " For a tensor, read its .device." if isinstance(module, torch.Tensor) else ""
        raise TypeError(f"module_device needs an nn.Module, not {type(module).__name__}.{hint}")
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
    a module is ignored, and so is a module without parameters or buffers. Raises :class:`DeviceMismatchError` listing where each one lives.
    """
    items: list[tuple[str, Any]] = [(f"arg{i}", o) for i, o in enumerate(objects)]
    items += list(named.items())
    placed = [(name, device_of(obj)) for name, obj in items]
    placed = [(name, dev) for name, dev in placed if dev is not None]
    if not placed:
        raise ValueError(
            "check_same_device needs at least one tensor, or a module with parameters or buffers."
        )
    devices = {dev for _, dev in placed}
    if len(devices) > 1:
        detail = ", ".join(f"{name} is on {dev}" for name, dev in placed)
        raise DeviceMismatchError(
            f"expected one device but found {len(devices)}: {detail}. "
            "Move them to the same device with .to(device) (and assign the result for tensors)."
        )
    return placed[0][1]


def _gpu_lines(in_use: torch.device | None) -> Iterable[str]:
    if torch.cuda.is_available():
        # get_device_properties reads what the driver reports without creating a CUDA context
        # (torch's own start-up asks it of every GPU). mem_get_info would create one, about
        # 0.5 GB, on each GPU it asks, and fails on a GPU another process holds exclusively,
        # so only the GPU in use is asked how much of its memory is free.
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            line = (
                f"  cuda:{i}  {p.name}, compute capability {p.major}.{p.minor}, "
                f"{p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB"
            )
            if in_use is not None and in_use.type == "cuda" and resolve_device(in_use).index == i:
                free, _ = torch.cuda.mem_get_info(in_use)
                line += f" ({free / 2**30:.1f} GiB free)"
            yield line
    if _type_available("mps"):
        yield "  mps:0   Apple GPU (Metal Performance Shaders)"
    if _type_available("xpu"):
        for i in range(torch.xpu.device_count()):
            yield f"  xpu:{i}  {torch.xpu.get_device_name(i)}"


def describe_devices(device: str | torch.device | None = None) -> str:
    """A readable, multi-line description of this machine's devices and versions (chapter 1).

    Every GPU is listed with its name, compute capability, SM count and memory; only
    ``device``, the one in use, is also asked how much memory is free, so the other GPUs
    are described without being touched.
    """
    in_use = None if device is None else resolve_device(device)
    # A ROCm build of torch drives AMD GPUs through the same torch.cuda API and lists them as
    # cuda:i, but torch.version.cuda is None there: name the HIP runtime instead.
    hip = getattr(torch.version, "hip", None)
    if hip:
        runtime = f"ROCm HIP runtime {hip}"
    else:
        runtime = f"CUDA runtime {torch.version.cuda or 'none (this torch build has no CUDA)'}"
    lines = [
        f"torch {torch.__version__} ({runtime}), Python {platform.python_version()}",
        f"  cpu     {platform.machine()} processor, {os.cpu_count()} logical cores, "
        f"{torch.get_num_threads()} torch threads",
    ]
    gpus = list(_gpu_lines(in_use))
    lines += gpus or ["  no GPU: CUDA, MPS and XPU are all unavailable on this machine"]
    return "\n".join(lines)
