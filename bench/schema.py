"""What a result file in ``results/`` must contain (appendix: Measured results).

``python -m bench`` checks every document with :func:`validate` before it writes it,
and the book's tests check every committed file the same way. The format is described in
:mod:`helpers.results`; this module is its executable definition. It imports neither torch nor
pandas, so it is quick to use anywhere.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["READABLE_VERSIONS", "SCHEMA_VERSION", "SchemaError", "check", "validate", "validate_file",
           "validate_machine"]

from helpers.results import (  # the one definition
    READABLE_VERSIONS,
    RENAMED_FIGURES,
    SCHEMA_VERSION,
)

#: Keys every figure carries, and the machine keys every file names.
FIGURE_KEYS = ("workload", "chapter", "name", "value", "unit", "device", "spread", "note")
MACHINE_KEYS = ("slug", "device_name", "gpu_count", "gpus", "cpu", "cpu_count", "driver",
                "cuda", "torch", "python", "platform")
#: Machine keys that version 2 added.
MACHINE_KEYS_V2 = ("accelerator", "book_commit", "flags")
ACCELERATORS = ("cuda", "rocm", "xpu", "mps")

_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_DEVICE = re.compile(r"^[a-z]+(:\d+)?$")


class SchemaError(ValueError):
    """A result document does not match the schema; the message lists every problem."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _check_date(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"date must be an ISO-8601 string, got {value!r}"
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return f"date {value!r} is not ISO-8601"
    if when.utcoffset() != timedelta(0):
        return f"date {value!r} must be in UTC (ending in +00:00)"
    return None


def validate_machine(machine: Any, version: int = SCHEMA_VERSION) -> list[str]:
    """Every way ``machine`` (a result file's ``machine`` record) breaks the schema."""
    if not isinstance(machine, dict):
        return [f"machine must be an object, got {type(machine).__name__}"]
    keys = MACHINE_KEYS + (MACHINE_KEYS_V2 if version >= 2 else ())
    problems = [f"machine lacks {key!r}" for key in keys if key not in machine]
    if problems:
        return problems
    if not (isinstance(machine["slug"], str) and _SLUG.match(machine["slug"])):
        problems.append(f"machine.slug {machine['slug']!r} is not lower-case words joined by '-'")
    for key in ("device_name", "cpu", "torch", "python", "platform"):
        if not _nonempty_str(machine[key]):
            problems.append(f"machine.{key} must be a non-empty string, got {machine[key]!r}")
    count = machine["gpu_count"]
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        problems.append(f"machine.gpu_count must be an integer >= 0, got {count!r}")
        return problems
    if not (isinstance(machine["cpu_count"], int) and machine["cpu_count"] > 0):
        problems.append(f"machine.cpu_count must be a positive integer, got {machine['cpu_count']!r}")
    gpus = machine["gpus"]
    if not isinstance(gpus, list) or len(gpus) != count:
        problems.append(f"machine.gpus must list the {count} GPU(s) that gpu_count counts")
    else:
        for i, gpu in enumerate(gpus):
            if not (isinstance(gpu, dict) and _nonempty_str(gpu.get("name"))):
                problems.append(f"machine.gpus[{i}] must be an object with a name")
    # Version 1 knew CUDA and ROCm only; a ROCm run names HIP and has no NVIDIA driver.
    kind = machine.get("accelerator") if version >= 2 else \
        (None if not count else "rocm" if _nonempty_str(machine.get("hip")) else "cuda")
    if version >= 2:
        if kind is not None and kind not in ACCELERATORS:
            problems.append(f"machine.accelerator must be one of {ACCELERATORS} or null, "
                            f"got {kind!r}")
        if (kind is None) != (count == 0):
            problems.append("machine.accelerator must be null exactly when gpu_count is 0")
        if not _nonempty_str(machine["book_commit"]):
            problems.append("machine.book_commit must name the book's commit (or 'unknown')")
        if not isinstance(machine["flags"], dict):
            problems.append("machine.flags must be an object (the precision flags in force)")
    if kind == "cuda":
        if not _nonempty_str(machine["cuda"]):
            problems.append("a CUDA machine must name its CUDA version")
        if not _nonempty_str(machine["driver"]):
            problems.append("a CUDA machine must name its driver version (machine.driver)")
    elif kind == "rocm" and not _nonempty_str(machine.get("hip")):
        problems.append("a ROCm machine must name its HIP version (machine.hip)")
    if count:
        if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) \
                and machine["device_name"] != gpus[0].get("name"):
            problems.append("machine.device_name must be the name of the first GPU")
    return problems


def _check_figure(i: int, fig: Any) -> list[str]:
    where = f"figures[{i}]"
    if not isinstance(fig, dict):
        return [f"{where} must be an object"]
    problems = [f"{where} lacks {key!r}" for key in FIGURE_KEYS if key not in fig]
    if problems:
        return problems
    where = f"{where} ({fig['workload']!r}, {fig['name']!r})"
    for key in ("workload", "name", "unit"):
        if not _nonempty_str(fig[key]):
            problems.append(f"{where}: {key} must be a non-empty string")
    chapter = fig["chapter"]
    if not ((isinstance(chapter, int) and not isinstance(chapter, bool)) or _nonempty_str(chapter)):
        problems.append(f"{where}: chapter must be a chapter number or name, got {chapter!r}")
    if not _is_number(fig["value"]):
        problems.append(f"{where}: value must be a finite number, got {fig['value']!r}")
    if fig["spread"] is not None and not (_is_number(fig["spread"]) and fig["spread"] >= 0):
        problems.append(f"{where}: spread must be null or a finite number >= 0, "
                        f"got {fig['spread']!r}")
    if not (isinstance(fig["device"], str) and _DEVICE.match(fig["device"])):
        problems.append(f"{where}: device must look like 'cpu' or 'cuda:0', got {fig['device']!r}")
    if not isinstance(fig["note"], str):
        problems.append(f"{where}: note must be a string")
    if "conditions" in fig:  # optional: what a rate was measured under (matmul bursts)
        problems += [f"{where}: {p}" for p in _check_conditions(fig["conditions"])]
    return problems


#: The readings a figure's ``conditions`` carry: each a number >= 0, or null with a reason.
TELEMETRY_KEYS = ("sm_clock_mhz", "power_w", "temperature_c")


def _check_conditions(cond: Any) -> list[str]:
    """A figure's optional ``conditions``: its shape, product count and the GPU telemetry."""
    if not isinstance(cond, dict):
        return [f"conditions must be an object, got {type(cond).__name__}"]
    problems = []
    shape = cond.get("shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)):
        problems.append(f"conditions.shape must be [m, n, k], positive integers, got {shape!r}")
    missing = [key for key in TELEMETRY_KEYS if key not in cond]
    if missing:
        return problems + [f"conditions lacks {missing} (null where not read)"]
    for key in TELEMETRY_KEYS:
        if cond[key] is not None and not (_is_number(cond[key]) and cond[key] >= 0):
            problems.append(f"conditions.{key} must be null or a number >= 0, got "
                            f"{cond[key]!r}")
    if any(cond[key] is None for key in TELEMETRY_KEYS) and not _nonempty_str(
            cond.get("missing")):
        problems.append("conditions must say why a reading is null (conditions.missing)")
    return problems


def validate(doc: Any) -> list[str]:
    """Every way ``doc`` (a parsed result file) breaks the schema; an empty list if none.

    Keys starting with ``_`` (``load_results`` adds ``_path``) are ignored, and so are extra
    keys, so later versions of the runner may record more.
    """
    if not isinstance(doc, dict):
        return [f"a result document must be a JSON object, got {type(doc).__name__}"]
    problems = [f"lacks the top-level key {key!r}"
                for key in ("schema_version", "date", "command", "machine", "figures")
                if key not in doc]
    if problems:
        return problems
    version = doc["schema_version"]
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        problems.append(f"schema_version must be one of {READABLE_VERSIONS}, got {version!r}")
        version = SCHEMA_VERSION
    if (date_problem := _check_date(doc["date"])) is not None:
        problems.append(date_problem)
    if not _nonempty_str(doc["command"]):
        problems.append("command must be the command line that wrote the file")
    if "quick" in doc and not isinstance(doc["quick"], bool):
        problems.append(f"quick must be true or false, got {doc['quick']!r}")
    if "duration_s" in doc and not (_is_number(doc["duration_s"]) and doc["duration_s"] >= 0):
        problems.append(f"duration_s must be a number >= 0, got {doc['duration_s']!r}")
    if "missing_workloads" in doc and not (
            isinstance(doc["missing_workloads"], list) and doc["missing_workloads"]
            and all(_nonempty_str(w) for w in doc["missing_workloads"])):
        problems.append("missing_workloads, where present, must be a non-empty list of "
                        f"workload names, got {doc['missing_workloads']!r}")
    problems += validate_machine(doc["machine"], version)
    figures = doc["figures"]
    if not isinstance(figures, list) or not figures:
        problems.append("figures must be a non-empty list")
        return problems
    seen: set[tuple] = set()
    for i, fig in enumerate(figures):
        fig_problems = _check_figure(i, fig)
        problems += fig_problems
        if fig_problems:
            continue
        key = (fig["workload"], fig["name"], fig["device"])
        if version >= 3 and fig["name"] in RENAMED_FIGURES:
            problems.append(f"figures[{i}]: {fig['name']!r} is named "
                            f"{RENAMED_FIGURES[fig['name']]!r} since schema version 3")
        if key in seen:
            problems.append(f"figures[{i}]: workload {key[0]!r} reports {key[1]!r} on "
                            f"{key[2]!r} twice")
        seen.add(key)
    return problems


def check(doc: Any) -> None:
    """Raise :class:`SchemaError` listing every problem of ``doc``, if it has any."""
    problems = validate(doc)
    if problems:
        raise SchemaError("the result document does not match the schema:\n  - "
                          + "\n  - ".join(problems))


def validate_file(path: str | Path) -> list[str]:
    """:func:`validate` for a file on disk, plus: it is JSON, and its name is ``<slug>.json``."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path.name}: cannot be read as JSON: {exc}"]
    problems = validate(doc)
    machine = doc.get("machine") if isinstance(doc, dict) else None
    if isinstance(machine, dict) and path.stem != machine.get("slug"):
        problems.append(f"the file is named {path.name!r} but its machine slug is "
                        f"{machine.get('slug')!r}")
    return [f"{path.name}: {p}" for p in problems]
