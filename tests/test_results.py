import json

import pytest

from helpers import results


def write(folder, name, gpu_count, figures):
    doc = {"schema_version": 1, "date": "2026-11-22T00:00:00Z", "command": "python -m helpers.bench",
           "machine": {"slug": name, "device_name": f"Device {name}", "gpu_count": gpu_count,
                       "torch": "2.14.1", "cuda": "13.0" if gpu_count else None, "driver": None},
           "figures": figures}
    (folder / f"{name}.json").write_text(json.dumps(doc))


FIG = {"workload": "matmul", "chapter": 3, "name": "fp32_tflops", "value": 1.5, "unit": "TFLOP/s",
       "device": "cuda:0", "spread": 0.1, "note": ""}


def test_results_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOK_RESULTS_DIR", str(tmp_path))
    assert results.results_dir() == tmp_path


def test_committed_table_and_gpu_filter(tmp_path):
    write(tmp_path, "cpu-box", 0, [dict(FIG, device="cpu", value=0.1)])
    write(tmp_path, "gpu-h100", 1, [FIG, dict(FIG, workload="mnist", name="images_per_s", unit="1/s")])
    table = results.committed(directory=tmp_path)
    assert len(table) == 3
    assert set(results.committed("matmul", gpu_only=True, directory=tmp_path)["machine"]) == {"gpu-h100"}


def test_show_committed_prints_the_hardware(tmp_path, capsys):
    write(tmp_path, "gpu-h100", 1, [FIG])
    wide = results.show_committed("matmul", directory=tmp_path)
    out = capsys.readouterr().out
    assert "Device gpu-h100 (x1)" in out and "CUDA 13.0" in out
    assert wide.loc["fp32_tflops [TFLOP/s] on cuda:0", "Device gpu-h100"] == 1.5


def test_show_committed_says_when_there_is_nothing(tmp_path, capsys):
    assert results.show_committed("matmul", directory=tmp_path).empty
    assert "No committed GPU results" in capsys.readouterr().out


def test_broken_files_are_named(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        results.load_results(tmp_path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json lacks"):
        results.load_results(tmp_path)


def test_show_committed_never_mixes_cpu_and_gpu_figures(tmp_path, capsys):
    write(tmp_path, "gpu-h100", 1, [FIG, dict(FIG, device="cpu", value=0.2)])
    wide = results.show_committed("matmul", directory=tmp_path)
    assert list(wide.index) == ["fp32_tflops [TFLOP/s] on cuda:0"]
    assert wide.iloc[0, 0] == 1.5  # not the mean of 1.5 and 0.2
    both = results.show_committed("matmul", gpu_only=False, directory=tmp_path)
    assert both.loc["fp32_tflops [TFLOP/s] on cpu", "Device gpu-h100"] == 0.2
