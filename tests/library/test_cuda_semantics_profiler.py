"""Chapter 11's sentence on ``acc_events`` and its hidden check: which torch warns about a
profile opened without it.

The chapter said "torch 2.10 and 2.11 warn on every profile opened without it". Read in
torch/profiler/profiler.py: 2.10 and 2.11 call ``_warn_once`` (a module-level set: once per
process) in ``prepare_trace`` whenever ``acc_events`` is False, so at the first profile that
starts; 2.14.1 calls it only where ``self.profiler`` is already set, that is from a profile's
second cycle on (once per process too); 2.9 has no such warning. The check runs a one-cycle
profile and two two-cycle ones and compares their warnings with that table, on the torch
it runs on. Here: on the installed torch (pinned and oldest), and with each version's rule
faked, including a torch that does not behave as the table says, which fails."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.profiler.profiler as torch_profiler
from torch.profiler import ProfilerActivity, profile, schedule

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "11_cuda_semantics.ipynb"
FIRST_LINE = "# Check: which torch warns without acc_events"
MESSAGE = ("Warning: Profiler clears events at the end of each cycle. Only events from the "
           "current cycle will be reported. To keep events across cycles, set acc_events=True.")


def _check_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (cell,) = [c for c in cells if "".join(c["source"]).startswith(FIRST_LINE)]
    assert "remove-cell" in cell["metadata"].get("tags", [])
    return "".join(cell["source"])


def test_the_prose_names_what_the_check_checks() -> None:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    prose = " ".join("".join(c["source"]).replace("\n", " ") for c in cells
                     if c["cell_type"] == "markdown")
    assert ("torch 2.10 and 2.11 warn once per process, at the first profile started without "
            "it; 2.14 only once one reaches a second cycle; 2.9 never.") in prose
    assert "warn on every profile" not in prose


def test_the_check_holds_on_the_installed_torch(monkeypatch) -> None:
    if hasattr(torch_profiler, "_WARNINGS_SHOWN"):  # as in a fresh process (2.10 and later)
        monkeypatch.setattr(torch_profiler, "_WARNINGS_SHOWN", set())
    space = {"torch": torch, "profile": profile, "schedule": schedule,
             "ProfilerActivity": ProfilerActivity}
    exec(_check_cell(), space)  # noqa: S102 - the chapter's own cell
    release = tuple(int(p) for p in torch.__version__.split(".")[:2])
    if release in space["ACC_WARNINGS"]:
        assert space["acc_warnings"] == space["ACC_WARNINGS"][release]


def test_the_check_holds_when_the_cell_runs_again() -> None:
    """A reader reruns the cell (or the chapter) in one kernel: torch's once-per-process
    record (``_WARNINGS_SHOWN``, 2.10 and later) already holds the message, yet the check
    passes on its second run (it failed there on 2.14.1: (0, 0, 0))."""
    release = tuple(int(p) for p in torch.__version__.split(".")[:2])
    for _ in range(2):
        space = {"torch": torch, "profile": profile, "schedule": schedule,
                 "ProfilerActivity": ProfilerActivity}
        exec(_check_cell(), space)  # noqa: S102 - the chapter's own cell
        if release in space["ACC_WARNINGS"]:
            assert space["acc_warnings"] == space["ACC_WARNINGS"][release]


class _Plan(SimpleNamespace):
    pass


def _fake_profiler(rule: str, shown: set[str]):
    """A profile class that warns as one torch does: 'first' (2.10, 2.11: at the first
    profile started without acc_events), 'second' (2.14: at a profile's second cycle),
    'never' (2.9); each warning once per process (``shown``)."""

    class FakeProfile:
        def __init__(self, activities, schedule, acc_events=False) -> None:
            self.repeat, self.acc_events, self.steps = schedule.repeat, acc_events, 0

        def _prepare(self, cycle: int) -> None:
            due = {"first": True, "second": cycle >= 2, "never": False}[rule]
            if due and not self.acc_events and MESSAGE not in shown:
                shown.add(MESSAGE)
                warnings.warn(MESSAGE, stacklevel=2)

        def __enter__(self):
            self._prepare(1)
            return self

        def __exit__(self, *exc) -> None:
            pass

        def step(self) -> None:  # warm-up and active: two steps a cycle
            self.steps += 1
            if self.steps % 2 == 0 and self.steps < 2 * self.repeat:
                self._prepare(self.steps // 2 + 1)

    return FakeProfile


def _run_check(version: str, rule: str) -> tuple[int, int, int]:
    fake_torch = SimpleNamespace(__version__=version, ones=torch.ones)
    space = {"torch": fake_torch, "profile": _fake_profiler(rule, set()),
             "schedule": lambda **k: _Plan(**k), "ProfilerActivity": ProfilerActivity}
    exec(_check_cell(), space)  # noqa: S102 - the chapter's own cell
    return space["acc_warnings"]


@pytest.mark.parametrize(("version", "rule", "counts"), [
    ("2.9.1+cu128", "never", (0, 0, 0)),
    ("2.10.0", "first", (1, 0, 0)),
    ("2.11.0+cu130", "first", (1, 0, 0)),
    ("2.14.1+cu130", "second", (0, 1, 0)),
    ("2.12.0", "first", (1, 0, 0)),  # a release the prose does not name: not checked
])
def test_each_release_that_warns_as_the_prose_says_passes(version, rule, counts) -> None:
    assert _run_check(version, rule) == counts


@pytest.mark.parametrize(("version", "rule"), [
    ("2.11.0+cu130", "second"), ("2.14.1", "first"), ("2.9.0", "first"),
    ("2.10.0", "never"),
])
def test_a_release_that_warns_otherwise_fails_the_check(version, rule) -> None:
    with pytest.raises(AssertionError, match=version.replace("+", r"\+")):
        _run_check(version, rule)
