"""Saving and loading checkpoints across devices and wrappers.

Introduced in chapter 2 (Moving tensors and modules: ``map_location``, ``weights_only``) and
extended in chapter 7 (Data parallelism), where DataParallel, DDP and ``torch.compile`` add
``module.`` and ``_orig_mod.`` prefixes to parameter names.
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .devices import resolve_device

__all__ = ["WRAPPER_PREFIXES", "CheckpointError", "LoadedCheckpoint", "load_checkpoint",
           "save_checkpoint", "strip_prefixes", "unwrap"]

#: Prefixes that wrappers add to state-dict keys: DataParallel/DDP and torch.compile.
WRAPPER_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or a model that cannot be saved or loaded
    (chapter 2). The message names the file and says what to do."""


class LoadedCheckpoint(dict):
    """What :func:`load_checkpoint` returns: the saved dictionary, plus the keys that did not
    match (chapter 2). With ``strict=True`` both lists are always empty."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DataParallel, DistributedDataParallel and ``torch.compile``
    wrappers, however deeply nested (chapter 7)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"unwrap needs a model (an nn.Module), not {type(model).__name__}")
    while True:
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _overlap(keys: Iterable[str], reference: set[str]) -> int:
    return len(set(keys) & reference)


def strip_prefixes(
    state_dict: Mapping[str, Any],
    prefixes: tuple[str, ...] = WRAPPER_PREFIXES,
    *,
    reference_keys: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Remove the wrapper prefixes that *every* key carries, outermost first (chapter 7).

    A prefix is removed only when all keys start with it, so a model that merely has a
    submodule called ``module`` keeps its keys. With ``reference_keys`` (the keys of the model
    to load into) a prefix is removed only when that makes the keys match the model better:
    a model whose own keys all start with ``module.`` is left alone.
    """
    if not isinstance(state_dict, Mapping):
        hint = " (pass model.state_dict())" if isinstance(state_dict, nn.Module) else ""
        raise TypeError(f"strip_prefixes needs a state dict, not {type(state_dict).__name__}{hint}")
    if isinstance(prefixes, str) or not all(isinstance(p, str) for p in prefixes):
        raise TypeError(f"prefixes must be a tuple of strings such as ('module.',), not {prefixes!r}")
    if any(not p for p in prefixes):
        raise ValueError(f"prefixes {prefixes!r} include an empty string, which every key starts "
                         "with: list only real prefixes, such as 'module.'")
    if isinstance(reference_keys, str):
        raise TypeError(f"reference_keys must be the model's keys (model.state_dict().keys()), "
                        f"not the string {reference_keys!r}")
    odd = next((k for k in state_dict if not isinstance(k, str)), None)
    if odd is not None:
        raise TypeError(f"state dict keys are parameter names (strings); found {odd!r} "
                        f"({type(odd).__name__}). Is this really a state dict?")
    reference = set(reference_keys) if reference_keys is not None else None
    keys = list(state_dict)
    while keys:
        prefix = next((p for p in prefixes if all(k.startswith(p) for k in keys)), None)
        if prefix is None:
            break
        stripped = [k[len(prefix):] for k in keys]
        if reference is not None and _overlap(stripped, reference) <= _overlap(keys, reference):
            break
        keys = stripped
    return dict(zip(keys, state_dict.values(), strict=True))


def _check_model(model: Any, function: str) -> None:
    if isinstance(model, nn.Module):
        return
    hint = ""
    if isinstance(model, Mapping):
        hint = " It got a dictionary: pass the model itself, whose state dict it reads or fills."
    elif isinstance(model, str | os.PathLike):
        hint = " The model comes first, then the path: " + function + "(model, path)."
    raise TypeError(f"{function} needs the model (an nn.Module) as its first argument, not "
                    f"{type(model).__name__}.{hint}")


def _as_path(path: Any, function: str) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{function} needs the checkpoint's path as a str or Path, not {path!r} "
                        f"({type(path).__name__})")
    if not str(path).strip():
        raise ValueError(f"{function} got an empty path: name the checkpoint file, e.g. 'model.pt'")
    return Path(path).expanduser()


def _check_extra(extra: Mapping[str, Any], path: Path) -> None:
    for key, value in extra.items():
        # The same test load_checkpoint's weights_only=True load applies, on this value alone;
        # read back onto the CPU, so a GPU tensor among the extras is not copied on the GPU.
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickling or the weights-only unpickler refused it
            raise CheckpointError(
                f"cannot save {path}: the extra value {key}={value!r:.80} "
                f"({type(value).__name__}) could not be loaded back with weights_only=True "
                f"({type(exc).__name__}). Save tensors and plain values (numbers, strings, "
                "lists, dicts) instead, e.g. the object's state_dict().") from None


def _make_parent(path: Path) -> list[Path]:
    """Create the missing folders above ``path``; return those created (outermost first)."""
    missing: list[Path] = []
    folder = path.parent
    while not folder.exists():
        if folder.is_symlink():
            raise CheckpointError(f"cannot save {path}: {folder} is a broken link. Fix or "
                                  "remove the link, or choose another folder.")
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise CheckpointError(f"cannot save {path}: {folder} is a file, not a folder. Choose "
                              "another folder, or rename that file.")
    for new in reversed(missing):
        new.mkdir()
    return list(reversed(missing))


def _remove_folders(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break  # something else was written there meanwhile: keep it


def _meta_tensors(state: Mapping[str, Any]) -> list[str]:
    return [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.device.type == "meta"]


def save_checkpoint(model: nn.Module, path: str | Path, **extra: Any) -> Path:
    """Save the unwrapped model's ``state_dict`` (plus ``extra`` values) to ``path`` (chapter 2).

    Whatever wraps the model, the saved keys are those of the plain model, so the file loads
    into a plain model on any device. The file is written to a temporary name first and then
    renamed, so an interrupted save never leaves a half-written checkpoint behind; it gets the
    same permissions as ``torch.save`` would give it (the user's umask applies); folders it had
    to create are removed again if the save fails. ``extra`` values must load back with
    ``weights_only=True`` (tensors and plain values). A model on the ``meta`` device holds no
    data and is refused.
    """
    _check_model(model, "save_checkpoint")
    text = str(path)
    path = _as_path(path, "save_checkpoint")
    if text.endswith(("/", os.sep)) or path.is_dir():
        raise CheckpointError(f"cannot save to {text}: it names a folder. Name the file inside "
                              f"it, e.g. {path / 'model.pt'}")
    state = unwrap(model).state_dict()
    empty = _meta_tensors(state)
    if empty:
        raise CheckpointError(
            f"cannot save {path}: the model's {', '.join(empty[:3])}"
            f"{' ...' if len(empty) > 3 else ''} are on the meta device, which holds shapes but "
            "no data. Move the model to a real device with model.to_empty(device=...) and "
            "initialise or load its weights before saving.")
    _check_extra(extra, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(f"cannot save {path}: the file exists and is read-only. Make it "
                              "writable (chmod u+w) or choose another name.")
    created = _make_parent(path)
    payload = {"model": state, **extra}
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        # O_EXCL: never clobber another file; mode 0o666 lets the umask decide, as torch.save does.
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except PermissionError:
            raise PermissionError(f"cannot save {path}: the folder {path.parent} is not "
                                  "writable. Choose a folder you can write to.") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(payload, handle)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except BaseException:
        _remove_folders(created)
        raise
    return path


def _target_device(model: nn.Module) -> torch.device:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


def _read(path: Path, location: torch.device | str) -> Any:
    """torch.load with weights_only=True, turning PyTorch's raw errors into ones that name the
    file and say what is wrong with it."""
    if not os.access(path, os.R_OK):
        raise PermissionError(f"cannot read checkpoint {path}: permission denied. Make it "
                              "readable (chmod u+r) or copy it somewhere you can read it.")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): the save or the copy that "
                              "made it was interrupted. Save it again, or copy it again.")
    with path.open("rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK\x03\x04") and not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"checkpoint {path} is truncated ({size} bytes): it starts like a torch.save file but "
            "its end is missing, as after an interrupted save, copy or download. Save it again, "
            "or copy it again.")
    if not head.startswith(b"PK\x03\x04") and not head.startswith(b"\x80"):
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint: it is neither torch.save's zip format nor the "
            f"legacy pickle format (it starts with {head!r}). Check that you passed the right file.")
    try:
        return torch.load(path, map_location=location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next((line.strip() for line in str(exc).splitlines()
                       if "Unsupported global" in line), None)
        if reason is None:
            # Only the unpickler's own words: torch's text around them suggests turning
            # weights_only off, which is the wrong advice for a damaged file.
            detail = str(exc).split("WeightsUnpickler error:", 1)[-1]
            detail = detail.split("Check the documentation", 1)[0].strip() or type(exc).__name__
            raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint (the "
                                  f"unpickler stopped at: {detail:.200}). Save it again, or "
                                  "copy it again.") from None
        raise CheckpointError(
            f"checkpoint {path} contains a Python object that a weights-only load refuses, because "
            f"unpickling it could run code ({reason}). Save only tensors and plain values (a "
            "state_dict, numbers, strings); if you trust the file's origin, allow that one type "
            "with torch.serialization.add_safe_globals([...]).") from None
    except (RuntimeError, EOFError, KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated "
                              f"({type(exc).__name__}: {exc!s:.200})") from None


def _check_fits(state: Mapping[str, Any], own: Mapping[str, Any], path: Path, name: str,
                strict: bool) -> None:
    problems = []
    for key in own.keys() & state.keys():
        theirs, ours = state[key], own[key]
        if not isinstance(theirs, torch.Tensor):
            problems.append(f"{key} is a {type(theirs).__name__}, not a tensor")
        elif isinstance(ours, torch.Tensor) and theirs.shape != ours.shape:
            problems.append(f"{key} has shape {tuple(theirs.shape)} in the file and "
                            f"{tuple(ours.shape)} in the model")
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if strict and missing:
        problems.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if strict and unexpected:
        problems.append(f"unexpected {', '.join(unexpected[:4])}"
                        f"{' ...' if len(unexpected) > 4 else ''}")
    if problems:
        advice = ("Load it into the model it was saved from (same class and sizes)"
                  + ("; strict=False skips missing and unexpected keys, never a shape that "
                     "differs." if strict else "."))
        raise CheckpointError(f"checkpoint {path} does not fit this {name}: "
                              f"{'; '.join(problems[:6])}. The model was left unchanged. {advice}")


def load_checkpoint(
    model: nn.Module,
    path: str | Path,
    *,
    map_location: torch.device | str | None = None,
    strict: bool = True,
) -> LoadedCheckpoint:
    """Load a checkpoint into ``model`` and return the whole saved dictionary (chapter 2).

    Tensors are mapped to ``map_location``, by default the device ``model`` lives on, so a
    checkpoint written on a GPU loads on a CPU-only machine. Accepts files written by
    :func:`save_checkpoint` and bare state dicts, with or without the ``module.`` /
    ``_orig_mod.`` prefixes that wrappers add (removed only where they do not belong to the
    model itself). Loads with ``weights_only=True``: a checkpoint cannot run code. With
    ``strict=False`` the returned dictionary's ``missing_keys`` and ``unexpected_keys`` say
    what did not match. A model on the ``meta`` device is refused: it would discard every
    weight. A checkpoint that does not fit the model (another model, other sizes) is refused
    before any weight is copied, so a failed load leaves the model as it was.
    """
    _check_model(model, "load_checkpoint")
    path = _as_path(path, "load_checkpoint")
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, not {strict!r}")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file: pass the file's path")
    if not path.is_file():
        where = path.parent if path.parent.is_dir() else None
        hint = (f"the folder {where} exists, so check the file's name"
                if where else f"its folder {path.parent} does not exist either")
        raise FileNotFoundError(f"checkpoint {path} does not exist ({path.absolute()}): {hint}")
    if map_location is not None:
        if not isinstance(map_location, str | torch.device) or isinstance(map_location, bool):
            raise TypeError(f"map_location must be a device such as 'cpu' or 'cuda:0', not "
                            f"{map_location!r} ({type(map_location).__name__}); for a dict or a "
                            "function, call torch.load yourself.")
        try:
            map_location = resolve_device(map_location)
        except ValueError as exc:
            raise ValueError(f"map_location={str(map_location)!r}: {exc}") from None
    if map_location is not None and map_location.type == "meta":
        raise CheckpointError(f"map_location='meta' would load {path} without its "
                              "data: give the device of the model, or leave map_location out.")
    target = unwrap(model)
    if _meta_tensors(target.state_dict()):
        raise CheckpointError(
            f"cannot load {path} into a model on the meta device: it holds shapes but no data, "
            "so every weight would be silently discarded. Create the model on a real device, or "
            "call model.to_empty(device=...) first.")
    location = map_location if map_location is not None else _target_device(model)
    saved = _read(path, location)
    if not isinstance(saved, Mapping):
        raise CheckpointError(f"{path} holds a {type(saved).__name__}, not a checkpoint "
                              "dictionary: save a model's state dict, e.g. with save_checkpoint.")
    is_wrapped = "model" in saved and isinstance(saved["model"], Mapping)
    state = saved["model"] if is_wrapped else saved
    empty = _meta_tensors(state)
    if empty:
        raise CheckpointError(
            f"checkpoint {path} holds no data: {', '.join(empty[:3])}"
            f"{' ...' if len(empty) > 3 else ''} were saved from the meta device. Save it again "
            "from a model on a real device.")
    own = target.state_dict()
    state = strip_prefixes(state, reference_keys=own.keys())
    # Checked before anything is copied: load_state_dict copies every tensor that fits and
    # only then raises, which would leave the model half-loaded.
    _check_fits(state, own, path, type(target).__name__, strict)
    result = target.load_state_dict(state, strict=strict)
    out = LoadedCheckpoint(saved if is_wrapped else {"model": state})
    out.missing_keys = list(result.missing_keys)
    out.unexpected_keys = list(result.unexpected_keys)
    return out
