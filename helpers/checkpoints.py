"""Saving and loading checkpoints across devices and wrappers.

Introduced in chapter 2 (Moving tensors and modules: ``map_location``, ``weights_only``) and
extended in chapter 7 (Data parallelism), where DataParallel, DDP and ``torch.compile`` add
``module.`` and ``_orig_mod.`` prefixes to parameter names.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["WRAPPER_PREFIXES", "load_checkpoint", "save_checkpoint", "strip_prefixes", "unwrap"]

#: Prefixes that wrappers add to state-dict keys: DataParallel/DDP and torch.compile.
WRAPPER_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DataParallel, DistributedDataParallel and ``torch.compile``
    wrappers, however deeply nested (chapter 7)."""
    while True:
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def strip_prefixes(
    state_dict: Mapping[str, Any], prefixes: tuple[str, ...] = WRAPPER_PREFIXES
) -> dict[str, Any]:
    """Remove wrapper prefixes (repeatedly, in any order) from every key (chapter 7)."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        changed = True
        while changed:
            changed = False
            for prefix in prefixes:
                if key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        if key in out:
            raise ValueError(f"two keys become {key!r} once wrapper prefixes are removed")
        out[key] = value
    return out


def save_checkpoint(model: nn.Module, path: str | Path, **extra: Any) -> Path:
    """Save the unwrapped model's ``state_dict`` (plus ``extra`` values) to ``path`` (chapter 2).

    Whatever wraps the model, the saved keys are those of the plain model, so the file loads
    into a plain model on any device. The file is written to a temporary name first and then
    renamed, so an interrupted save never leaves a half-written checkpoint behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"model": unwrap(model).state_dict(), **extra}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _target_device(model: nn.Module) -> torch.device:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


def load_checkpoint(
    model: nn.Module,
    path: str | Path,
    *,
    map_location: torch.device | str | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` and return the whole saved dictionary (chapter 2).

    Tensors are mapped to ``map_location``, by default the device ``model`` lives on, so a
    checkpoint written on a GPU loads on a CPU-only machine. Accepts files written by
    :func:`save_checkpoint` and bare state dicts, with or without ``module.`` /
    ``_orig_mod.`` prefixes. Loads with ``weights_only=True``: a checkpoint cannot run code.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    location = map_location if map_location is not None else _target_device(model)
    saved = torch.load(path, map_location=location, weights_only=True)
    if not isinstance(saved, Mapping):
        raise ValueError(f"{path} holds a {type(saved).__name__}, not a checkpoint dictionary")
    is_wrapped = "model" in saved and isinstance(saved["model"], Mapping)
    state = saved["model"] if is_wrapped else saved
    unwrap(model).load_state_dict(strip_prefixes(state), strict=strict)
    return dict(saved) if is_wrapped else {"model": state}
