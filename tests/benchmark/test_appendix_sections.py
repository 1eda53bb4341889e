"""The benchmark and the appendix agree, checked here rather than on the appendix's page: every
workload module of the benchmark imports, every workload the benchmark runs has a section in
the appendix, in the same order, and each committed workload is plotted where it can be.
(That the appendix, like every chapter, imports neither the benchmark nor the tools is
tests/book/test_layout.py's check.)"""

from __future__ import annotations

import re

import nbformat

from bench import __main__ as runner
from helpers import results
from tests.conftest import ROOT

APPENDIX = ROOT / "chapters" / "appendix_results.ipynb"


def appendix_code() -> list[str]:
    nb = nbformat.read(APPENDIX, as_version=4)
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def sections() -> list[str]:
    """The workloads the appendix plots, in page order (its ``show_workload("...")`` calls)."""
    calls = [m for source in appendix_code()
             for m in re.findall(r'^show_workload\("(\w+)"\)', source, re.M)]
    for source in appendix_code():  # or one loop over the names: for name in ("a", ...):
        for names in re.findall(r'^for name in \(([^)]*)\):\n\s+show_workload\(name\)',
                                source, re.M):
            calls += re.findall(r'"(\w+)"', names)
    assert calls, "the appendix plots no workload"
    return calls


def test_every_workload_module_of_the_benchmark_imports():
    assert runner.load_workload_modules() == []


def test_every_workload_the_benchmark_runs_has_a_section_in_the_appendix():
    runner.load_workload_modules()
    assert sections() == [w.name for w in runner.registered()]


def test_every_committed_workload_the_benchmark_runs_is_plotted_where_it_can_be():
    runner.load_workload_modules()
    benchmark = {w.name for w in runner.registered()}
    docs = results.load_results(ROOT / "results")
    reported = set(results.workloads(docs))
    assert reported & benchmark <= set(sections())
    for name in reported & benchmark:
        fig = results.plot_workload(docs, name)
        assert (fig is None) == (not results.plot_panels(docs, name)), name
