"""Alt text for every figure (issue 30, item 9): helpers.plotting writes it from the figure,
the kernel's PNG output carries it, and the book's Sphinx extension puts it on the page."""

from __future__ import annotations

import base64
import hashlib
import sys

import matplotlib.pyplot as plt
import nbformat
import pandas as pd
import pytest
import torch
from docutils import nodes
from docutils.utils import new_document

from helpers import plotting
from tests.conftest import ROOT
from tests.support import execute_as_a_reader

sys.path.insert(0, str(ROOT / "_ext"))
import figure_alt  # noqa: E402  (the book's Sphinx extension, loaded as Sphinx loads it)


def test_bars_name_their_labels_values_and_unit() -> None:
    fig = plotting.plot_timings({"hand-written loop": 1.2, "Accelerate": 0.7},
                                unit="seconds per epoch", title="MNIST CNN on cpu")
    assert plotting.describe_figure(fig) == (
        "MNIST CNN on cpu: bars of seconds per epoch: hand-written loop 1.20, Accelerate 0.700.")


def test_bars_with_error_whiskers() -> None:
    fig = plotting.plot_timings({"a": 1.0, "b": 2.0}, errors={"a": 0.1, "b": 0.2},
                                unit="s", title="Two")
    assert plotting.describe_figure(fig) == "Two: bars of s: a 1.00, b 2.00."


def test_panels_lines_and_grids() -> None:
    history = pd.DataFrame({"epoch": [1, 2], "train_loss": [1, .5], "val_loss": [1, .6],
                            "train_acc": [.5, .7], "val_acc": [.5, .8], "best": [False, True]})
    alt = plotting.describe_figure(plotting.plot_history(history, title="MNIST on cpu"))
    assert alt.startswith("MNIST on cpu. 2 panels: loss against epoch, one line each for "
                          "train, val"), alt
    grid = plotting.show_images(torch.zeros(10, 1, 4, 4), titles=list("0123456789"))
    assert plotting.describe_figure(grid) == ("A grid of 10 images, titled 0, 1, 2, 3, 4, 5, "
                                              "6, 7 and 2 more.")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    ax.plot([1, 2], [4, 3])
    ax.set(xlabel="step", ylabel="loss")
    assert plotting.describe_figure(fig) == "loss against step, 2 lines."


def test_an_explicit_alt_wins_and_is_checked() -> None:
    fig, _ = plt.subplots()
    assert plotting.figure_alt(plotting.set_alt(fig, " Loss falls. ")) == "Loss falls."
    with pytest.raises(ValueError, match="sentence"):
        plotting.set_alt(fig, " ")
    with pytest.raises(TypeError, match="Figure"):
        plotting.describe_figure("fig.png")


#: One kernel for both kernel tests (a kernel start with torch costs ~7 CPU-s): first a
#: chapter's setup cell in the fresh kernel, as a chapter runs it; then helpers.plotting is
#: forgotten (out of sys.modules, IPython's own PNG formatter back, a figure shown without alt
#: text to prove it) and imported alone, as a notebook without the setup cell does.
KERNEL_CELLS = {
    "setup": (
        "import sys\nimport helpers\ndevice = helpers.chapter_setup(chapter=4, needs='cpu')\n"
        "assert 'helpers.plotting' in sys.modules",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([3, 2, 1])\n"
        "ax.set(title='Loss', xlabel='step', ylabel='MSE loss')\nplt.show()",
        "fig, ax = plt.subplots()\n_ = ax.plot([1, 2], label='cpu')\n_ = ax.legend()",
    ),
    "forgotten": (
        "from IPython.core.formatters import PNGFormatter\nshell = get_ipython()\n"
        "wrapped = shell.display_formatter.formatters['image/png']\n"
        "plain = PNGFormatter(parent=shell.display_formatter)\n"
        "for name in ('type_printers', 'deferred_printers', 'singleton_printers'):\n"
        "    getattr(plain, name).update(getattr(wrapped, name))\n"
        "plain.enabled = wrapped.enabled\nshell.display_formatter.formatters['image/png'] = plain\n"
        "del sys.modules['helpers.plotting'], helpers.plotting\nplt.close('all')\n"
        "%reset -f\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
        "ax.plot([1, 2], [2, 1])\nax.set(title='Loss', xlabel='step', ylabel='loss')\nplt.show()",
    ),
    "import": (
        "import helpers.plotting\nimport matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\nax.plot([1, 2], [2, 1])\nax.set(title='Loss', "
        "xlabel='step', ylabel='loss')\nplt.show()",
        "fig = helpers.plotting.plot_timings({'a': 1.0, 'b': 2.0})\n"
        "_ = helpers.plotting.set_alt(fig, 'Two bars.')",
        "helpers.plotting.show_figure(plt.subplots()[0], alt='Empty axes.')",
    ),
}


@pytest.fixture(scope="module")
def kernel_alts() -> dict[str, list[list[str | None]]]:
    """Each part's cells' PNG outputs' alt texts, from one kernel run of KERNEL_CELLS."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for part in KERNEL_CELLS.values() for src in part]
    execute_as_a_reader(nb)
    alts = [[out.metadata.get("image/png", {}).get("alt") for out in cell.outputs
             if "image/png" in out.get("data", {})] for cell in nb.cells]
    found, at = {}, 0
    for part, cells in KERNEL_CELLS.items():
        found[part], at = alts[at:at + len(cells)], at + len(cells)
    return found


def test_a_kernels_figure_output_carries_its_alt_text(kernel_alts) -> None:
    # a figure made with matplotlib alone, shown by plt.show(), after the module is imported;
    # one with an explicit alt, shown at the end of the cell by the inline backend; one shown
    # by show_figure (the kernel's helpers.plotting imported afresh, see kernel_alts)
    assert kernel_alts["forgotten"] == [[None]], "the module's formatter was not taken out"
    assert kernel_alts["import"] == [["Loss: loss against step."], ["Two bars."],
                                     ["Empty axes."]]


def _png_output(data: bytes, alt: str | None) -> dict:
    meta = {"image/png": {"alt": alt}} if alt else {}
    return {"output_type": "display_data", "metadata": meta,
            "data": {"image/png": base64.b64encode(data).decode()}}


def test_the_extension_sets_alt_on_the_pages_image_by_the_pngs_hash() -> None:
    notebook = {"cells": [{"cell_type": "code", "outputs": [_png_output(b"one", "One plot."),
                                                             _png_output(b"two", None)]}]}
    alts = figure_alt.png_alt_texts(notebook)
    one = hashlib.sha256(b"one").hexdigest()
    assert alts == {one: "One plot."}
    doc = new_document("page")
    doc += nodes.image(uri=f"../_build/jupyter_execute/{one}.png")
    doc += nodes.image(uri="other.png")
    doc += nodes.image(uri=f"{one}.png", alt="given")
    assert figure_alt.set_alt_texts(doc, alts) == 1
    assert [img.get("alt") for img in doc.findall(nodes.image)] == ["One plot.", None, "given"]


def test_a_chapters_setup_gives_matplotlibs_own_figures_alt_text(kernel_alts) -> None:
    # chapter 4 drew its first figure with matplotlib alone, before anything imported
    # helpers.plotting, and its page showed the image's file path; chapter_setup (every
    # chapter's setup cell) installs the alt text in the kernel
    alts = kernel_alts["setup"]
    assert alts == [[], ["Loss: MSE loss against step."],
                    ["values against position, one line each for cpu."]], alts
