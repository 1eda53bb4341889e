"""Reading the committed benchmark result files in ``results/``.

Introduced in chapter 3 (Matrix multiply), where a reader without a GPU sees the figures a
real GPU produced, labelled with the hardware and versions; the appendix (Measured results)
renders every file with the tables and plots at the end of this module. The files are written
by the book's benchmark (``python -m bench``, in a clone of the book), never by hand.

The result files travel with the package (``helpers/_results``), so an installed copy (Colab)
shows the same figures as a checkout of the book.

A result file is JSON (schema :data:`SCHEMA_VERSION`; every older version is read too)::

    {"schema_version": SCHEMA_VERSION, "date": "...", "command": "...",
     "machine": {"slug": ..., "device_name": ..., "gpu_count": ..., "accelerator": ...,
                 "driver": ..., "cuda": ..., "torch": ..., "book_commit": ..., "flags": ...},
     "figures": [{"workload": ..., "chapter": ..., "name": ..., "value": ..., "unit": ...,
                  "device": ..., "spread": ..., "note": ...}, ...]}
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["READABLE_VERSIONS", "RESULTS_ENV_VAR", "SCHEMA_VERSION", "committed",
           "figures_table", "load_results", "machine_label", "machine_labels", "machine_stamp",
           "machines_table", "missing_figures", "peak_share_table", "plot_workload",
           "axis_label", "is_noisy", "plot_alt", "plot_panels", "show_figure",
           "results_dir", "show_committed", "show_folded", "software_versions", "speedup_table",
           "workload_figures", "workloads"]

RESULTS_ENV_VAR = "BOOK_RESULTS_DIR"
#: The version the benchmark writes (the one definition; ``bench/schema.py`` checks against it).
#: Version 1 files (before the machine record named its accelerator kind, the book's commit and
#: the precision flags) stay readable and valid.
#: Version 3 renamed the figures that named the tutorials' product and loader (below).
SCHEMA_VERSION = 3
READABLE_VERSIONS = tuple(range(1, SCHEMA_VERSION + 1))

#: Figure names before version 3 -> their names since.
RENAMED_FIGURES = {
    "cpu_seed_product_seconds": "cpu_tutorial_product_seconds",
    "cpu_seed_product_gflops": "cpu_tutorial_product_gflops",
    "seed_product_seconds": "tutorial_product_seconds",
    "seed_product_naive_seconds": "tutorial_product_naive_seconds",
    "seed_product_naive_factor": "tutorial_product_naive_factor",
    "seed_product_with_copy_seconds": "tutorial_product_with_copy_seconds",
    "seed_product_speedup_vs_cpu": "tutorial_product_speedup_vs_cpu",
    "cpu_seed_loader_images_per_s": "cpu_tutorial_loader_images_per_s",
    "cpu_resident_over_seed_loader": "cpu_resident_over_tutorial_loader",
    "seed_loader_images_per_s": "tutorial_loader_images_per_s",
    "resident_over_seed_loader": "resident_over_tutorial_loader",
}
_PACKAGED = Path(__file__).resolve().parent / "_results"


def results_dir() -> Path:
    """``$BOOK_RESULTS_DIR``, else the checkout's ``results/`` folder, else the copy of the
    result files installed with the package (appendix).

    An empty or blank ``$BOOK_RESULTS_DIR`` counts as unset; ``~`` is expanded.
    """
    env = os.environ.get(RESULTS_ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "results").is_dir():
        return root / "results"
    return _PACKAGED


def _folder(directory: str | os.PathLike[str] | None) -> Path | None:
    """The folder to read, or ``None`` where the package's own copy is missing (nothing
    committed); a folder the reader named that does not exist is an error naming it."""
    if directory is None:
        folder = results_dir()
        named = os.environ.get(RESULTS_ENV_VAR, "").strip()
        where = (f"${RESULTS_ENV_VAR}={named!r}" if named else None)
    elif isinstance(directory, (str, os.PathLike)):
        folder = Path(directory).expanduser()
        where = f"directory={str(directory)!r}"
    else:
        raise TypeError(f"directory must be a folder path (str or pathlib.Path), not "
                        f"{type(directory).__name__} {directory!r}: pass the folder that "
                        "holds the result files, or None for the book's results/")
    if folder.is_dir():
        return folder
    if where is None:  # the installed package carries no result file: nothing committed
        return None
    if folder.exists():
        raise NotADirectoryError(f"{where} is a file, not a folder: name the folder that "
                                 "holds the result files (results/ in a clone of the book)")
    raise FileNotFoundError(f"{where}: no such folder. Name the folder that holds the result "
                            f"files (results/ in a clone of the book), or unset "
                            f"{RESULTS_ENV_VAR} to read the book's own")


def _check_doc(doc: Any, path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` where ``doc`` is not shaped like a result file."""
    if not isinstance(doc, dict):
        raise ValueError(f"result file {path} holds a JSON {type(doc).__name__}, not an "
                         "object: it is not a result file (they are written by python -m "
                         "bench); move it out of the folder")
    missing = {"schema_version", "machine", "date", "figures"} - set(doc)
    if missing:
        raise ValueError(f"result file {path} lacks {sorted(missing)}: it is not a complete "
                         "result file; write it again with python -m bench")
    if doc["schema_version"] not in READABLE_VERSIONS:
        raise ValueError(f"result file {path} has schema version {doc['schema_version']!r}; "
                         f"this copy of the helpers reads {READABLE_VERSIONS}: update the "
                         "helpers")
    machine, figures = doc["machine"], doc["figures"]
    if not isinstance(machine, dict) or not {"slug", "device_name", "gpu_count"} <= set(machine):
        raise ValueError(f"result file {path}: 'machine' must be an object with slug, "
                         f"device_name and gpu_count, not {machine!r:.80}; write the file "
                         "again with python -m bench")
    if not isinstance(figures, list):
        raise ValueError(f"result file {path}: 'figures' must be a list, not "
                         f"{type(figures).__name__}; write the file again with python -m bench")
    keys = {"workload", "name", "value", "unit", "device"}
    for i, fig in enumerate(figures):
        if not isinstance(fig, dict) or not keys <= set(fig):
            raise ValueError(f"result file {path}: figure {i} must be an object with "
                             f"{sorted(keys)}, not {fig!r:.80}; write the file again with "
                             "python -m bench")
        if isinstance(fig["value"], bool) or not isinstance(fig["value"], (int, float)):
            raise ValueError(f"result file {path}: figure {i} ({fig['name']!r}) has value "
                             f"{fig['value']!r}, not a number; write the file again with "
                             "python -m bench")


def _migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill in what older files did not record, and today's figure names, so readers see one
    shape."""
    m = doc["machine"]
    if doc["schema_version"] < 3:
        for fig in doc["figures"]:
            if isinstance(fig, dict) and fig.get("name") in RENAMED_FIGURES:
                fig["name"] = RENAMED_FIGURES[fig["name"]]
    if isinstance(m, dict) and doc["schema_version"] == 1:
        kind = None
        if m.get("gpu_count"):
            kind = "rocm" if m.get("hip") else "cuda"
        m.setdefault("accelerator", kind)
        m.setdefault("book_commit", "unknown")
        m.setdefault("flags", {})
    return doc


def load_results(directory: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every result file in ``directory`` (default :func:`results_dir`), parsed, sorted by
    file name (appendix).

    A folder that is named (argument or ``$BOOK_RESULTS_DIR``) but missing or a file raises
    ``FileNotFoundError`` / ``NotADirectoryError`` naming it; an empty folder gives ``[]``.
    A file that cannot be read, is not valid JSON, lacks the top-level keys or has a schema
    version this package cannot read raises an error naming it.
    """
    folder = _folder(directory)
    if folder is None:
        return []
    try:
        paths = sorted(p for p in folder.glob("*.json") if p.is_file())
    except PermissionError as exc:
        raise PermissionError(f"cannot list the result folder {folder}: {exc.strerror}; "
                              "make it readable, or name another folder") from None
    out = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"result file {path} cannot be read ({exc}); make it readable "
                             "or move it out of the folder") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"result file {path} is not valid JSON: {exc}") from None
        _check_doc(doc, path)
        doc["_path"] = str(path)
        out.append(_migrate(doc))
    return out


def committed(workload: str | None = None, *, gpu_only: bool = False,
              directory: str | Path | None = None) -> pd.DataFrame:
    """All committed figures as one table, one row per figure and machine (chapter 3).

    Columns: machine, device_name, gpu_count, torch, cuda, driver, date, workload, chapter,
    name, value, unit, spread, device, note.
    """
    _check_workload(workload, optional=True)
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


def software_versions(machine: dict[str, Any]) -> list[str]:
    """The software a measurement ran on, as a machine record names it: the driver and CUDA
    or ROCm/HIP where the machine has them, then torch (chapter 3; also a recorded page's
    note)."""
    versions = [f"driver {machine['driver']}"] if machine.get("driver") else []
    if machine.get("cuda"):
        versions.append(f"CUDA {machine['cuda']}")
    if machine.get("hip"):
        versions.append(f"ROCm/HIP {machine['hip']}")
    return [*versions, f"torch {machine.get('torch', '?')}"]


def machine_stamp(doc: dict[str, Any], label: str | None = None) -> str:
    """One line naming the hardware and versions behind a result file (chapter 3)."""
    parts = [label or machine_label(doc)]  # machine_label refuses what is not a result file
    m = doc["machine"]
    parts += software_versions(m)
    parts.append(f"measured {str(doc.get('date', '?'))[:10]}")
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
    _check_workload(workload)
    every = load_results(directory)
    docs = [d for d in every if d["machine"].get("gpu_count")] if gpu_only else every
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
        line = (f"No committed {kind}results for the {workload!r} workload yet: they "
                "appear here once the book's benchmark has run on such a machine "
                "and its result file is committed under results/.")
        reported = sorted({f["workload"] for d in every for f in d["figures"]})
        if workload not in reported:
            line += f" (The committed files report: {', '.join(reported) or 'nothing'}.)"
        _show(workload, [line])
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


#: A committed-figures table longer than this many rows is shown folded on the built page.
FOLD_ROWS = 12


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
    if table is not None and len(table) > FOLD_ROWS:
        # a long table folded under one line, as the appendix folds its own (show_folded):
        # the page stays a reading, and the table is one click away
        summary = f"The {len(table)} figures, one per row (click to open)"
        markup += (f'<details class="book-folded"><summary>{html.escape(summary)}</summary>'
                   f"{table.to_html()}</details>")
    elif table is not None:
        markup += table.to_html()
    display({"text/plain": text, "text/html": markup}, raw=True,
            metadata={DISPLAY_KEY: workload})


def _check_workload(workload: Any, *, optional: bool = False) -> None:
    """A workload is named by a non-empty string (``"matmul"``); ``None`` where allowed."""
    if workload is None and optional:
        return
    if not isinstance(workload, str) or not workload.strip():
        raise TypeError(f"workload must be a workload's name such as 'matmul', not "
                        f"{workload!r}" + (" (or None for every workload)" if optional else ""))


# -- Tables and plots of every result file, side by side (appendix) --------------------------

def _check_docs(docs: Any) -> None:
    """``docs`` must be what :func:`load_results` returns: a list of result documents."""
    if isinstance(docs, (str, bytes, os.PathLike, dict)) or not isinstance(docs, Sequence):
        raise TypeError(f"expected the list that load_results() returns, not "
                        f"{type(docs).__name__} {docs!r:.60}: call load_results(folder) first")
    for doc in docs:
        if not (isinstance(doc, dict) and isinstance(doc.get("machine"), dict)
                and isinstance(doc.get("figures"), list)):
            raise TypeError(f"expected result documents from load_results(), found "
                            f"{doc!r:.60}: call load_results(folder) and pass its list")


def machine_label(doc: dict[str, Any]) -> str:
    """How a machine is named on the page (appendix): its GPU (``NVIDIA H100 80GB HBM3 x1``)
    or, without one, its processor and core count."""
    if not isinstance(doc, dict) or not isinstance(doc.get("machine"), dict):
        raise TypeError(f"expected one result document from load_results() (or a dict with "
                        f"its 'machine' record), not {doc!r:.60}")
    m = doc["machine"]
    if m.get("gpu_count"):
        label = f"{m['device_name']} x{m['gpu_count']}"
    else:
        label = f"{m['device_name']} ({m.get('cpu_count', '?')} cores, no GPU)"
    if doc.get("quick"):
        label += " [quick run]"
    return label


def machine_labels(docs: Sequence[dict[str, Any]]) -> list[str]:
    """:func:`machine_label` of every file, made unique with the slug where two coincide
    (appendix)."""
    _check_docs(docs)
    labels = [machine_label(doc) for doc in docs]
    return [f"{label} <{doc['machine']['slug']}>" if labels.count(label) > 1 else label
            for label, doc in zip(labels, docs, strict=True)]


def machines_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One column per result file: the hardware, the versions and when it was measured
    (appendix)."""
    _check_docs(docs)
    columns = {}
    for label, doc in zip(machine_labels(docs), docs, strict=True):
        m = doc["machine"]
        gpus = ", ".join(f"{g['name']} ({g.get('memory_gib', '?')} GiB, compute "
                         f"{g.get('capability', '?')})" for g in m.get("gpus", [])) or "none"
        columns[label] = {
            "device": m["device_name"],
            "GPU count": m["gpu_count"],
            "GPUs": gpus,
            "CPU": f"{m['cpu']} ({m['cpu_count']} cores, torch uses "
                   f"{m.get('torch_threads', '?')} threads)",
            "NVIDIA driver": m.get("driver") or "-",
            "accelerator": m.get("accelerator") or "-",
            "CUDA": m.get("cuda") or m.get("hip") or "-",
            "cuDNN": m.get("cudnn") or "-",
            "torch": m["torch"],
            "Python": m["python"],
            "platform": m["platform"],
            "measured on (UTC)": doc["date"].replace("T", " ")[:16],
            "book commit": (m.get("book_commit") or "unknown")[:10],
            "command": doc["command"],
            "run": "quick (small sizes)" if doc.get("quick") else "full",
            "figures": len(doc["figures"]),
            "file": f"results/{m['slug']}.json",
        }
    table = pd.DataFrame(columns, dtype=object)
    table.index.name = "machine"
    return table


def _long(docs: Sequence[dict[str, Any]], workload: str | None = None) -> pd.DataFrame:
    """One row per figure. ``series`` names the machine, with the device added for a machine
    that reports one of this workload's figures on two devices (so its bars stay apart)."""
    _check_docs(docs)
    _check_workload(workload, optional=True)
    rows = []
    for label, doc in zip(machine_labels(docs), docs, strict=True):
        figs = [f for f in doc["figures"] if workload is None or f["workload"] == workload]
        keys = [(f["workload"], f["name"], f["unit"]) for f in figs]
        split = len(keys) != len(set(keys))
        run_device = doc.get("device")
        for f, key in zip(figs, keys, strict=True):
            tagged = keys.count(key) > 1 or (run_device is not None and f["device"] != run_device)
            rows.append({"machine": label,
                         "series": f"{label} | {f['device']}" if split else label,
                         "workload": f["workload"], "chapter": f.get("chapter"),
                         "figure": f["name"], "unit": f["unit"], "device": f["device"],
                         "value": f["value"], "spread": f.get("spread"),
                         "cell": _fmt(f["value"], f.get("spread"))
                         + (f" ({f['device']})" if tagged else "")})
    return pd.DataFrame(rows, columns=["machine", "series", "workload", "chapter", "figure",
                                       "unit", "device", "value", "spread", "cell"])


def workloads(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Every workload any file reports, in chapter order (appendix)."""
    long = _long(docs)
    if long.empty:
        return []
    order = long.drop_duplicates("workload")
    key = order["chapter"].map(lambda c: (0, c, "") if isinstance(c, int) else (1, 0, str(c)))
    return list(order.assign(key=key).sort_values("key", kind="stable")["workload"])


def _fmt(value: float, spread: float | None) -> str:
    text = f"{value:.4g}"
    if spread is not None and not (isinstance(spread, float) and math.isnan(spread)) and spread:
        text += f" ± {spread:.2g}"
    return text


def figures_table(docs: Sequence[dict[str, Any]], workload: str | None = None) -> pd.DataFrame:
    """Every figure side by side (appendix): one row per (workload, figure, unit), one column
    per machine, cells ``value ± spread``, empty where a machine lacks the figure. A figure measured on
    another device than the one the run was for (the CPU baseline on a GPU machine) says so,
    ``1.5 ± 0.02 (cpu)``; one measured on two devices shows both, joined by ``;``."""
    long = _long(docs, workload)
    columns = [label for label in machine_labels(docs) if label in set(long["machine"])]
    if long.empty:
        return pd.DataFrame(columns=columns)
    rows = list(dict.fromkeys(zip(long["workload"], long["figure"], long["unit"], strict=True)))
    table = long.pivot_table(index=["workload", "figure", "unit"], columns="machine",
                             values="cell", aggfunc="; ".join, sort=False)
    table = table.reindex(index=pd.MultiIndex.from_tuples(rows, names=table.index.names),
                          columns=columns).fillna("")
    table.columns.name = "machine"
    return table


def workload_figures(docs: Sequence[dict[str, Any]], workload: str) -> pd.DataFrame:
    """One workload's figures, one row per figure and machine (appendix): the rows of
    :func:`figures_table` for ``workload``, one machine under the other, so the table stays
    one column wide however many machines are committed. Index ``(figure, unit, machine)``,
    column ``"value ± spread"``; a machine that lacks a figure has no row for it."""
    _check_workload(workload)
    wide = figures_table(docs, workload)
    column = "value ± spread"
    if wide.empty:
        return pd.DataFrame(columns=[column])
    rows = [((figure, unit, machine), wide.loc[(w, figure, unit), machine])
            for (w, figure, unit) in wide.index for machine in wide.columns
            if wide.loc[(w, figure, unit), machine]]
    index = pd.MultiIndex.from_tuples([key for key, _ in rows],
                                      names=["figure", "unit", "machine"])
    return pd.DataFrame({column: [cell for _, cell in rows]}, index=index)


def show_folded(summary: str, table: pd.DataFrame) -> None:
    """Display ``table`` folded under a one-line ``summary`` (appendix): the built page and
    Jupyter show an HTML ``<details>`` block, closed until the reader opens it; a plain-text
    front end shows the summary and the table."""
    import html

    from IPython.display import display

    if not isinstance(summary, str) or not summary.strip():
        raise ValueError(f"summary must say what the folded table holds, not {summary!r}")
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a DataFrame, not {type(table).__name__}")
    markup = (f'<details class="book-folded"><summary>{html.escape(summary)}</summary>'
              f"{table.to_html()}</details>")
    display({"text/html": markup, "text/plain": f"{summary}\n{table.to_string()}"}, raw=True)


def missing_figures(docs: Sequence[dict[str, Any]], table: pd.DataFrame) -> list[str]:
    """Figures of ``docs`` that ``table`` (from :func:`figures_table`) does not show (appendix)."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be the DataFrame figures_table(docs) returns, not "
                        f"{type(table).__name__}")
    missing = []
    for row in _long(docs).itertuples():
        key = (row.workload, row.figure, row.unit)
        shown = (key in table.index and row.machine in table.columns
                 and row.cell in table.loc[key, row.machine].split("; "))
        if not shown:
            missing.append(f"{row.machine}: {row.workload} {row.figure} [{row.unit}]")
    return missing


#: Units a bar chart compares: times, rates, memory and speed-up ratios. Other figures (the
#: regression's weights, a loss, an accuracy, a share of peak) say whether a run was right,
#: not how fast it was; they stay in the figures table.
_TIME_UNITS = {"s": "time", "ms": "time", "us": "time"}
_OTHER_UNITS = {"x": "ratio (times)", "MiB": "memory", "GiB": "memory"}


def axis_label(unit: str) -> str | None:
    """The axis label of a plotted unit (``"time (ms): shorter is faster"``), ``None`` for
    a unit :func:`plot_workload` leaves to the table (appendix)."""
    if unit in _TIME_UNITS:
        return f"time ({unit}): shorter is faster"
    if unit.endswith("/s"):
        return f"rate ({unit}): longer is faster"
    if unit in _OTHER_UNITS:
        kind = _OTHER_UNITS[unit]
        return kind if unit == "x" else f"{kind} ({unit})"
    return None


def is_noisy(value: float, spread: float | None) -> bool:
    """True where a figure's spread is above ``helpers.timing.NOISY_SPREAD`` of its value, the
    threshold at which chapter 3 calls a timing noisy (appendix)."""
    from helpers.timing import NOISY_SPREAD  # noqa: PLC0415

    if spread is None or (isinstance(spread, float) and math.isnan(spread)) or not value:
        return False
    return abs(spread) > NOISY_SPREAD * abs(value)


def plot_panels(docs: Sequence[dict[str, Any]], workload: str) -> list[str]:
    """The units :func:`plot_workload` draws a panel for (appendix): a time, rate, memory or
    ratio unit with at least two bars (two machines, or two figures of one machine); a single
    bar compares nothing and stays in the figures table."""
    long = _long(docs, workload)
    units = [u for u in dict.fromkeys(long["unit"]) if axis_label(u) is not None]
    return [u for u in units if (long["unit"] == u).sum() >= 2]


def plot_workload(docs: Sequence[dict[str, Any]], workload: str, *, max_rows: int = 40):
    """Grouped bars of one workload's figures (appendix): one colour per machine, one panel
    per unit of :func:`plot_panels` with the unit on its axis, the spread as whiskers, and
    hatched bars where the spread is above ``NOISY_SPREAD`` of the value. ``None`` when no
    file reports ``workload`` or nothing of it is worth a panel."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from helpers.timing import NOISY_SPREAD  # noqa: PLC0415

    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int, not {max_rows!r}")
    _check_workload(workload)
    long = _long(docs, workload)
    units = plot_panels(docs, workload)
    if not units:
        return None
    long = long[long["unit"].isin(units)]
    columns = list(dict.fromkeys(long["series"]))
    machines = list(dict.fromkeys(long["machine"]))
    heights = [min(max_rows, long[long["unit"] == u]["figure"].nunique()) for u in units]
    per_row = 0.22 * len(columns) + 0.15
    fig, axes = plt.subplots(len(units), 1, squeeze=False,
                             figsize=(10, 1.5 + sum(per_row * h + 0.8 for h in heights)),
                             gridspec_kw={"height_ratios": heights})
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {c: palette[j % len(palette)] for j, c in enumerate(columns)}
    any_noisy = False
    for ax, unit in zip(axes[:, 0], units, strict=True):
        part = long[long["unit"] == unit]
        names = list(dict.fromkeys(part["figure"]))[:max_rows]
        width = 0.8 / len(columns)
        for j, column in enumerate(columns):
            sub = part[part["series"] == column].set_index("figure")
            here = [n for n in names if n in sub.index]
            if not here:  # this machine lacks these figures: its slot stays empty
                continue
            ys = [names.index(n) - 0.4 + width * (j + 0.5) for n in here]
            values = [float(sub.loc[n, "value"]) for n in here]
            spreads = [sub.loc[n, "spread"] if pd.notna(sub.loc[n, "spread"]) else None
                       for n in here]
            noisy = [is_noisy(v, e) for v, e in zip(values, spreads, strict=True)]
            any_noisy = any_noisy or any(noisy)
            bars = ax.barh(ys, values, height=width, color=colour[column], capsize=2,
                           xerr=[e or 0.0 for e in spreads])
            for bar, flag in zip(bars, noisy, strict=True):
                if flag:
                    bar.set_hatch("///")
                    bar.set_edgecolor("black")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(len(names) - 0.5, -0.5)
        label = axis_label(unit)
        values = part["value"]
        if (values > 0).all() and values.max() / values.min() > 100:
            ax.set_xscale("log")
            label += ", log scale"
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    where = (f"{len(machines)} machines side by side" if len(machines) > 1
             else "one machine")
    axes[0, 0].set_title(f"{workload}: {where} (whiskers: spread)")
    handles = [Patch(color=colour[c], label=c) for c in columns]
    if any_noisy:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///",
                             label=f"noisy: spread above {NOISY_SPREAD:.0%} of the value"))
    fig.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=1, title="machine" if len(machines) == 1 else "machines")
    fig.tight_layout()
    return fig


def plot_alt(docs: Sequence[dict[str, Any]], workload: str) -> str:
    """Alt text for :func:`plot_workload`'s figure (appendix): what it shows, in words."""
    units = plot_panels(docs, workload)
    if not units:
        return f"No plot of the {workload} workload: nothing in the result files to compare."
    long = _long(docs, workload)
    long = long[long["unit"].isin(units)]
    machines = list(dict.fromkeys(long["machine"]))
    who = (f"one machine, {machines[0]}" if len(machines) == 1
           else f"{len(machines)} machines side by side: {', '.join(machines)}")
    panels = "; ".join(
        f"{axis_label(u)}: {', '.join(dict.fromkeys(long[long['unit'] == u]['figure']))}"
        for u in units)
    noisy = [f"{r.figure} ({r.machine})" for r in long.itertuples()
             if is_noisy(r.value, r.spread if pd.notna(r.spread) else None)]
    text = f"Bar chart of the {workload} workload measured on {who}. Panels: {panels}."
    return text + (f" Hatched as noisy: {', '.join(noisy)}." if noisy else " No bar is noisy.")


def show_figure(fig: Any, alt: str) -> None:
    """Display a matplotlib figure with alt text, and close it (appendix).

    The output carries the PNG (what Jupyter and Colab show) and the same image as an HTML
    ``<img alt=...>``, which the built book prefers, so a screen reader hears ``alt``.
    """
    import base64
    import html
    import io

    import matplotlib.pyplot as plt
    from IPython.display import display

    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"alt must be a sentence saying what the figure shows, not {alt!r}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", dpi=100)
    plt.close(fig)
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    markup = (f'<img src="data:image/png;base64,{png}" alt="{html.escape(alt)}" '
              'style="max-width: 100%">')
    display({"image/png": png, "text/html": markup, "text/plain": alt}, raw=True)


_MATMUL_RATE = re.compile(r"^(?P<mode>fp32|tf32|bf16|fp16)_tflops_n(?P<size>\d+)$")


def peak_share_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """What share of its device's dense peak each accelerator matmul reached (appendix): one
    row per (format, size), one column per GPU machine; empty where the book knows no peak for that
    GPU and format (``helpers.timing.peak_tflops`` returns None)."""
    from helpers import timing  # noqa: PLC0415

    _check_docs(docs)
    columns: dict[str, dict[tuple[str, int], float | None]] = {}
    for label, doc in zip(machine_labels(docs), docs, strict=True):
        if not doc["machine"].get("gpu_count"):
            continue
        name = doc["machine"]["device_name"]
        for f in doc["figures"]:
            m = _MATMUL_RATE.match(f["name"])
            if f["workload"] != "matmul" or f["device"] == "cpu" or m is None:
                continue
            try:
                peak = timing.peak_tflops(name, m["mode"])
            except ValueError:  # a format the peak table does not list
                peak = None
            share = f["value"] / peak if peak else None
            columns.setdefault(label, {})[(m["mode"], int(m["size"]))] = share
    table = pd.DataFrame(columns, dtype=float)
    if not table.empty:
        table = table.sort_index()
        table.index.names = ["format", "size n"]
    table.columns.name = "machine"
    return table


def _time_or_rate(unit: str) -> int:
    """+1 for a time (smaller is faster), -1 for a rate (larger is faster), 0 otherwise."""
    if unit in ("s", "ms", "us"):
        return 1
    return -1 if unit.endswith("/s") else 0


def speedup_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Each GPU machine's speed-up over its own host CPU (appendix): one row per figure the
    workloads measure on both (``cpu_<name>`` on the CPU against ``<name>`` or ``gpu_<name>`` on the
    GPU, same unit), one column per GPU machine. A time is divided CPU over GPU, a rate GPU
    over CPU, so above 1 means the GPU is faster."""
    _check_docs(docs)
    columns: dict[str, dict[tuple[str, str], float]] = {}
    for label, doc in zip(machine_labels(docs), docs, strict=True):
        if not doc["machine"].get("gpu_count"):
            continue
        cpu, gpu = {}, {}
        for f in doc["figures"]:
            if f["device"] == "cpu" and f["name"].startswith("cpu_"):
                cpu[(f["workload"], f["name"][4:], f["unit"])] = f["value"]
            elif f["device"] != "cpu":
                gpu[(f["workload"], f["name"].removeprefix("gpu_"), f["unit"])] = f["value"]
        for key in cpu.keys() & gpu.keys():
            sense = _time_or_rate(key[2])
            if sense and cpu[key] > 0 and gpu[key] > 0:
                ratio = cpu[key] / gpu[key] if sense > 0 else gpu[key] / cpu[key]
                columns.setdefault(label, {})[(key[0], f"{key[1]} [{key[2]}]")] = ratio
    table = pd.DataFrame(columns, dtype=float)
    if not table.empty:
        table = table.sort_index()
        table.index.names = ["workload", "figure"]
    table.columns.name = "machine"
    return table
