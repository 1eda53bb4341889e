"""Reading the committed benchmark result files in ``results/``.

Introduced in chapter 3 (Matrix multiply), where a reader without a GPU sees the figures a
real GPU produced, labelled with the hardware and versions; the appendix (Measured results)
renders every file. The files are written by ``python -m helpers.bench``, never by hand.

A result file is JSON::

    {"schema_version": 1, "date": "...", "command": "...",
     "machine": {"slug": ..., "device_name": ..., "gpu_count": ..., "driver": ..., "cuda": ...,
                 "torch": ..., ...},
     "figures": [{"workload": ..., "chapter": ..., "name": ..., "value": ..., "unit": ...,
                  "device": ..., "spread": ..., "note": ...}, ...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["RESULTS_ENV_VAR", "SCHEMA_VERSION", "committed", "load_results", "results_dir",
           "show_committed"]

RESULTS_ENV_VAR = "BOOK_RESULTS_DIR"
SCHEMA_VERSION = 1


def results_dir() -> Path:
    """``$BOOK_RESULTS_DIR``, else the book's ``results/`` folder (appendix)."""
    env = os.environ.get(RESULTS_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[1] / "results"


def load_results(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """Every result file in ``directory``, parsed, sorted by machine slug (appendix).

    A file that is not valid JSON or lacks the top-level keys raises ``ValueError`` naming it.
    """
    folder = Path(directory) if directory is not None else results_dir()
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"result file {path} is not valid JSON: {exc}") from None
        missing = {"schema_version", "machine", "date", "figures"} - set(doc)
        if missing:
            raise ValueError(f"result file {path} lacks {sorted(missing)}")
        doc["_path"] = str(path)
        out.append(doc)
    return out


def committed(workload: str | None = None, *, gpu_only: bool = False,
              directory: str | Path | None = None) -> pd.DataFrame:
    """All committed figures as one table, one row per figure and machine (chapter 3).

    Columns: machine, device_name, gpu_count, torch, cuda, driver, date, workload, chapter,
    name, value, unit, spread, device, note.
    """
    rows = []
    for doc in load_results(directory):
        m = doc["machine"]
        if gpu_only and not m.get("gpu_count"):
            continue
        for fig in doc["figures"]:
            if workload is not None and fig.get("workload") != workload:
                continue
            rows.append({"machine": m.get("slug"), "device_name": m.get("device_name"),
                         "gpu_count": m.get("gpu_count"), "torch": m.get("torch"),
                         "cuda": m.get("cuda"), "driver": m.get("driver"),
                         "date": doc["date"], **fig})
    columns = ["machine", "device_name", "gpu_count", "torch", "cuda", "driver", "date",
               "workload", "chapter", "name", "value", "unit", "spread", "device", "note"]
    return pd.DataFrame(rows, columns=columns)


def show_committed(workload: str, *, gpu_only: bool = True,
                   directory: str | Path | None = None) -> pd.DataFrame:
    """Print which machines measured ``workload`` and return their figures as a wide table
    (figures as rows, one column per machine) (chapter 3).

    With ``gpu_only`` (the default) only figures measured on a GPU are kept: a GPU machine's
    CPU baselines are left out, so a column headed with a GPU's name holds GPU figures only.
    Each row is labelled with its unit and the device that measured it. Says so plainly when no
    such results have been committed yet.
    """
    table = committed(workload, gpu_only=gpu_only, directory=directory)
    if gpu_only:
        table = table[table["device"].astype(str) != "cpu"]
    kind = "GPU " if gpu_only else ""
    if table.empty:
        print(f"No committed {kind}results for the {workload!r} workload yet: "
              "they appear here once `python -m helpers.bench` has run on such a machine "
              "and its result file is committed under results/.")
        return table
    for _machine, group in table.groupby("machine", sort=False):
        first = group.iloc[0]
        print(f"{first['device_name']} (x{first['gpu_count']}), torch {first['torch']}, "
              f"CUDA {first['cuda']}, driver {first['driver']}, measured {first['date'][:10]}")
    table = table.assign(
        figure=table["name"] + " [" + table["unit"] + "] on " + table["device"].astype(str))
    # Every (figure, machine) pair is unique in a valid result file; "first" never averages.
    return table.pivot_table(index="figure", columns="device_name", values="value",
                             aggfunc="first", sort=False)
