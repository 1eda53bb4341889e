"""Reading the committed benchmark result files in ``results/``.

Introduced in chapter 3 (Matrix multiply), where a reader without a GPU sees the figures a
real GPU produced, labelled with the hardware and versions; the appendix (Measured results)
renders every file. The files are written by ``python -m helpers.bench``, never by hand.

The result files travel with the package (``helpers/_results``), so an installed copy (Colab)
shows the same figures as a checkout of the book.

A result file is JSON (schema version 2; version 1 files are read too)::

    {"schema_version": 2, "date": "...", "command": "...",
     "machine": {"slug": ..., "device_name": ..., "gpu_count": ..., "accelerator": ...,
                 "driver": ..., "cuda": ..., "torch": ..., "book_commit": ..., "flags": ...},
     "figures": [{"workload": ..., "chapter": ..., "name": ..., "value": ..., "unit": ...,
                  "device": ..., "spread": ..., "note": ...}, ...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["RESULTS_ENV_VAR", "SCHEMA_VERSION", "committed", "load_results", "machine_stamp",
           "results_dir", "show_committed"]

RESULTS_ENV_VAR = "BOOK_RESULTS_DIR"
SCHEMA_VERSION = 2
_READABLE = (1, 2)
_PACKAGED = Path(__file__).resolve().parent / "_results"


def results_dir() -> Path:
    """``$BOOK_RESULTS_DIR``, else the checkout's ``results/`` folder, else the copy of the
    result files installed with the package (appendix)."""
    env = os.environ.get(RESULTS_ENV_VAR)
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "results").is_dir():
        return root / "results"
    return _PACKAGED


def _migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill in what a version 1 file did not record, so readers see one shape."""
    m = doc["machine"]
    if isinstance(m, dict) and doc["schema_version"] == 1:
        kind = None
        if m.get("gpu_count"):
            kind = "rocm" if m.get("hip") else "cuda"
        m.setdefault("accelerator", kind)
        m.setdefault("book_commit", "unknown")
        m.setdefault("flags", {})
    return doc


def load_results(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """Every result file in ``directory``, parsed, sorted by machine slug (appendix).

    A file that is not valid JSON, lacks the top-level keys or has a schema version this
    package cannot read raises ``ValueError`` naming it.
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
        if doc["schema_version"] not in _READABLE:
            raise ValueError(f"result file {path} has schema version {doc['schema_version']!r}; "
                             f"this copy of the helpers reads {_READABLE}: update the helpers")
        doc["_path"] = str(path)
        out.append(_migrate(doc))
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


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def machine_stamp(doc: dict[str, Any], label: str | None = None) -> str:
    """One line naming the hardware and versions behind a result file (chapter 3)."""
    from helpers.bench.report import machine_label

    m = doc["machine"]
    parts = [label or machine_label(doc)]
    if m.get("driver"):
        parts.append(f"driver {m['driver']}")
    if m.get("cuda"):
        parts.append(f"CUDA {m['cuda']}")
    if m.get("hip"):
        parts.append(f"ROCm/HIP {m['hip']}")
    parts.append(f"torch {m['torch']}")
    parts.append(f"measured {doc['date'][:10]}")
    commit = m.get("book_commit") or "unknown"
    parts.append(f"book commit {commit[:10]}")
    return ", ".join(parts)


def show_committed(workload: str, *, gpu_only: bool = True,
                   directory: str | Path | None = None) -> pd.DataFrame:
    """Show which machines measured ``workload`` and their figures, and return the table
    (chapter 3): figures as rows, one column per result file (per machine, never merged by
    device name), headed with the device and its GPU count.

    It displays itself (inside a notebook as one ``display`` output marked with
    ``DISPLAY_KEY`` in its metadata, elsewhere with ``print``), so it works inside
    ``if``/``else``; call it as a statement or assign the
    result, never as a cell's last bare expression (that would show the table twice).

    With ``gpu_only`` (the default) only GPU machines, and only the figures they measured on
    the GPU, are kept: a column headed with a GPU's name holds GPU figures only. Says so
    plainly when no such results have been committed yet.
    """
    from helpers.bench.report import machine_labels

    docs = load_results(directory)
    if gpu_only:
        docs = [d for d in docs if d["machine"].get("gpu_count")]
    labels = dict(zip((d["_path"] for d in docs), machine_labels(docs), strict=True))
    rows, shown = [], []
    for doc in docs:
        figs = [f for f in doc["figures"] if f.get("workload") == workload
                and not (gpu_only and str(f.get("device")) == "cpu")]
        if figs:
            shown.append(doc)
        for f in figs:
            rows.append({"machine": labels[doc["_path"]],
                         "figure": f"{f['name']} [{f['unit']}] on {f['device']}",
                         "value": f["value"]})
    kind = "GPU " if gpu_only else ""
    if not rows:
        _show(workload, [f"No committed {kind}results for the {workload!r} workload yet: they "
                         "appear here once `python -m helpers.bench` has run on such a machine "
                         "and its result file is committed under results/."])
        return pd.DataFrame()
    long = pd.DataFrame(rows)
    # Every (figure, machine) pair is unique in a valid result file; "first" never averages.
    table = long.pivot_table(index="figure", columns="machine", values="value",
                             aggfunc="first", sort=False)
    table = table.reindex(columns=[labels[d["_path"]] for d in shown])
    table.columns.name = "machine"
    _show(workload, [f"Committed {kind}figures for {workload!r} (results/, one column per "
                     "machine):", *(f"  {machine_stamp(d, labels[d['_path']])}" for d in shown)],
          table)
    return table


#: The output metadata key that marks a committed-figures table in an executed notebook: the
#: book shows these from its own build, so a recorded GPU page lists every committed machine.
DISPLAY_KEY = "book_committed_figures"


def _show(workload: str, lines: list[str], table: pd.DataFrame | None = None) -> None:
    """Lines of text and a table: one marked display output inside a notebook, else print."""
    text = "\n".join(lines) + ("\n" + table.to_string() if table is not None else "")
    if not _in_kernel():
        print(text)
        return
    import html

    from IPython.display import display

    markup = "".join(f"<p>{html.escape(line.strip())}</p>" if i == 0 else
                     f"<li>{html.escape(line.strip())}</li>" for i, line in enumerate(lines))
    if len(lines) > 1:
        first, rest = markup.split("</p>", 1)
        markup = f"{first}</p><ul>{rest}</ul>"
    if table is not None:
        markup += table.to_html()
    display({"text/plain": text, "text/html": markup}, raw=True,
            metadata={DISPLAY_KEY: workload})
