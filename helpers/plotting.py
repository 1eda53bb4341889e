"""Plots the chapters share: training histories, timing comparisons, size sweeps, image grids.

Introduced in chapter 3 (timing plots) and chapter 5 (history and prediction grids).
Every function returns the matplotlib ``Figure`` so a notebook can tweak or save it.

Every figure a notebook shows carries alt text that says what it shows: imported in a Jupyter
kernel, this module makes the kernel's PNG output of a figure carry ``alt`` in its output
metadata (:func:`describe_figure` writes it from the figure's titles, axis labels, legend and
bars, unless :func:`set_alt` or :func:`show_figure` gave one), and the book's Sphinx extension
(``_ext/figure_alt.py``) puts it on the page's ``<img>``.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["describe_figure", "figure_alt", "install_alt_text", "plot_history", "plot_speedups",
           "plot_sweep", "plot_timings", "readable", "set_alt", "show_figure", "show_images"]


def readable(value: float) -> str:
    """A number as a bar label: three significant digits, thousands separated, never in
    scientific notation (``2810.4`` -> ``"2,810"``, ``0.01234`` -> ``"0.0123"``) (chapter 3)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"readable() formats a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def plot_history(history: pd.DataFrame, metrics: Sequence[str] = ("loss", "acc"),
                 title: str | None = None) -> Figure:
    """Train and validation curves per epoch, one panel per metric (chapter 5).

    ``history`` is the DataFrame returned by :func:`helpers.training.fit` (columns
    ``train_<metric>`` and ``val_<metric>``); the restored best epoch is marked.
    """
    if not isinstance(history, pd.DataFrame):
        raise TypeError(f"history must be the DataFrame helpers.training.fit returns, got "
                        f"{type(history).__name__}; wrap a list of rows in pd.DataFrame(...)")
    if isinstance(metrics, str):
        metrics = (metrics,)  # one metric, not its letters
    wanted = ["epoch", *(f"{split}_{m}" for m in metrics for split in ("train", "val"))]
    missing = [column for column in wanted if column not in history.columns]
    if missing:
        raise KeyError(f"history has no column(s) {missing}; it has {list(history.columns)}")
    if history.empty:
        raise ValueError("history has no rows: train for at least one epoch first")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.5), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for split in ("train", "val"):
            ax.plot(history["epoch"], history[f"{split}_{metric}"], marker="o", label=split)
        if "best" in history.columns and history["best"].any():
            best = history.loc[history["best"], "epoch"].iloc[0]
            ax.axvline(best, color="grey", linestyle=":", label=f"best (epoch {best})")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        ax.set_ylabel(metric)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_timings(seconds: Mapping[str, float], errors: Mapping[str, float] | None = None,
                 title: str = "", unit: str = "s", log: bool = False) -> Figure:
    """Horizontal bars of times (or any figure) per label, with optional error bars (chapter 3)."""
    if not isinstance(seconds, Mapping):
        raise TypeError(f"plot_timings takes a mapping of label -> value, such as "
                        f"{{'cpu': 1.2, 'cuda:0': 0.1}}, got {type(seconds).__name__}")
    if not seconds:
        raise ValueError("nothing to plot: no timings given")
    labels = list(seconds)
    values = [_number(k, seconds[k]) for k in labels]
    if log and min(values) <= 0:
        raise ValueError(f"a log axis needs values above 0; {dict(zip(labels, values, strict=True))} "
                         "has one at or below 0: pass log=False")
    if errors:
        unknown = sorted(set(errors) - set(labels))
        if unknown:
            raise ValueError(f"errors name labels that have no value: {unknown}; "
                             f"the labels are {labels}")
    err = [_number(k, errors.get(k, 0.0)) for k in labels] if errors else None
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(labels) + 1.2))
    ax.barh(labels, values, xerr=err, color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    if log:
        ax.set_xscale("log")
    for y, v in enumerate(values):
        ax.annotate(readable(v), (v, y), xytext=(3, 0), textcoords="offset points", va="center")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def _number(label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"the value for {label!r} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"the value for {label!r} is {value}: measure it again, or leave "
                         "it out of the plot")
    return float(value)


def plot_speedups(speedups: Mapping[str, float], title: str = "speed-up over baseline") -> Figure:
    """Bars of speed-up factors with the break-even line at 1x (chapter 4)."""
    fig = plot_timings(speedups, title=title, unit="x faster")
    fig.axes[0].axvline(1.0, color="black", linewidth=1)
    return fig


def plot_sweep(frame: pd.DataFrame, x: str, y: str, hue: str, *, logx: bool = True,
               logy: bool = True, title: str = "", ylabel: str | None = None) -> Figure:
    """One line per value of ``hue`` of ``y`` against ``x`` (chapter 3's size sweep)."""
    for col in (x, y, hue):
        if col not in frame.columns:
            raise KeyError(f"column {col!r} not in {list(frame.columns)}")
    if frame.empty:
        raise ValueError("nothing to plot: the frame has no rows")
    for col, is_log in ((x, logx), (y, logy)):
        if is_log and not (frame[col] > 0).all():
            raise ValueError(f"a log axis needs values above 0, but column {col!r} has "
                             f"{frame[col].min()}: pass log{'x' if col == x else 'y'}=False")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, group in frame.groupby(hue, sort=False):
        group = group.sort_values(x)
        ax.plot(group[x], group[y], marker="o", label=str(name))
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def show_images(images: torch.Tensor, titles: Sequence[str] | None = None, ncols: int = 8,
                colors: Sequence[str] | None = None) -> Figure:
    """A grid of greyscale images ``[N, 1, H, W]`` or ``[N, H, W]`` with optional titles
    (chapter 5's predictions: pass ``colors`` to mark wrong ones in red)."""
    images = torch.as_tensor(images).detach().cpu()
    if images.ndim == 4 and images.shape[1] == 1:
        images = images[:, 0]
    if images.ndim != 3 or len(images) == 0:
        raise ValueError(f"expected greyscale images of shape [N, 1, H, W] or [N, H, W] with "
                         f"N >= 1, got {tuple(images.shape)}")
    n = len(images)
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a positive whole number, got {ncols!r}")
    for name, given in (("titles", titles), ("colors", colors)):
        if given is not None and len(given) != n:
            raise ValueError(f"{len(given)} {name} for {n} images: give one per image")
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.3 * ncols, 1.5 * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            ax.imshow(images[i].numpy(), cmap="gray")
            if titles is not None:
                ax.set_title(titles[i], fontsize=9, color=colors[i] if colors else "black")
    fig.tight_layout()
    return fig


# -- alt text ----------------------------------------------------------------------------------

#: Alt text given explicitly, per figure (a figure has no attribute of its own for it).
_ALT: weakref.WeakKeyDictionary[Figure, str] = weakref.WeakKeyDictionary()
_MAX_LABELS = 8


def _listed(items: Sequence[str]) -> str:
    items = [i for i in items if i]
    if len(items) > _MAX_LABELS:
        return ", ".join(items[:_MAX_LABELS]) + f" and {len(items) - _MAX_LABELS} more"
    return ", ".join(items)


def _describe_axes(ax: Any) -> str:
    title = ax.get_title()
    if ax.get_images():
        return f"image titled {title}" if title else "image"
    bar_sets = [c for c in ax.containers if isinstance(c, BarContainer)]
    bars = [p for c in bar_sets for p in c.patches]
    xlabel, ylabel = ax.get_xlabel(), ax.get_ylabel()
    if bars:
        horizontal = getattr(bar_sets[0], "orientation", None) == "horizontal"
        names = [t.get_text() for t in (ax.get_yticklabels() if horizontal
                                        else ax.get_xticklabels())]
        values = [b.get_width() if horizontal else b.get_height() for b in bars]
        if len(names) == len(values):
            names = [f"{n} {readable(float(v))}" for n, v in zip(names, values, strict=True)]
        what = xlabel if horizontal else ylabel
        text = f"bars of {what or 'values'}: {_listed(names)}"
    else:
        lines = ax.get_lines()
        _, labels = ax.get_legend_handles_labels()
        text = f"{ylabel or 'values'} against {xlabel or 'position'}"
        if labels:
            text += f", one line each for {_listed(labels)}"
        elif len(lines) > 1:
            text += f", {len(lines)} lines"
    return f"{title}: {text}" if title else text


def describe_figure(fig: Figure) -> str:
    """Alt text for ``fig`` from what it draws: its title, each panel's title, axis labels,
    legend entries or bar labels, and how many images a grid holds (chapter 3).

    ``"MNIST on cpu. Two panels: loss against epoch, one line each for train, val; acc
    against epoch, ..."``. Give your own with :func:`set_alt` where these say too little.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"describe_figure takes a matplotlib Figure, got {type(fig).__name__}")
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    axes = [ax for ax in fig.axes if ax.get_visible() and (ax.axison or ax.get_images())]
    images = [ax for ax in axes if ax.get_images()]
    parts = [suptitle] if suptitle else []
    if images and len(images) == len(axes) and len(images) > 1:
        titles = [ax.get_title() for ax in images]
        grid = f"A grid of {len(images)} images"
        parts.append(f"{grid}, titled {_listed(titles)}" if any(titles) else grid)
    elif len(axes) == 1:
        parts.append(_describe_axes(axes[0]))
    elif axes:
        parts.append(f"{len(axes)} panels: " + "; ".join(_describe_axes(ax) for ax in axes))
    text = ". ".join(p.rstrip(".") for p in parts if p)
    return (text or "An empty figure") + "."


def set_alt(fig: Figure, alt: str) -> Figure:
    """Give ``fig`` the alt text ``alt`` (a sentence saying what it shows) for when it is
    displayed, instead of the one :func:`describe_figure` writes; returns the figure
    (chapter 3)."""
    if not isinstance(fig, Figure):
        raise TypeError(f"set_alt takes a matplotlib Figure, got {type(fig).__name__}")
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"alt must be a sentence saying what the figure shows, not {alt!r}")
    _ALT[fig] = alt.strip()
    return fig


def figure_alt(fig: Figure) -> str:
    """The alt text ``fig`` is shown with: the one :func:`set_alt` gave, else
    :func:`describe_figure`'s (chapter 3)."""
    return _ALT.get(fig) or describe_figure(fig)


def install_alt_text(shell: Any = None) -> bool:
    """Make the Jupyter kernel's PNG output of every matplotlib figure carry its alt text in
    the output's metadata (``{"image/png": {"alt": ...}}``); ``plt.show()`` and a figure left
    at the end of a cell both go through it (chapter 3). Done when this module is imported in
    a kernel; returns False outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - the book's environments have IPython
            return False
        shell = get_ipython()
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    png = formatters["image/png"]
    if isinstance(png, _alt_formatter_class()):
        return True
    wrapped = _alt_formatter_class()(parent=shell.display_formatter)
    for name in ("type_printers", "deferred_printers", "singleton_printers"):
        getattr(wrapped, name).update(getattr(png, name))
    wrapped.enabled = png.enabled
    formatters["image/png"] = wrapped
    return True


_FORMATTER: list[type] = []


def _alt_formatter_class() -> type:
    if not _FORMATTER:
        from IPython.core.formatters import PNGFormatter

        class AltTextPNGFormatter(PNGFormatter):
            """IPython's PNG formatter, adding a figure's alt text to the output metadata."""

            def __call__(self, obj: Any) -> Any:
                result = super().__call__(obj)
                if result is None or not isinstance(obj, Figure):
                    return result
                data, metadata = result if isinstance(result, tuple) else (result, None)
                try:
                    alt = figure_alt(obj)
                except Exception:  # noqa: BLE001 - a figure is never lost for its alt text
                    alt = _fallback_alt(obj)
                return data, {**(metadata or {}), "alt": alt}

        _FORMATTER.append(AltTextPNGFormatter)
    return _FORMATTER[0]


def _fallback_alt(fig: Figure) -> str:
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    return "A figure" + (f" titled {_listed(titles)}." if titles else " without a title.")


def show_figure(fig: Figure, alt: str | None = None) -> None:
    """Show ``fig`` with alt text (``alt``, else :func:`describe_figure`'s) and close it
    (chapter 3). In a notebook the PNG output carries the alt text; elsewhere it is
    ``plt.show()``."""
    if alt is not None:
        set_alt(fig, alt)
    if install_alt_text():
        from IPython.display import display

        display(fig)
        plt.close(fig)
    else:
        plt.show()


install_alt_text()
