"""Chapter 8 leads with what a CUDA GPU prints for each trap, and its checks hold there.

The first GPU run (H200, torch 2.11) printed, for three of the four mismatch traps, the
dispatcher's argument check ("... but got mat1 is on cuda:0, different from other tensors on
cpu (when checking argument in method wrapper_CUDA_addmm)"), not the TensorIterator wording
("found at least two devices") the page led with. Both templates are in libtorch_cpu of
2.9.1, 2.10, 2.11 and 2.14.1 (c10::impl::common_device_check_failure), and the wrappers'
names (wrapper_CUDA_addmm, wrapper_CUDA_nll_loss_forward) in libtorch_cuda of 2.9.1 and
2.14.1. The messages below are those the H200 printed, fed to the chapter's own check.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "08_device_pitfalls.ipynb"
GPU = torch.device("cuda", 0)

RECORDED = {  # trap -> what the H200 printed (executed/08_device_pitfalls.ipynb)
    "layer": "Expected all tensors to be on the same device, but got mat1 is on cuda:0, "
             "different from other tensors on cpu (when checking argument in method "
             "wrapper_CUDA_addmm)",
    "constant": "Expected all tensors to be on the same device, but found at least two "
                "devices, cuda:0 and cpu!",
    "weights": "Expected all tensors to be on the same device, but got weight is on cpu, "
               "different from other tensors on cuda:0 (when checking argument in method "
               "wrapper_CUDA_nll_loss_forward)",
    "metric": "Encountered different devices in metric calculation (see stacktrace for "
              "details). This could be due to the metric class not being on the same device "
              "as input. Instead of `metric=MulticlassAccuracy(...)` try to do "
              "`metric=MulticlassAccuracy(...).to(device)` where device corresponds to the "
              "device of the input.",
}


@pytest.fixture(scope="module")
def chapter():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (helper,) = [c for c in cells if "def assert_wording" in "".join(c["source"])]
    assert "remove-cell" in helper["metadata"]["tags"]
    namespace: dict = {}
    exec(compile("".join(helper["source"]), "assert_wording", "exec"), namespace)
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return namespace, prose, cells


@pytest.mark.parametrize("trap", sorted(RECORDED))
def test_the_check_accepts_what_the_gpu_printed(chapter, trap):
    namespace, _, _ = chapter
    namespace["assert_wording"](RECORDED[trap], trap, GPU)


def test_the_check_refuses_another_family_on_the_gpu(chapter):
    namespace, _, _ = chapter
    with pytest.raises(AssertionError):  # the wording the page once led with, for a layer
        namespace["assert_wording"](RECORDED["constant"], "layer", GPU)
    with pytest.raises(AssertionError):
        namespace["assert_wording"](RECORDED["layer"], "weights", GPU)


def test_the_page_quotes_each_gpu_wording_and_leads_with_the_layers(chapter):
    namespace, prose, cells = chapter
    flowing = " ".join(prose.split())  # the prose as it reads, whatever its line breaks
    for trap, wording in namespace["ON_CUDA"].items():
        quoted = wording.format(gpu=GPU)
        if trap == "metric":  # the page names torchmetrics' message by its start
            quoted = quoted.split(" (see")[0] + " ..."
        assert quoted in flowing, trap
    first_quote = re.search(r"```text\n(.*?)\n```", "".join(cells[0]["source"]), re.S)[1]
    assert first_quote == "RuntimeError: " + RECORDED["layer"]


def test_every_trap_checked_with_the_wording_it_gets(chapter):
    _, _, cells = chapter
    checks = "\n".join("".join(c["source"]) for c in cells
                       if "remove-cell" in c["metadata"].get("tags", []))
    used = re.findall(r'assert_wording\([^"]*"(\w+)", other\)', checks)
    assert sorted(used) == ["constant", "layer", "layer", "metric", "weights"], used


def test_meta_words_it_as_the_page_says(chapter):
    from torch import nn

    namespace, _, _ = chapter
    meta = torch.device("meta")
    error = None
    try:
        nn.Linear(16, 2)(torch.randn(4, 16, device=meta))
    except RuntimeError as err:
        error = str(err)
    namespace["assert_wording"](error, "layer", meta)
