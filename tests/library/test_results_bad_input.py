"""Bad input for the public functions of helpers.results, called as a reader would call them:
each case ends in an error that names the bad value and says what to do, or in a correct
result (an empty table, with one line saying so where something is shown)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from helpers import results
from tests.support import FIGURE, result_doc, write_result

# -- the folder: argument and $BOOK_RESULTS_DIR ---------------------------------------------

@pytest.mark.parametrize("make, error, words", [
    (lambda tmp: tmp / "no-such-folder", FileNotFoundError, "no such folder"),
    (lambda tmp: write_result(tmp, result_doc(), "a-file.json"), NotADirectoryError,
     "is a file, not a folder"),
], ids=["missing", "a file"])
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_named_folder_that_is_not_a_folder_is_named(tmp_path, monkeypatch, make, error,
                                                      words, how):
    bad = make(tmp_path)
    if how == "argument":
        with pytest.raises(error, match=words) as info:
            results.load_results(bad)
    else:
        monkeypatch.setenv("BOOK_RESULTS_DIR", str(bad))
        with pytest.raises(error, match=words) as info:
            results.load_results()
        assert "$BOOK_RESULTS_DIR" in str(info.value)
    assert str(bad) in str(info.value) and "results/" in str(info.value)


@pytest.mark.parametrize("bad", [3, 2.5, ["results"], {"dir": "results"}, b"results"],
                         ids=["int", "float", "list", "dict", "bytes"])
def test_a_folder_of_the_wrong_type_is_refused(bad):
    with pytest.raises(TypeError, match="directory must be a folder path"):
        results.load_results(bad)


@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "blank"])
def test_an_empty_environment_variable_counts_as_unset(monkeypatch, value):
    monkeypatch.delenv("BOOK_RESULTS_DIR", raising=False)
    default = results.results_dir()
    monkeypatch.setenv("BOOK_RESULTS_DIR", value)
    assert results.results_dir() == default
    assert len(results.load_results()) == len(list(default.glob("*.json")))


def test_a_home_relative_folder_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mine").mkdir()
    write_result(tmp_path / "mine", result_doc(), "gpu-x1.json")
    monkeypatch.setenv("BOOK_RESULTS_DIR", "~/mine")
    assert results.results_dir() == tmp_path / "mine"
    assert [d["machine"]["slug"] for d in results.load_results()] == ["gpu-x1"]
    assert len(results.load_results("~/mine")) == 1


def test_an_empty_folder_gives_no_files_and_the_tables_say_so(tmp_path, capsys):
    assert results.load_results(tmp_path) == []
    assert results.committed(directory=tmp_path).empty
    assert results.show_committed("matmul", directory=tmp_path).empty
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "No committed GPU results for the 'matmul' workload yet" in out[0]


def test_a_folder_named_like_a_result_file_is_not_read(tmp_path):
    (tmp_path / "folder.json").mkdir()
    write_result(tmp_path, result_doc(), "gpu-x1.json")
    assert [Path(d["_path"]).name for d in results.load_results(tmp_path)] == ["gpu-x1.json"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="file permissions do not stop root")
def test_an_unreadable_folder_is_named(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        with pytest.raises(PermissionError, match="cannot list the result folder"):
            results.load_results(folder)
    finally:
        folder.chmod(0o755)


# -- the files ------------------------------------------------------------------------------

FILE_CASES = {
    "not JSON": ("{not json", "is not valid JSON"),
    "empty": ("", "is not valid JSON"),
    "a JSON list": ([result_doc()], "holds a JSON list, not an object"),
    "a JSON number": (3, "holds a JSON int, not an object"),
    "no keys": ({}, r"lacks \['date', 'figures', 'machine', 'schema_version'\]"),
    "no figures": ({k: v for k, v in result_doc().items() if k != "figures"},
                   r"lacks \['figures'\]"),
    "schema 7": (result_doc(schema_version=7), "has schema version 7"),
    "schema '2' as text": (result_doc(schema_version="2"), "has schema version '2'"),
    "schema null": (result_doc(schema_version=None), "has schema version None"),
    "machine a string": (result_doc(machine="gpu"), "'machine' must be an object"),
    "machine without slug": (result_doc(machine={"device_name": "x", "gpu_count": 0}),
                             "'machine' must be an object with slug"),
    "figures an object": (result_doc(figures={"a": 1}), "'figures' must be a list, not dict"),
    "figure lacking its unit": (result_doc(figures=[{k: v for k, v in FIGURE.items() if k != "unit"}]),
                                "figure 0 must be an object with"),
    "figure a number": (result_doc(figures=[3]), "figure 0 must be an object with"),
    "value as text": (result_doc(figures=[dict(FIGURE, value="1.5")]), "has value '1.5', not a number"),
    "value true": (result_doc(figures=[dict(FIGURE, value=True)]), "has value True, not a number"),
}


@pytest.mark.parametrize("content, words", FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_file_that_is_not_a_result_file_is_named(tmp_path, content, words):
    path = write_result(tmp_path, content, "bad.json")
    write_result(tmp_path, result_doc(), "good.json")
    with pytest.raises(ValueError, match=words) as info:
        results.load_results(tmp_path)
    assert str(path) in str(info.value)


def test_a_file_that_cannot_be_decoded_is_named(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(result_doc(command="python -m bench # caf\u00e9"),
                                ensure_ascii=False)
                     .encode("latin-1"))
    with pytest.raises(ValueError, match="cannot be read") as info:
        results.load_results(tmp_path)
    assert str(path) in str(info.value) and "move it out of the folder" in str(info.value)


def test_a_dangling_link_is_skipped(tmp_path):
    (tmp_path / "gone.json").symlink_to(tmp_path / "elsewhere.json")
    write_result(tmp_path, result_doc(), "good.json")
    # a link to nothing is not a file: it is skipped, and the real file is read
    assert [Path(d["_path"]).name for d in results.load_results(tmp_path)] == ["good.json"]


def test_a_file_the_system_refuses_to_read_is_named(tmp_path, monkeypatch):
    # as root, permissions stop nothing: the refusal is made to happen
    path = write_result(tmp_path, result_doc(), "locked.json")
    real = Path.read_text

    def refuse(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ValueError, match="cannot be read.*Permission denied") as info:
        results.load_results(tmp_path)
    assert str(path) in str(info.value) and "make it readable" in str(info.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="file permissions do not stop root")
def test_an_unreadable_file_is_named(tmp_path):
    path = write_result(tmp_path, result_doc(), "locked.json")
    path.chmod(0)
    try:
        with pytest.raises(ValueError, match="cannot be read") as info:
            results.load_results(tmp_path)
        assert str(path) in str(info.value)
    finally:
        path.chmod(0o644)


# -- workload names -------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 3, "", "  ", ["matmul"]],
                         ids=["None", "int", "empty", "blank", "list"])
def test_show_committed_refuses_what_is_not_a_workload_name(tmp_path, bad):
    with pytest.raises(TypeError, match="workload must be a workload's name such as 'matmul'"):
        results.show_committed(bad, directory=tmp_path)


@pytest.mark.parametrize("bad", [3, "", ["matmul"]], ids=["int", "empty", "list"])
def test_committed_refuses_what_is_not_a_workload_name(tmp_path, bad):
    with pytest.raises(TypeError, match=r"or None for every workload"):
        results.committed(bad, directory=tmp_path)


def test_an_unknown_workload_gives_an_empty_table_and_names_the_known_ones(tmp_path, capsys):
    write_result(tmp_path, result_doc(), "gpu-x1.json")
    assert results.show_committed("matmull", directory=tmp_path).empty
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "'matmull'" in out[0] and "The committed files report: matmul." in out[0]
    table = results.committed("matmull", directory=tmp_path)
    assert table.empty and "value" in table.columns
    docs = results.load_results(tmp_path)
    assert results.figures_table(docs, "matmull").empty
    assert results.plot_workload(docs, "matmull") is None
    assert "nothing in the result files to compare" in results.plot_alt(docs, "matmull")


# -- the appendix's table and plot functions, given something other than load_results() ------

DOCS_TAKERS = [results.machine_labels, results.machines_table, results.figures_table,
               results.workloads, results.peak_share_table, results.speedup_table,
               lambda docs: results.plot_workload(docs, "matmul"),
               lambda docs: results.missing_figures(docs, pd.DataFrame())]
NOT_DOCS = {"a folder as text": "results/", "a Path": Path("results"),
            "one document": result_doc(),
            "None": None, "numbers": [1, 2], "documents without figures": [{"machine": {}}]}


@pytest.mark.parametrize("bad", NOT_DOCS.values(), ids=NOT_DOCS.keys())
@pytest.mark.parametrize("function", DOCS_TAKERS,
                         ids=["machine_labels", "machines_table", "figures_table", "workloads",
                              "peak_share_table", "speedup_table", "plot_workload",
                              "missing_figures"])
def test_the_tables_ask_for_what_load_results_returns(function, bad):
    with pytest.raises(TypeError, match=r"load_results\("):
        function(bad)


@pytest.mark.parametrize("function", [results.machines_table, results.figures_table,
                                      results.peak_share_table, results.speedup_table])
def test_no_documents_give_empty_tables(function):
    assert function([]).empty


def test_no_documents_give_no_workloads_and_no_plot():
    assert results.workloads([]) == [] and results.machine_labels([]) == []
    assert results.plot_workload([], "matmul") is None


@pytest.mark.parametrize("bad", [None, {}, "gpu-x1", {"machine": "gpu"}],
                         ids=["None", "empty dict", "a slug", "machine as text"])
def test_machine_label_and_stamp_ask_for_one_result_document(bad):
    with pytest.raises(TypeError, match="expected one result document"):
        results.machine_label(bad)
    with pytest.raises(TypeError, match="expected one result document"):
        results.machine_stamp(bad)


def test_a_machine_record_without_optional_keys_still_gets_a_label():
    # tools/gpu_report.py labels a bare machine record, before any result file exists
    assert results.machine_label({"machine": {"device_name": "Some CPU", "gpu_count": 0}}) \
        == "Some CPU (? cores, no GPU)"
    stamp = results.machine_stamp({"machine": {"device_name": "GPU", "gpu_count": 2}})
    assert stamp.startswith("GPU x2") and "torch ?" in stamp and "book commit unknown" in stamp


def test_missing_figures_asks_for_the_figures_table():
    with pytest.raises(TypeError, match="figures_table"):
        results.missing_figures([result_doc()], table=None)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_plot_workload_refuses_a_bad_row_limit(bad):
    with pytest.raises(ValueError, match="max_rows must be a positive int"):
        results.plot_workload([result_doc()], "matmul", max_rows=bad)


@pytest.mark.parametrize("bad", [None, "", "  ", 3], ids=["None", "empty", "blank", "int"])
def test_show_figure_asks_for_alt_text(bad):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    try:
        with pytest.raises(ValueError, match="alt must be a sentence"):
            results.show_figure(fig, bad)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("value, spread, noisy", [
    (1.0, None, False), (1.0, math.nan, False), (0.0, 1.0, False), (1.0, 0.1, False),
    (1.0, 0.11, True), (-2.0, 0.5, True)],
    ids=["no spread", "nan spread", "zero value", "at the threshold", "above", "negative value"])
def test_is_noisy_at_its_edges(value, spread, noisy):
    assert results.is_noisy(value, spread) is noisy


@pytest.mark.parametrize("unit, label", [
    ("s", "time (s): shorter is faster"), ("ms", "time (ms): shorter is faster"),
    ("images/s", "rate (images/s): longer is faster"), ("x", "ratio (times)"),
    ("MiB", "memory (MiB)"), ("1", None), ("MSE", None), ("fraction", None), ("lines", None)])
def test_axis_labels_name_the_unit_or_leave_the_figure_to_the_table(unit, label):
    assert results.axis_label(unit) == label
