"""The benchmark command, ``python -m bench``, run on fake workloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from bench import __main__ as runner
from bench import core, schema
from bench.core import Figure
from tests.conftest import ROOT
from tests.support import run_bench


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A registry holding two fake workloads, with results/ redirected to a temporary folder.

    Returns a namespace: ``calls`` counts runs, ``fail`` makes ``beta`` raise, ``results`` is
    the folder a full run writes to by default.
    """
    monkeypatch.setattr(core, "WORKLOADS", {})
    monkeypatch.setattr(runner, "load_workload_modules", lambda package=None: [])
    results = tmp_path / "results"
    monkeypatch.setenv("BOOK_RESULTS_DIR", str(results))
    monkeypatch.setattr(core, "book_root", lambda: tmp_path)  # the checkout holding _build/

    class State:
        calls = 0
        fail: BaseException | None = None

    state = State()
    state.results = results
    state.scratch = tmp_path / "_build" / "bench"

    @core.workload("alpha", 3, "A fake matrix multiply.")
    def alpha(device, *, quick):
        state.calls += 1
        return [Figure("product time", 0.5 if quick else 1.0 + state.calls, "s", str(device),
                       spread=0.01),
                Figure("throughput", 2.0, "TFLOP/s", "cpu")]

    @core.workload("beta", "appendix")
    def beta(device, *, quick):
        """A fake training loop."""
        if state.fail is not None:
            raise state.fail
        return [Figure("epoch time", 3.0, "s", str(device), note="fake")]

    return state


def only_file(folder: Path) -> Path:
    files = sorted(folder.glob("*"))
    assert len(files) == 1, f"expected one file in {folder}, found {[f.name for f in files]}"
    return files[0]


def _fake_torch_devices(monkeypatch, kind: str, count: int) -> None:
    """Make this CPU-only torch report ``count`` devices of ``kind`` to ``core.machine_info``."""
    import torch

    props = types.SimpleNamespace(name=f"Fake {kind} device", total_memory=2**34,
                                  multi_processor_count=8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: kind in ("cuda", "rocm"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.4.1" if kind == "rocm" else None)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: kind == "xpu")
    monkeypatch.setattr(torch.xpu, "device_count", lambda: count)
    monkeypatch.setattr(torch.xpu, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: kind == "mps")
    monkeypatch.setattr(core, "_driver_version", lambda: "580.65" if kind == "cuda" else None)


def test_full_run_writes_one_valid_file_named_after_the_machine(bench, capsys):
    assert run_bench() == 0
    path = only_file(bench.results)
    doc = json.loads(path.read_text())
    assert schema.validate(doc) == []
    assert schema.validate_file(path) == []
    assert path.stem == doc["machine"]["slug"] == core.machine_slug(core.machine_info())
    assert doc["quick"] is False and doc["command"] == "python -m bench --no-progress"
    for key in ("device_name", "gpu_count", "driver", "cuda", "torch"):
        assert key in doc["machine"]
    names = [(f["workload"], f["chapter"], f["name"], f["unit"]) for f in doc["figures"]]
    assert names == [("alpha", 3, "product time", "s"), ("alpha", 3, "throughput", "TFLOP/s"),
                     ("beta", "appendix", "epoch time", "s")]
    assert [w["name"] for w in doc["workloads"]] == ["alpha", "beta"]
    assert doc["workloads"][1]["description"] == "A fake training loop."
    assert "Wrote" in capsys.readouterr().out


def test_second_run_replaces_the_machines_file(bench, capsys):
    assert run_bench() == 0
    path = only_file(bench.results)
    first = json.loads(path.read_text())
    assert run_bench() == 0
    assert only_file(bench.results) == path
    second = json.loads(path.read_text())
    assert first["figures"][0]["value"] == 2.0 and second["figures"][0]["value"] == 3.0
    assert "Replaced" in capsys.readouterr().out


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), KeyboardInterrupt()])
def test_a_failed_run_leaves_the_previous_file_intact(bench, capsys, error):
    assert run_bench() == 0
    path = only_file(bench.results)
    before = path.read_bytes()
    bench.fail = error
    assert run_bench() == 1
    assert path.read_bytes() == before
    assert only_file(bench.results) == path  # no temporary file left behind
    err = capsys.readouterr().err
    assert "left unchanged" in err
    if isinstance(error, RuntimeError):
        assert "CUDA out of memory" in err


def test_a_failed_first_run_writes_nothing(bench):
    bench.fail = ValueError("broken")
    assert run_bench() == 1
    assert not any(bench.results.glob("*"))  # the folder was checked for writing, no file or not any(bench.results.iterdir())


@pytest.mark.parametrize("bad", [[], "not a list", [1.0], [Figure("x", float("nan"), "s", "cpu")]])
def test_a_workload_returning_no_figures_or_bad_ones_fails(bench, bad, capsys):
    @core.workload("gamma", 4)
    def gamma(device, *, quick):
        return bad

    assert run_bench() == 1
    assert not any(bench.results.glob("*"))  # the folder was checked for writing, no file
    assert "gamma" in capsys.readouterr().err


def test_figures_that_break_the_schema_are_not_written(bench, capsys):
    @core.workload("gamma", 4)
    def gamma(device, *, quick):
        return [Figure("t", 1.0, "s", "cpu"), Figure("t", 2.0, "s", "cpu")]

    assert run_bench() == 1
    assert not any(bench.results.glob("*"))  # the folder was checked for writing, no file
    assert "twice" in capsys.readouterr().err


def test_list_names_every_workload_in_chapter_order(bench, capsys):
    assert run_bench("--list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["alpha", "beta"]
    assert "A fake matrix multiply." in lines[0]
    assert bench.calls == 0 and not bench.results.exists()


def test_only_runs_the_named_workloads_and_writes_a_scratch_file(bench):
    assert run_bench("--only", "beta") == 0
    assert bench.calls == 0 and not bench.results.exists()
    doc = json.loads(only_file(bench.scratch).read_text())
    assert {f["workload"] for f in doc["figures"]} == {"beta"}
    assert run_bench("--only", "beta", "--only", "alpha", "--out", str(bench.scratch / "two")) == 0
    doc = json.loads(only_file(bench.scratch / "two").read_text())
    assert {f["workload"] for f in doc["figures"]} == {"alpha", "beta"}
    assert doc["command"].endswith("--only beta --only alpha --out " + str(bench.scratch / "two"))


def test_unknown_workload_is_refused(bench, capsys):
    assert run_bench("--only", "nope") == 2
    assert "unknown workload(s) 'nope'" in capsys.readouterr().err


def test_quick_runs_never_write_into_results(bench, capsys):
    assert run_bench("--quick") == 0
    doc = json.loads(only_file(bench.scratch).read_text())
    assert doc["quick"] is True and doc["figures"][0]["value"] == 0.5
    assert not bench.results.exists()
    for argv in (["--quick"], ["--only", "alpha"]):
        assert run_bench(*argv, "--out", str(bench.results)) == 2
        assert "may not write into" in capsys.readouterr().err
    assert not bench.results.exists()


def test_a_device_other_than_the_best_one_gets_its_own_file(bench, monkeypatch):
    import helpers.devices

    monkeypatch.setattr(helpers.devices, "available_devices", lambda: ["cuda:0", "cpu"])
    assert run_bench("--device", "cpu") == 0
    path = only_file(bench.results)
    assert path.stem.endswith("-on-cpu")
    assert schema.validate_file(path) == []


def test_a_missing_device_is_refused(bench, capsys):
    assert run_bench("--device", "cuda:7") == 2
    err = capsys.readouterr().err
    assert "not available" in err or "does not exist" in err


def test_a_broken_workload_module_is_reported_and_stops_the_run(bench, monkeypatch, capsys):
    monkeypatch.setattr(runner, "load_workload_modules",
                        lambda package=None: [("bench.broken", "ImportError: no lib")])
    assert run_bench() == 2
    err = capsys.readouterr().err
    assert "bench.broken failed to import: ImportError: no lib" in err
    assert not bench.results.exists()
    assert run_bench("--list") == 2


def test_load_workload_modules_imports_each_module_and_reports_failures(tmp_path, monkeypatch):
    pkg = tmp_path / "fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("raise AssertionError('core is not a workload')\n")
    (pkg / "good.py").write_text("LOADED = True\n")
    (pkg / "broken.py").write_text("import module_that_does_not_exist\n")
    (pkg / "_private.py").write_text("raise AssertionError('private')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        failures = runner.load_workload_modules("fakebench")
        assert [m for m, _ in failures] == ["fakebench.broken"]
        assert "ModuleNotFoundError" in failures[0][1]
        assert sys.modules["fakebench.good"].LOADED
    finally:
        for name in [n for n in sys.modules if n.startswith("fakebench")]:
            del sys.modules[name]


def test_write_atomically_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    runner.write_atomically({"a": 1}, path)
    assert json.loads(path.read_text()) == {"a": 1}

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        runner.write_atomically({"a": 2}, path)
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
    with pytest.raises(ValueError):  # NaN is not JSON
        runner.write_atomically({"a": float("nan")}, path)


@pytest.mark.parametrize("kind, count", [("cuda", 2), ("rocm", 1), ("xpu", 2), ("mps", 1)])
def test_the_machine_record_counts_every_kind_of_accelerator(monkeypatch, kind, count):
    _fake_torch_devices(monkeypatch, kind, count)
    info = core.machine_info()
    assert info["accelerator"] == kind and info["gpu_count"] == count
    assert len(info["gpus"]) == count
    assert core.machine_slug(info).endswith(f"-x{count}")
    assert info["driver"] == ("580.65" if kind == "cuda" else None)
    assert ("hip" in info) == (kind == "rocm")
    machine = {"slug": core.machine_slug(info), **info}
    assert schema.validate_machine(machine) == [], schema.validate_machine(machine)


def test_the_machine_record_names_the_commit_and_the_flags(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    info = core.machine_info()
    assert info["flags"]["cudnn_benchmark"] is True
    assert {"float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32"} <= set(
        info["flags"])
    try:  # a GPU server's copy may lack .git, and its image git itself
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        head = None
    if os.environ.get("BOOK_COMMIT", "").strip():  # a copy named by the report (or by hand)
        assert info["book_commit"] == os.environ["BOOK_COMMIT"].strip()
    elif head is not None and head.returncode == 0:
        assert info["book_commit"] == head.stdout.strip()
    else:
        assert info["book_commit"] == "unknown"
    monkeypatch.setenv("BOOK_COMMIT", "feedbeef")
    assert core.book_commit() == "feedbeef"
    monkeypatch.delenv("BOOK_COMMIT")
    monkeypatch.setattr(core, "book_root", lambda: None)
    assert core.book_commit() == "unknown"


def test_meta_is_refused_with_a_message(bench, capsys):
    assert run_bench("--device", "meta") == 2
    assert "meta device" in capsys.readouterr().err
    assert bench.calls == 0 and not bench.results.exists()


def test_an_unwritable_folder_stops_the_run_before_measuring(bench, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert run_bench("--out", str(blocker / "results")) == 2
    err = capsys.readouterr().err
    assert "cannot write the result file" in err and "nothing was measured" in err
    assert bench.calls == 0


def test_banners_say_which_kind_of_run(bench, capsys):
    assert run_bench("--only", "alpha") == 0
    assert "(partial run)" in capsys.readouterr().out
    assert run_bench("--quick") == 0
    assert "(quick run)" in capsys.readouterr().out
    assert run_bench("--quick", "--only", "beta") == 0
    assert "(quick and partial run)" in capsys.readouterr().out
    assert run_bench("--only", "alpha", "--only", "beta") == 0
    assert "(full run)" in capsys.readouterr().out


def test_without_a_checkout_a_scratch_run_goes_to_a_temporary_folder(bench, monkeypatch,
                                                                     tmp_path, capsys):
    monkeypatch.setattr(core, "book_root", lambda: None)
    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("BOOK_RESULTS_DIR")
    for argv in (["--quick"], []):  # a full run too: never into site-packages
        assert run_bench(*argv) == 0
        out = capsys.readouterr().out
        assert "No checkout of the book here" in out
    written = sorted((tmp_path / "tmp").glob("book-bench-*/*.json"))
    assert len(written) == 2
    assert not bench.scratch.exists() and not bench.results.exists()


def test_scratch_runs_from_a_checkout_stay_inside_it(bench):
    assert run_bench("--quick") == 0
    assert bench.scratch.is_dir()
    assert bench.scratch.resolve().is_relative_to(core.book_root().resolve())


def test_the_command_lists_the_books_workloads():
    """Every workload module in bench/ imports in a fresh interpreter, and ``python -m bench``
    lists what it found: each module's workloads, in chapter order, and nothing else."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    modules = sorted(p.stem for p in (ROOT / "bench").glob("*.py")
                     if not p.stem.startswith("_") and p.stem not in runner.NOT_WORKLOADS)
    assert len(modules) >= 7, modules  # the right folder: helpers/bench found none, vacuously
    listed = [line.split()[0] for line in proc.stdout.splitlines() if "chapter" in line]
    # the same registry in this process (the modules are imported here as well): every
    # module registers a workload, and the command lists exactly the registered ones in order
    assert runner.load_workload_modules() == []
    assert listed == [w.name for w in runner.registered()], proc.stdout
    assert sorted({w.fn.__module__ for w in runner.registered()}) == [
        f"bench.{m}" for m in modules]


def test_the_command_explains_itself(capsys):
    # in-process: the entry point itself is run by the --list test above
    with pytest.raises(SystemExit) as exit_:
        runner.main(["--help"])
    assert exit_.value.code == 0
    usage = textwrap.dedent(capsys.readouterr().out)
    assert usage.startswith("usage: python -m bench")
    for option in ("--quick", "--only", "--out", "--list", "--device"):
        assert option in usage


def test_precision_flags_name_the_convolution_setting_cudnn_reads():
    import torch

    from bench import core

    cudnn = torch.backends.cudnn
    old = cudnn.conv.fp32_precision
    # conv set apart from RNN with the new API, as a chapter may do
    cudnn.conv.fp32_precision = "ieee" if cudnn.rnn.fp32_precision != "ieee" else "tf32"
    try:
        flags = core.precision_flags()
        assert flags["cudnn_conv_fp32_precision"] == cudnn.conv.fp32_precision
        assert flags["cudnn_conv_fp32_precision"] != flags["cudnn_rnn_fp32_precision"]
    finally:
        cudnn.conv.fp32_precision = old
    # cudnn.fp32_precision is the CUDA-wide default, recorded under that name
    assert flags["cuda_fp32_precision"] == cudnn.fp32_precision
    assert flags["cudnn_rnn_fp32_precision"] == cudnn.rnn.fp32_precision
    assert "cudnn_fp32_precision" not in flags
    # the legacy flag has no single answer while conv and RNN differ: recorded as unknown
    assert flags["cudnn_allow_tf32"] is None


def test_parts_keep_what_a_failed_run_measured_and_the_next_run_completes_it(
        tmp_path, monkeypatch):
    # Two workloads; the second fails the first time. The first one's figures are kept in the
    # parts folder, and the next run measures only the second.
    calls: list[str] = []

    def good(device, *, quick):
        calls.append("good")
        return [core.Figure("x", 1.0, "s", str(device), None, "quick run")]

    state = {"fail": True}

    def flaky(device, *, quick):
        calls.append("flaky")
        if state["fail"]:
            raise RuntimeError("cut short")
        return [core.Figure("y", 2.0, "s", str(device), None, "quick run")]

    monkeypatch.setattr(core, "WORKLOADS", {
        "good": core.Workload("good", 1, good), "flaky": core.Workload("flaky", 2, flaky)})
    monkeypatch.setattr(runner, "load_workload_modules", lambda: [])
    parts, out = tmp_path / "parts", tmp_path / "out"
    args = ["--quick", "--out", str(out), "--parts", str(parts), "--no-progress",
            "--device", "cpu"]
    assert runner.main(args) == runner.EXIT_FAILED
    assert not list(out.glob("*.json")), "no result file from a run with a failed workload"
    assert sorted(p.name for p in parts.glob("*.json")) == ["good.json"]
    assert runner.main([*args, "--allow-partial"]) == runner.EXIT_FAILED
    (written,) = out.glob("*.json")
    doc = json.loads(written.read_text())
    assert doc["missing_workloads"] == ["flaky"] and schema.validate(doc) == []
    assert calls == ["good", "flaky", "flaky"], "the second run reused the saved part"
    state["fail"] = False
    assert runner.main(args) == runner.EXIT_OK
    doc = json.loads(written.read_text())
    assert "missing_workloads" not in doc
    assert [f["name"] for f in doc["figures"]] == ["x", "y"]
    assert calls == ["good", "flaky", "flaky", "flaky"]
    assert runner.main(["--quick", "--out", str(out), "--allow-partial"]) == runner.EXIT_USAGE
