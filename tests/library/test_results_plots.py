"""The appendix's plots are honest: units on the axes, noisy bars hatched, a panel only where
there is something to compare, titles true for the machines shown, alt text that says so."""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers import results
from helpers.timing import NOISY_SPREAD
from tests.conftest import ROOT
from tests.support import figure, result_doc


def fig_(name, value, unit, spread=None, workload="recipes"):
    return figure(workload=workload, chapter=12, name=name, value=value, unit=unit, spread=spread)


def test_one_machine_is_titled_as_one_and_only_comparable_panels_are_drawn():
    doc = result_doc("a", [fig_("plain_step_ms", 10.0, "ms", 0.1),
                            fig_("amp_step_ms", 5.0, "ms", 0.1),
                            fig_("w0", 2.0, "1"), fig_("b", 10.0, "1"),
                            fig_("final_loss", 4.0, "MSE"), fig_("accuracy", 0.98, "fraction"),
                            fig_("compile_seconds", 30.0, "s")])
    assert results.plot_panels([doc], "recipes") == ["ms"]  # one bar in s: nothing to compare
    fig = results.plot_workload([doc], "recipes")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "time (ms): shorter is faster"
    assert ax.get_title() == "recipes: one machine (whiskers: spread)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["plain_step_ms", "amp_step_ms"]
    assert "one machine, Device a x1" in results.plot_alt([doc], "recipes")


def test_two_machines_are_side_by_side_and_a_figure_one_lacks_leaves_its_slot_empty():
    a = result_doc("a", [fig_("plain_step_ms", 10.0, "ms"), fig_("bf16_step_ms", 4.0, "ms")])
    b = result_doc("b", [fig_("plain_step_ms", 30.0, "ms")])  # a T4: no bf16 recipe
    fig = results.plot_workload([a, b], "recipes")
    (ax,) = fig.axes
    assert ax.get_title().startswith("recipes: 2 machines side by side")
    assert len([p for p in ax.patches if p.get_width() > 0]) == 3  # no zero bar for b
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["Device a x1", "Device b x1"]


def test_a_single_figure_per_machine_is_compared_across_two_machines():
    a = result_doc("a", [fig_("gpu_seconds", 1.0, "s", workload="regression")])
    b = result_doc("b", [fig_("gpu_seconds", 2.0, "s", workload="regression")])
    assert results.plot_workload([a], "regression") is None
    assert results.plot_workload([a, b], "regression") is not None


def test_noisy_bars_are_hatched_and_the_legend_says_what_hatching_means():
    noisy = 10.0 * NOISY_SPREAD * 1.5
    doc = result_doc("a", [fig_("plain_step_ms", 10.0, "ms", noisy),
                            fig_("amp_step_ms", 5.0, "ms", 0.01)])
    fig = results.plot_workload([doc], "recipes")
    bars = [p for p in fig.axes[0].patches if p.get_width() > 0]
    assert [bool(b.get_hatch()) for b in bars] == [True, False]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"noisy: spread above {NOISY_SPREAD:.0%} of the value" in legend
    assert "Hatched as noisy: plain_step_ms (Device a x1)" in results.plot_alt([doc], "recipes")
    quiet = results.plot_workload([result_doc("a", [fig_("x_ms", 1.0, "ms", 0.01),
                                                     fig_("y_ms", 2.0, "ms")])], "recipes")
    assert not any("noisy" in t.get_text() for t in quiet.legends[0].get_texts())


def test_a_wide_span_gets_a_log_axis_that_says_so():
    doc = result_doc("a", [fig_("cpu_rate", 1.0, "GFLOP/s"), fig_("gpu_rate", 1e4, "GFLOP/s")])
    ax = results.plot_workload([doc], "recipes").axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel().endswith(", log scale")


def test_the_committed_files_show_no_unitless_panel():
    docs = results.load_results(ROOT / "results")
    for name in results.workloads(docs):
        fig = results.plot_workload(docs, name)
        for ax in fig.axes if fig is not None else []:
            label = ax.get_xlabel()
            assert label and "no unit" not in label and "(" in label, (name, label)


def test_show_figure_displays_the_png_and_an_img_with_alt_text(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw: shown.append((data, raw)))
    fig = plt.figure()
    results.show_figure(fig, 'Bars of "x" & y')
    ((data, raw),) = shown
    assert raw is True and data["image/png"]
    assert 'alt="Bars of &quot;x&quot; &amp; y"' in data["text/html"]
    assert data["image/png"] in data["text/html"]
    assert not plt.fignum_exists(fig.number)  # closed: it is not shown a second time
