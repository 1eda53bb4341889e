"""Tables and plots of every result file, side by side (appendix: Measured results).

The appendix renders the files in ``results/`` with these functions; the book's tests call
them on the committed files too, so the page and the tests agree on what "shown" means.
Each function takes the documents :func:`helpers.results.load_results` returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd

__all__ = ["figures_table", "machine_label", "machine_labels", "machines_table",
           "missing_figures", "peak_share_table", "plot_workload", "speedup_table", "workloads"]


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


def machine_labels(docs: Sequence[dict[str, Any]]) -> list[str]:
    """:func:`machine_label` of every file, made unique with the slug where two coincide."""
    labels = [machine_label(doc) for doc in docs]
    return [f"{label} <{doc['machine']['slug']}>" if labels.count(label) > 1 else label
            for label, doc in zip(labels, docs, strict=True)]


def machines_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One column per result file: the hardware, the versions and when it was measured."""
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
                         "workload": f["workload"], "chapter": f["chapter"],
                         "figure": f["name"], "unit": f["unit"], "device": f["device"],
                         "value": f["value"], "spread": f["spread"],
                         "cell": _fmt(f["value"], f["spread"])
                         + (f" ({f['device']})" if tagged else "")})
    return pd.DataFrame(rows, columns=["machine", "series", "workload", "chapter", "figure",
                                       "unit", "device", "value", "spread", "cell"])


def workloads(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Every workload any file reports, in chapter order."""
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
    """Every figure side by side: one row per (workload, figure, unit), one column per machine,
    cells ``value ± spread``, empty where a machine lacks the figure. A figure measured on
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


def missing_figures(docs: Sequence[dict[str, Any]], table: pd.DataFrame) -> list[str]:
    """Figures of ``docs`` that ``table`` (from :func:`figures_table`) does not show."""
    missing = []
    for row in _long(docs).itertuples():
        key = (row.workload, row.figure, row.unit)
        shown = (key in table.index and row.machine in table.columns
                 and row.cell in table.loc[key, row.machine].split("; "))
        if not shown:
            missing.append(f"{row.machine}: {row.workload} {row.figure} [{row.unit}]")
    return missing


def plot_workload(docs: Sequence[dict[str, Any]], workload: str, *, max_rows: int = 40):
    """Grouped bars of one workload's figures, one colour per machine, one panel per unit,
    with the spread as error bars; ``None`` when no file reports ``workload``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    long = _long(docs, workload)
    if long.empty:
        return None
    units = list(dict.fromkeys(long["unit"]))
    columns = list(dict.fromkeys(long["series"]))
    heights = [min(max_rows, long[long["unit"] == u]["figure"].nunique()) for u in units]
    per_row = 0.22 * len(columns) + 0.15
    fig, axes = plt.subplots(len(units), 1, squeeze=False,
                             figsize=(10, 1.5 + sum(per_row * h + 0.7 for h in heights)),
                             gridspec_kw={"height_ratios": heights})
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {c: palette[j % len(palette)] for j, c in enumerate(columns)}
    for ax, unit in zip(axes[:, 0], units, strict=True):
        part = long[long["unit"] == unit]
        names = list(dict.fromkeys(part["figure"]))[:max_rows]
        width = 0.8 / len(columns)
        for j, column in enumerate(columns):
            sub = part[part["series"] == column].set_index("figure")
            here = [n for n in names if n in sub.index]
            if not here:
                continue
            ys = [names.index(n) - 0.4 + width * (j + 0.5) for n in here]
            errs = [sub.loc[n, "spread"] if pd.notna(sub.loc[n, "spread"]) else 0.0
                    for n in here]
            ax.barh(ys, [sub.loc[n, "value"] for n in here], height=width, xerr=errs,
                    color=colour[column], capsize=2)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.set_xlabel("(no unit)" if unit == "1" else unit)
        values = part["value"]
        if (values > 0).all() and values.max() / values.min() > 100:
            ax.set_xscale("log")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_title(f"{workload}: every machine side by side (whiskers: spread)")
    fig.legend(handles=[Patch(color=colour[c], label=c) for c in columns], fontsize=8,
               loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, title="machine")
    fig.tight_layout()
    return fig


_MATMUL_RATE = re.compile(r"^(?P<mode>fp32|tf32|bf16|fp16)_tflops_n(?P<size>\d+)$")


def peak_share_table(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """What share of its device's dense peak each accelerator matmul reached: one row per
    (format, size), one column per GPU machine; empty where the book knows no peak for that
    GPU and format (``helpers.timing.peak_tflops`` returns None)."""
    from helpers import timing

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
    """Each GPU machine's speed-up over its own host CPU: one row per figure the workloads
    measure on both (``cpu_<name>`` on the CPU against ``<name>`` or ``gpu_<name>`` on the
    GPU, same unit), one column per GPU machine. A time is divided CPU over GPU, a rate GPU
    over CPU, so above 1 means the GPU is faster."""
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
