"""helpers.training.progress: a progress bar the built book can show (issue 30, item 9).

tqdm.auto's ipywidgets bar is blank on a static page (the executed notebook holds no widget
state). ``progress`` writes tqdm's text bar on one notebook output line, updated in place, so
the executed notebook keeps the final state: these tests execute a notebook in a real kernel
and read what it stored.
"""

from __future__ import annotations

import nbformat
import pytest

from helpers.training import progress
from tests.support import execute_as_a_reader
from tools.notebook import output_problems

CELLS = [
    "from helpers.training import progress\nimport time",
    # an epoch bar and, inside it, a batch bar that leaves nothing of its own (leave=False)
    "for epoch in progress(range(3), desc='epochs'):\n"
    "    for batch in progress(range(50), desc='batches', leave=False):\n"
    "        time.sleep(0.002)\nprint('done')",
    "for step in progress(range(40), desc='steps', leave=False):\n    time.sleep(0.003)",
]


@pytest.fixture(scope="module")
def executed() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    execute_as_a_reader(nb)
    return nb


def _lines(cell) -> list[str]:
    return [out["data"]["text/plain"] for out in cell.outputs
            if out.output_type == "display_data"]


def test_a_cell_keeps_one_line_with_the_bars_final_state(executed) -> None:
    lines = _lines(executed.cells[1])
    assert len(lines) == 1, executed.cells[1].outputs
    assert lines[0].startswith("epochs: 100%") and "3/3" in lines[0], lines
    assert len(lines[0]) <= 88, "within the book's 88 columns"
    assert [o.text for o in executed.cells[1].outputs if o.output_type == "stream"] == ["done\n"]


def test_a_bar_that_does_not_stay_still_shows_its_final_count(executed) -> None:
    assert _lines(executed.cells[2]) == [_lines(executed.cells[2])[0]]
    assert "40/40" in _lines(executed.cells[2])[0]


def test_no_widget_and_nothing_on_stderr(executed) -> None:
    for cell in executed.cells:
        for out in cell.outputs:
            assert "application/vnd.jupyter.widget-view+json" not in out.get("data", {})
    assert output_problems(executed) == []


def test_outside_a_notebook_it_is_tqdms_terminal_bar(capsys) -> None:
    assert list(progress(range(3), desc="x")) == [0, 1, 2]
    assert "x: 100%" in capsys.readouterr().err
    assert list(progress(range(2), disable=True)) == [0, 1]


@pytest.fixture
def page_line(monkeypatch) -> list[str]:
    """The states a notebook's progress line shows, without a kernel: display is faked."""
    import IPython.display

    import helpers.training as training

    shown: list[str] = []

    class Handle:
        def update(self, obj, raw) -> None:
            shown.append(obj["text/plain"])

    def display(obj, raw, display_id):
        shown.append(obj["text/plain"])
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    line = training._ProgressLine()
    monkeypatch.setattr(training, "_notebook_line", lambda: line)
    return shown


def test_a_nested_bar_shows_no_cursor_moves(page_line) -> None:
    # tqdm moves the terminal's cursor up ("\x1b[A") after drawing a bar at position 1;
    # the line showed that escape as its text between two states of the inner bar
    for _ in progress(range(2), desc="epochs", mininterval=0):
        for _ in progress(range(3), desc="batches", leave=False, mininterval=0):
            pass
    assert page_line and all("\x1b" not in s and s.strip() for s in page_line), page_line
    assert any(s.startswith("batches: 100%") for s in page_line)
    assert page_line[-1].startswith("epochs: 100%") and "2/2" in page_line[-1]


def test_an_exception_mid_loop_leaves_the_count_reached(page_line) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        for i in progress(range(10), desc="steps", mininterval=0):
            if i == 3:
                raise RuntimeError("boom")
    assert "3/10" in page_line[-1], page_line


def test_empty_and_unsized_iterables(page_line) -> None:
    assert list(progress([], desc="none")) == []
    assert page_line[-1].startswith("none: 0it"), page_line
    assert list(progress((i for i in range(5)), desc="gen")) == list(range(5))
    assert page_line[-1].startswith("gen: 5it"), page_line


def test_a_count_is_refused_with_what_to_write_instead() -> None:
    with pytest.raises(TypeError, match=r"not int: for a count n, progress\(range\(n\)\)"):
        progress(5)


def test_a_sequence_with_getitem_only_is_accepted(capsys) -> None:
    class Squares:  # a map-style dataset: __getitem__ and __len__, no __iter__
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> int:
            if i >= 3:
                raise IndexError(i)
            return i * i

    assert list(progress(Squares(), desc="ds")) == [0, 1, 4]


def test_a_file_given_is_where_the_bar_goes(page_line) -> None:
    import io

    out = io.StringIO()
    assert list(progress(range(2), desc="to file", file=out)) == [0, 1]
    assert "to file: 100%" in out.getvalue() and page_line == []
