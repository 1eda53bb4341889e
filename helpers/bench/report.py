"""Tables and plots of every result file, side by side (appendix: Measured results).

The appendix renders the files in ``results/`` with these functions; the book's tests call
them on the committed files too, so the page and the tests agree on what "shown" means.
Each function takes the documents :func:`helpers.results.load_results` returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

__all__ = ["column_labels", "figures_table", "machine_label", "machines_table", "plot_workload",
           "workloads"]


def machine_label(doc: dict[str, Any]) -> str:
    """How a machine is named on the page: its GPU (``NVIDIA H100 80GB HBM3 x1``) or, without
    one, its processor and core count."""
    m = doc["machine"]
    if m.get("gpu_count"):
        label = f"{m['device_name']} x{m['gpu_count']}"
    else:
        label = f"{m['device_name']} ({m['cpu_count']} cores, no GPU)"
    if doc.get("quick"):
        label += " [quick run]"
    return label


def _labels(docs: Sequence[dict[str, Any]]) -> list[str]:
    labels = [machine_label(doc) for doc in docs]
    return [f"{label} <{doc['machine']['slug']}>" if labels.count(label) > 1 else label
            for label, doc in zip(labels, docs, strict=True)]


def machines_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One column per result file: the hardware, the versions and when it was measured."""
    columns = {}
    for label, doc in zip(_labels(docs), docs, strict=True):
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
            "CUDA": m.get("cuda") or m.get("hip") or "-",
            "cuDNN": m.get("cudnn") or "-",
            "torch": m["torch"],
            "Python": m["python"],
            "platform": m["platform"],
            "measured on (UTC)": doc["date"].replace("T", " ")[:16],
            "command": doc["command"],
            "run": "quick (small sizes)" if doc.get("quick") else "full",
            "figures": len(doc["figures"]),
            "file": f"results/{m['slug']}.json",
        }
    table = pd.DataFrame(columns, dtype=object)
    table.index.name = "machine"
    return table


def column_labels(docs: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(machine label, device) for every column of :func:`figures_table`, in order."""
    out = []
    for label, doc in zip(_labels(docs), docs, strict=True):
        for device in dict.fromkeys(f["device"] for f in doc["figures"]):
            out.append((label, device))
    return out


def _long(docs: Sequence[dict[str, Any]], workload: str | None = None) -> pd.DataFrame:
    rows = []
    for label, doc in zip(_labels(docs), docs, strict=True):
        for f in doc["figures"]:
            if workload is None or f["workload"] == workload:
                rows.append({"machine": label, "column": f"{label} | {f['device']}",
                             "workload": f["workload"], "chapter": f["chapter"],
                             "figure": f["name"], "unit": f["unit"], "device": f["device"],
                             "value": f["value"], "spread": f["spread"]})
    return pd.DataFrame(rows, columns=["machine", "column", "workload", "chapter", "figure",
                                       "unit", "device", "value", "spread"])


def workloads(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Every workload any file reports, in chapter order."""
    long = _long(docs)
    if long.empty:
        return []
    order = long.drop_duplicates("workload")
    key = order["chapter"].map(lambda c: (0, c, "") if isinstance(c, int) else (1, 0, str(c)))
    return list(order.assign(key=key).sort_values("key", kind="stable")["workload"])


def _fmt(value: float, spread: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.4g}"
    if spread is not None and not (isinstance(spread, float) and math.isnan(spread)) and spread:
        text += f" ± {spread:.2g}"
    return text


def figures_table(docs: Sequence[dict[str, Any]], workload: str | None = None) -> pd.DataFrame:
    """Every figure side by side: one row per (workload, figure, unit), one column per machine
    and device it was measured on, cells ``value ± spread``; empty where a machine lacks it."""
    long = _long(docs, workload)
    columns = [f"{label} | {device}" for label, device in column_labels(docs)
               if workload is None or f"{label} | {device}" in set(long["column"])]
    if long.empty:
        return pd.DataFrame(columns=columns)
    long = long.assign(cell=[_fmt(v, s) for v, s in zip(long["value"], long["spread"],
                                                         strict=True)])
    rows = list(dict.fromkeys(zip(long["workload"], long["figure"], long["unit"], strict=True)))
    table = long.pivot(index=["workload", "figure", "unit"], columns="column", values="cell")
    table = table.reindex(index=pd.MultiIndex.from_tuples(rows, names=table.index.names),
                          columns=columns).fillna("")
    table.columns.name = "machine | device"
    return table


def plot_workload(docs: Sequence[dict[str, Any]], workload: str, *, max_rows: int = 40):
    """Grouped bars of one workload's figures, one bar per machine and device, one panel per
    unit, with the spread as error bars; ``None`` when no file reports ``workload``."""
    import matplotlib.pyplot as plt

    long = _long(docs, workload)
    if long.empty:
        return None
    units = list(dict.fromkeys(long["unit"]))
    columns = list(dict.fromkeys(long["column"]))
    heights = [min(max_rows, long[long["unit"] == u]["figure"].nunique()) for u in units]
    fig, axes = plt.subplots(len(units), 1, squeeze=False,
                             figsize=(10, 1.2 + sum(0.25 * len(columns) * h + 0.6 for h in heights)),
                             gridspec_kw={"height_ratios": heights})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, unit in zip(axes[:, 0], units, strict=True):
        part = long[long["unit"] == unit]
        names = list(dict.fromkeys(part["figure"]))[:max_rows]
        width = 0.8 / len(columns)
        for j, column in enumerate(columns):
            sub = part[part["column"] == column].set_index("figure")
            ys = [i - 0.4 + width * (j + 0.5) for i, n in enumerate(names) if n in sub.index]
            vals = [sub.loc[n, "value"] for n in names if n in sub.index]
            errs = [sub.loc[n, "spread"] if pd.notna(sub.loc[n, "spread"]) else 0.0
                    for n in names if n in sub.index]
            if vals:
                ax.barh(ys, vals, height=width, xerr=errs, color=colours[j % len(colours)],
                        label=column, capsize=2)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        positive = part["value"][part["value"] > 0]
        if len(positive) and positive.max() / positive.min() > 100 and (part["value"] > 0).all():
            ax.set_xscale("log")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_title(f"{workload}: every machine side by side (bars: value, whiskers: spread)")
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      title="machine | device")
    fig.tight_layout()
    return fig
