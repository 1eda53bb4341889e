"""helpers.results reading result files (chapter 3, appendix): the folder they are read from,
show_committed's table and hardware stamps (one column per machine, GPU figures only, inside a
notebook as one display), broken files named, and files of older schema versions read."""

import types

import pytest

from helpers import results
from tests.support import FIGURE, execute_as_a_reader, figure, result_doc, write_result


def test_results_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_RESULTS_DIR", str(tmp_path))
    assert results.results_dir() == tmp_path


def test_results_dir_is_the_checkouts_folder_and_the_package_carries_a_copy(monkeypatch):
    monkeypatch.delenv("BOOK_RESULTS_DIR", raising=False)
    from tests.conftest import ROOT

    assert results.results_dir() == ROOT / "results"
    # helpers/_results is what the wheel ships (pyproject's package-data); in a checkout it
    # is the same folder, so an installed copy sees exactly the committed files
    packaged = sorted(p.name for p in results._PACKAGED.glob("*.json"))
    assert packaged == sorted(p.name for p in (ROOT / "results").glob("*.json")) != []


def test_committed_table_and_gpu_filter(tmp_path):
    write_result(tmp_path, result_doc("cpu-box", [dict(FIGURE, device="cpu", value=0.1)], gpu_count=0))
    mnist = dict(FIGURE, workload="mnist", name="images_per_s", unit="1/s")
    write_result(tmp_path, result_doc("gpu-h100", [FIGURE, mnist]))
    table = results.committed(directory=tmp_path)
    assert len(table) == 3
    assert set(results.committed("matmul", gpu_only=True, directory=tmp_path)["machine"]) == {"gpu-h100"}


def test_show_committed_prints_the_hardware_and_the_table(tmp_path, capsys):
    write_result(tmp_path, result_doc("gpu-h100", version=2))
    wide = results.show_committed("matmul", directory=tmp_path)
    out = capsys.readouterr().out
    assert "Device gpu-h100 x1, driver 580.1, CUDA 13.0, torch 2.14.1" in out
    assert "book commit abc1234def" in out
    assert wide.loc["fp32_tflops [TFLOP/s] on cuda:0", "Device gpu-h100 x1"] == 1.5
    # outside a notebook the table itself is printed, not only returned
    assert "fp32_tflops [TFLOP/s] on cuda:0" in out and "1.5" in out


def test_one_column_per_machine_even_for_the_same_gpu(tmp_path, capsys):
    name = "NVIDIA H100 80GB HBM3"
    write_result(tmp_path, result_doc("gpu-h100-x1", device_name=name))
    for slug, value in (("gpu-h100-x8", 1.6), ("gpu-h100-x8-other", 1.7)):
        write_result(tmp_path, result_doc(slug, [dict(FIGURE, value=value)], device_name=name,
                                          gpu_count=8))
    wide = results.show_committed("matmul", directory=tmp_path)
    assert len(wide.columns) == 3
    assert sorted(wide.iloc[0]) == [1.5, 1.6, 1.7]
    assert f"{name} x1" in wide.columns
    assert sum(c.startswith(f"{name} x8 <") for c in wide.columns) == 2  # slug tells them apart
    stamps = capsys.readouterr().out
    assert all(f"{column}, driver" in stamps for column in wide.columns)


@pytest.mark.parametrize("rows", [results.FOLD_ROWS, results.FOLD_ROWS + 1])
def test_a_long_committed_table_is_folded_under_one_line(tmp_path, monkeypatch, rows):
    """Up to FOLD_ROWS figures the table is shown as it is; a longer one (chapter 3's 38
    figures of an H200) is folded, closed, under a line that says how many figures it holds,
    the stamps above it and the whole table in it and in the plain text."""
    figures = [figure(name=f"fp32_tflops_{i}", value=float(i)) for i in range(rows)]
    write_result(tmp_path, result_doc("gpu-h100", figures))
    shown = []
    monkeypatch.setattr("IPython.get_ipython",
                        lambda: types.SimpleNamespace(kernel=object()))
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    wide = results.show_committed("matmul", directory=tmp_path)
    ((data,),) = [shown]
    assert len(wide) == rows and wide.to_string() in data["text/plain"]
    html = data["text/html"]
    stamps, table = html.split("</ul>", 1)
    assert "Device gpu-h100 x1, driver" in stamps
    if rows > results.FOLD_ROWS:
        assert table == (f'<details class="book-folded"><summary>The {rows} figures, one per '
                         f"row (click to open)</summary>{wide.to_html()}</details>")
    else:
        assert table == wide.to_html() and "<details" not in html


def test_show_committed_displays_itself_inside_a_kernel(tmp_path, monkeypatch, capsys):
    """Inside a notebook the stamps and the table go out as one display output, marked so the
    book build can tell it apart (a recorded GPU page takes it from the CPU build)."""
    write_result(tmp_path, result_doc("gpu-h100"))
    shown = []
    fake_shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setattr("IPython.get_ipython", lambda: fake_shell)
    monkeypatch.setattr("IPython.display.display",
                        lambda obj, **kw: shown.append((obj, kw)))
    wide = results.show_committed("matmul", directory=tmp_path)
    ((data, kw),) = shown
    assert kw == {"raw": True, "metadata": {results.DISPLAY_KEY: "matmul"}}
    assert "Device gpu-h100 x1, driver 580.1" in data["text/plain"]
    assert wide.to_string() in data["text/plain"]
    assert wide.to_html() in data["text/html"] and "Device gpu-h100 x1, driver" in data["text/html"]
    assert capsys.readouterr().out == ""  # shown once, not printed as well
    results.show_committed("regression", directory=tmp_path)
    assert shown[-1][1]["metadata"] == {results.DISPLAY_KEY: "regression"}
    assert "No committed GPU results" in shown[-1][0]["text/plain"]


def test_show_committed_says_when_there_is_nothing(tmp_path, capsys):
    assert results.show_committed("matmul", directory=tmp_path).empty
    assert "No committed GPU results" in capsys.readouterr().out
    write_result(tmp_path, result_doc("cpu-box", [dict(FIGURE, device="cpu")], gpu_count=0))
    assert results.show_committed("matmul", directory=tmp_path).empty


def test_broken_files_are_named(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        results.load_results(tmp_path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json lacks"):
        results.load_results(tmp_path)
    write_result(tmp_path, result_doc("bad", version=7))
    with pytest.raises(ValueError, match="schema version 7"):
        results.load_results(tmp_path)


def test_version_1_files_are_read_with_the_new_keys_filled_in(tmp_path):
    write_result(tmp_path, result_doc("gpu-old", version=1))
    write_result(tmp_path, result_doc("gpu-new", version=2))
    old, new = sorted(results.load_results(tmp_path), key=lambda d: d["schema_version"])
    assert old["machine"]["accelerator"] == "cuda" and old["machine"]["book_commit"] == "unknown"
    assert new["machine"]["book_commit"] == "abc1234def"


def test_show_committed_never_mixes_cpu_and_gpu_figures(tmp_path, capsys):
    write_result(tmp_path, result_doc("gpu-h100", [FIGURE, dict(FIGURE, device="cpu", value=0.2)]))
    wide = results.show_committed("matmul", directory=tmp_path)
    assert list(wide.index) == ["fp32_tflops [TFLOP/s] on cuda:0"]
    assert wide.iloc[0, 0] == 1.5  # not the mean of 1.5 and 0.2
    both = results.show_committed("matmul", gpu_only=False, directory=tmp_path)
    assert both.loc["fp32_tflops [TFLOP/s] on cpu", "Device gpu-h100 x1"] == 0.2


def test_show_committed_in_a_notebook_branch(tmp_path):
    """A real kernel: the call inside an else branch shows the figures table."""
    pytest.importorskip("nbclient")
    import nbformat

    write_result(tmp_path, result_doc("gpu-h100", [dict(FIGURE, value=123.25)]))
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import helpers.results\n"
        f"if False:\n    pass\nelse:\n    helpers.results.show_committed('matmul', directory={str(tmp_path)!r})\n"))
    execute_as_a_reader(nb)
    outputs = nb.cells[0].outputs
    kinds = [o["output_type"] for o in outputs]
    assert kinds == ["display_data"], kinds
    assert outputs[0]["metadata"] == {results.DISPLAY_KEY: "matmul"}
    data = outputs[0]["data"]
    assert "123.25" in data["text/html"] and "Device gpu-h100 x1" in data["text/html"]


def test_a_figure_one_machine_lacks_is_shown_as_missing_not_dropped(tmp_path, capsys):
    """A T4 (compute capability 7.5) measures no bf16 recipe: its column is empty there, and
    the other machine's figure, the report's tables and the plot are unaffected."""
    import matplotlib.pyplot as plt

    report = results

    bf16 = dict(FIGURE, workload="recipes", name="bf16_autocast_speedup", unit="x", value=1.9)
    plain = dict(FIGURE, workload="recipes", name="plain_step_ms", unit="ms", value=1.2)
    lines = dict(FIGURE, workload="cuda_semantics", name="async_error_lines_late", unit="lines",
                 value=3.0)
    write_result(tmp_path, result_doc("gpu-h100-x1", [bf16, plain, lines], device_name="H100",
                                      version=2))
    write_result(tmp_path, result_doc("gpu-t4-x1", [dict(plain, value=4.5)], device_name="T4",
                                      version=2))
    wide = results.show_committed("recipes", directory=tmp_path)
    assert list(wide.columns) == ["H100 x1", "T4 x1"]
    row = "bf16_autocast_speedup [x] on cuda:0"
    assert wide.loc[row, "H100 x1"] == 1.9 and wide.loc[row, "T4 x1"] != wide.loc[row, "T4 x1"]
    assert wide.loc["plain_step_ms [ms] on cuda:0", "T4 x1"] == 4.5
    assert "NaN" in capsys.readouterr().out
    docs = results.load_results(tmp_path)
    table = report.figures_table(docs)
    assert report.missing_figures(docs, table) == []
    assert sorted(report.workloads(docs)) == ["cuda_semantics", "recipes"]
    fig = report.plot_workload(docs, "recipes")  # the T4's empty slot beside the H100's bar
    assert fig is not None
    plt.close(fig)
    # One "lines" figure of one machine compares nothing: it stays in the table, unplotted.
    assert report.plot_workload(docs, "cuda_semantics") is None
    only_h100 = results.show_committed("cuda_semantics", directory=tmp_path)
    assert list(only_h100.columns) == ["H100 x1"]  # a machine without the workload has no column
