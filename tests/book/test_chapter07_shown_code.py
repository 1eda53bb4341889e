"""Chapter 7 shows some code in "Going deeper" dropdowns and runs it in hidden cells: the
code a reader sees there is exactly the code the page runs and checks. The mp.spawn
dropdown's code is run here instead (the page checks the same three facts from its full
DDP run's ``--ddp-facts``, which saves two processes on every execution of the page)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "07_data_parallel.ipynb"
HIDDEN_NOTE = re.compile(r"\A# .*\(hidden in the book\)\n")
MAGIC = re.compile(r"\A%%gpu_only.*\n")

# dropdown title -> how many hidden code cells after it run the code it shows, in order
SHOWN = {
    "Going deeper: the four steps by hand": 1,
    "Going deeper: the code of models A and B": 2,
}
SPAWN = "Going deeper: mp.spawn, a rank-0 checkpoint, buffers and SyncBatchNorm"


def _shown_code(title: str) -> tuple[list[dict], int, str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (at,) = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and f"````{{dropdown}} {title}\n" in "".join(c["source"])]
    (shown,) = re.findall(r"```python\n(.*?)\n```\n", "".join(cells[at]["source"]),
                          flags=re.S)
    return cells, at, shown


@pytest.mark.parametrize("title", SHOWN)
def test_the_dropdown_shows_the_code_the_page_runs(title):
    cells, at, shown = _shown_code(title)
    run = []
    for cell in cells[at + 1:at + 1 + SHOWN[title]]:
        assert cell["cell_type"] == "code" and "remove-cell" in cell["metadata"]["tags"]
        source = "".join(cell["source"])
        source = MAGIC.sub("", source)  # %%gpu_only runs the code where the GPUs exist
        assert HIDDEN_NOTE.match(source), "the hidden cell says it runs the dropdown's code"
        run.append(HIDDEN_NOTE.sub("", source))
    assert shown == "\n\n".join(run)


@pytest.mark.slow
def test_the_mp_spawn_dropdown_runs_and_shows_what_it_says(tmp_path):
    """The dropdown's code, exactly as shown, with mp.spawn: rank 0 saves, a barrier, both
    ranks load the same file; rank 0's buffers at every forward start; SyncBatchNorm
    refuses the CPU. (Moved here from tests/library/test_ddp_mnist.py, as strict.)"""
    import torch

    import helpers.ddp_mnist as ddp_script
    from helpers.models import MnistCNN

    _, _, shown = _shown_code(SPAWN)
    space = {"json": json, "workdir": tmp_path, "ddp_script": ddp_script}
    exec(compile(shown, "mp.spawn dropdown", "exec"), space)  # noqa: S102
    r0, r1 = space["reports"]
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["loaded"] == r1["loaded"], "every rank loaded rank 0's checkpoint"
    torch.manual_seed(0)
    assert r0["loaded"] == ddp_script.weights_fingerprint(MnistCNN())
    # At the start of every forward all ranks hold rank 0's buffers; after it, their own.
    starts = [r["running_mean_at_forward_start"] for r in (r0, r1)]
    ends = [r["running_mean_after_forward"] for r in (r0, r1)]
    assert len(starts[0]) == len(ends[0]) == 3
    assert starts[0] == starts[1]
    assert all(a != b for a, b in zip(*ends, strict=True))
    assert starts[1][1] == ends[0][0]
    assert r0["sync_bn_type"] == "SyncBatchNorm"
    refusal = "SyncBatchNorm expected input tensor to be on GPU"
    assert all(r["sync_bn_cpu_error"].startswith(refusal) for r in (r0, r1))
