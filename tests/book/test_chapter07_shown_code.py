"""Chapter 7 shows some code in "Going deeper" dropdowns and runs it in hidden cells: the
code a reader sees there is exactly the code the page runs and checks. The mp.spawn
dropdown's code is run here instead (the page checks the same three facts from its full
DDP run's ``--ddp-facts``, which saves two processes on every execution of the page)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT
from tests.support import check_buffer_and_sync_bn_facts

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


OLDEST_PYTHON = ROOT / ".venv-oldest" / "bin" / "python"
# The dropdown's code run by another interpreter (the oldest supported torch): the reports,
# and the fingerprint of a model seeded with 0, made by that torch, as the last line.
SPAWN_SCRIPT = """
import json, sys
from pathlib import Path

import torch

import helpers.ddp_mnist as ddp_script
from helpers.models import MnistCNN


def main():
    space = {"json": json, "workdir": Path(sys.argv[1]), "ddp_script": ddp_script}
    exec(compile(Path(sys.argv[2]).read_text(), "mp.spawn dropdown", "exec"), space)
    torch.manual_seed(0)
    print(json.dumps({"reports": space["reports"], "torch": torch.__version__,
                      "seed0": ddp_script.weights_fingerprint(MnistCNN())}))


if __name__ == "__main__":  # mp.spawn's children import this file again
    main()
"""


def _spawn_reports(torch_env: str, tmp_path, request) -> tuple[list[dict], str]:
    import subprocess

    _, _, shown = _shown_code(SPAWN)
    if torch_env == "pinned":  # in this process: one interpreter fewer to start
        import torch

        import helpers.ddp_mnist as ddp_script
        from helpers.models import MnistCNN

        space = {"json": json, "workdir": tmp_path, "ddp_script": ddp_script}
        exec(compile(shown, "mp.spawn dropdown", "exec"), space)  # noqa: S102
        torch.manual_seed(0)
        return space["reports"], ddp_script.weights_fingerprint(MnistCNN())
    if not OLDEST_PYTHON.exists():
        message = f"{OLDEST_PYTHON.relative_to(ROOT)} is missing: run `make oldest-venv` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    (tmp_path / "dropdown.py").write_text(shown)
    (tmp_path / "run.py").write_text(SPAWN_SCRIPT)
    run = subprocess.run([str(OLDEST_PYTHON), str(tmp_path / "run.py"), str(tmp_path),
                          str(tmp_path / "dropdown.py")], cwd=tmp_path, text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    last = json.loads(run.stdout.strip().splitlines()[-1])
    import torch

    assert last["torch"] != torch.__version__, "the oldest torch ran it, not this one"
    return last["reports"], last["seed0"]


@pytest.mark.slow
@pytest.mark.parametrize("torch_env", ["pinned", "oldest"])
def test_the_mp_spawn_dropdown_runs_and_shows_what_it_says(torch_env, tmp_path, request):
    """The dropdown's code, exactly as shown, with mp.spawn: rank 0 saves, a barrier, both
    ranks load the same file; rank 0's buffers at every forward start; SyncBatchNorm
    refuses the CPU. (Moved here from tests/library/test_ddp_mnist.py, as strict.) On the
    pinned and on the oldest supported torch, as when the page itself ran it."""
    (r0, r1), seed0 = _spawn_reports(torch_env, tmp_path, request)
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["loaded"] == r1["loaded"], "every rank loaded rank 0's checkpoint"
    assert r0["loaded"] == seed0
    check_buffer_and_sync_bn_facts(r0, r1)
