"""tools/torch_messages.py: the messages it extracts from the installed packages are the ones
committed in tests/fixtures/ (a torch upgrade that adds or rewords one fails here, with the
diff, until the file and the troubleshooting page follow), and every entry of the page whose
check is "found in installed files" quotes a message the tool still finds.

The extraction reads about 30 MB of Python and 30 MB of library strings per interpreter (about
4 CPU seconds each); it runs once per interpreter in a test session, however many xdist workers
share it: the first worker to need it extracts under a file lock, the others read its result
(keyed on the interpreter, its packages' versions, the tool's source and the page's quotes)."""

from __future__ import annotations

import ast
import fcntl
import functools
import hashlib
import json
import os
import pickle
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import read_entries
from tools import torch_messages as tm

FIXTURES = ROOT / "tests" / "fixtures"
#: Each interpreter the book supports, and the file that holds its messages.
OUTPUTS = {".venv": FIXTURES / "torch-messages.tsv",
           ".venv-oldest": FIXTURES / "torch-messages-oldest.tsv"}
REGENERATE = "python tools/torch_messages.py --python {venv}/bin/python --out {out}"

#: Entries checked in installed files whose quote is no message the tool can list, and why.
NOT_A_STRING = {
    "err-cudnn-status": "cuDNN's own text after PyTorch's 12 characters 'cuDNN error: '",
    "err-pin-memory-thread": "built at run time from the exception's class and the thread's "
                             "'where' (ExceptionWrapper)",
    "err-mps-float64": "compiled into macOS builds only; its first sentence is quoted by "
                       "PyTorch's installed test suite",
    "err-mps-not-implemented": "compiled into macOS builds only; its first sentence is quoted "
                               "by PyTorch's installed test suite",
}


def page() -> dict[str, list[str]]:
    return {label: e.blocks + [b for blocks in e.older.values() for b in blocks]
            for label, e in read_entries().items()}


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A folder every xdist worker of this test session sees (the session's own base
    folder's parent under xdist, which pytest makes anew for each session)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def extracted(shared_dir):
    """``extracted(venv)``: tools/torch_messages.py's versions and messages of ``venv``'s
    interpreter, extracted once per test session whatever the number of workers."""

    @functools.cache
    def extract(venv: str) -> tuple[dict[str, str], tuple[tm.Message, ...]]:
        python = ROOT / venv / "bin" / "python"
        if not python.exists():
            pytest.skip(f"{venv} is not installed")
        entries = page()
        site, versions = tm.environment(str(python))
        key = hashlib.sha256(json.dumps(
            [str(python), str(site), versions, entries,
             (ROOT / "tools" / "torch_messages.py").read_text()]).encode()).hexdigest()[:20]
        cache = shared_dir / f"torch-messages-{venv.strip('.')}-{key}.pickle"
        with open(shared_dir / f"torch-messages-{venv.strip('.')}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits for the first's result
            if not cache.exists():
                found_versions, found = tm.messages(str(python), entries)
                tmp = cache.with_suffix(".tmp")
                tmp.write_bytes(pickle.dumps((found_versions, tuple(found))))
                tmp.replace(cache)
        return pickle.loads(cache.read_bytes())

    return extract


def without_entries(text: str) -> str:
    """The output with its entries column and the counts left out: what the packages hold."""
    versions, found = tm.parse(text)
    return tm.render(versions, [m.__class__(m.topic, m.package, m.kind, m.files, "-", m.text)
                                for m in found])


@pytest.mark.parametrize("venv", list(OUTPUTS))
def test_the_committed_messages_are_the_installed_ones(venv, extracted):
    out = OUTPUTS[venv]
    assert out.exists(), f"no {out.name}: run {REGENERATE.format(venv=venv, out=out)}"
    fresh = tm.render(*extracted(venv))
    changes = tm.diff(without_entries(out.read_text()), without_entries(fresh))
    assert not changes, (
        f"the installed packages of {venv} print other messages than {out.name} lists: run\n"
        f"  {REGENERATE.format(venv=venv, out=out.relative_to(ROOT))}\nthen let "
        f"chapters/09_troubleshooting.md follow (new and reworded messages):\n{changes}")


@pytest.mark.parametrize("venv", list(OUTPUTS))
def test_the_committed_entry_marks_follow_the_page(venv, extracted):
    out = OUTPUTS[venv]
    changes = tm.diff(out.read_text(), tm.render(*extracted(venv)))
    assert not changes, (f"{out.name} marks other entries than the page quotes: run\n  "
                         f"{REGENERATE.format(venv=venv, out=out.relative_to(ROOT))}\n{changes}")


def test_every_entry_found_in_installed_files_quotes_a_message_the_tool_finds(extracted):
    _, found = extracted(".venv")
    quoted = {label for m in found for label in m.entries.split(",")}
    missing = {label: entry.blocks[0][:120] for label, entry in read_entries().items()
               if entry.kind == "files" and label not in quoted and label not in NOT_A_STRING}
    assert not missing, ("entries checked in installed files that quote no message "
                         f"tools/torch_messages.py finds: {missing}")
    stale = [label for label in NOT_A_STRING if label in quoted]
    assert not stale, f"these entries quote a message the tool finds now: {stale}"


def test_the_counts_cover_every_topic_and_package(extracted):
    versions, found = extracted(".venv")
    topics = {m.topic for m in found}
    assert topics == set(tm.TOPICS), set(tm.TOPICS) - topics
    # torchkeras prints nothing on these topics (its messages are about its own API)
    assert {m.package for m in found} == set(versions) - {"torchkeras"}
    assert set(versions) == set(tm.PACKAGES)
    assert found == tuple(sorted(found, key=lambda m: (list(tm.TOPICS).index(m.topic),
                                                       m.package, m.text, m.kind, m.files)))


# -- the parts of the tool -----------------------------------------------------------------------

def messages_of(source: str, tmp_path: Path) -> list[tuple[str, str]]:
    path = tmp_path / "module.py"
    path.write_text(source)
    return list(tm.python_messages(path))


def test_python_messages_keep_fixed_text_and_mark_the_rest(tmp_path):
    source = '''
import warnings
def f(device, n):
    if n < 0: raise ValueError(f"bad device {device!r}: index {n} out of range")
    msg = "Expected a CUDA device"
    msg += f", got {device}"
    if device:
        raise RuntimeError(msg)
    warnings.warn(
        "pin_memory is set but "
        "no accelerator is found, %s" % device,
        stacklevel=2,
    )
    torch._check(n > 0, lambda: f"n must be positive, got {n}")
    raise NotImplementedError("Cannot {} on {}".format("copy", device))
    raise AssertionError("Torch not compiled with CUDA enabled")
    raise KeyError(device)
    text = """raise ValueError("inside a string, not code")"""
class Missing(RuntimeError):
    def __init__(self, name):
        super().__init__(f"Cannot find a working triton for {name}")
class NoCompiler(RuntimeError):
    def __init__(self, compiler):
        if compiler is None:
            msg = f"No working C++ compiler found in {compiler}"
        else:
            msg = f"Compiler: {compiler} is not found."
        super().__init__(msg)
class OutOfResources(TritonError):
    def __str__(self) -> str:
        return f"out of resource: {self.name}, Required: {self.required}"
class Point:
    def __str__(self):
        return f"a point at {self.x} and {self.y} on the device"
def g(ranks):
    error_msg: str = ""
    for rank in ranks:
        error_msg += f"Unexpected stage name received from rank {rank} "
    raise RuntimeError(error_msg)
'''
    assert messages_of(source, tmp_path) == [
        ("ValueError", "bad device {}: index {} out of range"),
        ("RuntimeError", "Expected a CUDA device, got {}"),
        ("warning", "pin_memory is set but no accelerator is found, %s"),
        ("RuntimeError", "n must be positive, got {}"),
        ("NotImplementedError", "Cannot {} on {}"),
        ("AssertionError", "Torch not compiled with CUDA enabled"),
        ("Exception", "Cannot find a working triton for {}"),
        ("Exception", "Compiler: {} is not found."),  # one message per branch's assignment
        ("Exception", "No working C++ compiler found in {}"),
        ("OutOfResources", "out of resource: {}, Required: {}"),  # an exception's __str__
        ("RuntimeError", "Unexpected stage name received from rank {} "),  # Point's is no error
    ]


def test_placeholders_are_written_alike():
    assert tm.normalise("  %s out of %d (%.2f GiB) on {} {0} {name!r} {:>8}  ") == \
        "{} out of {} ({} GiB) on {} {} {} {}"


@pytest.mark.parametrize(("file", "text", "topic"), [
    ("torch/_inductor/ir.py", "index out of range", "compile"),
    ("torch/lib/libc10_cuda.so", "CUDA out of memory. Tried to allocate", "memory"),
    ("torch/lib/libtorch_cuda.so", "NCCL error in: {}, {}", "distributed"),
    ("torch/cuda/__init__.py", "Torch not compiled with CUDA enabled", "compat"),
    ("torch/nn/modules/module.py", "Expected all tensors to be on the same device", "device"),
    ("torch/nn/modules/module.py", "mat1 and mat2 shapes cannot be multiplied", None),
])
def test_a_message_goes_under_the_first_topic_that_claims_it(file, text, topic):
    assert tm.topic_of(file, text) == topic


def test_an_entry_quotes_a_message_with_its_fixed_parts_in_order():
    entries = {"err-oom": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                           "20.00 MiB. GPU 0 has a total capacity of 79.19 GiB"],
               "err-other": ["RuntimeError: GPU 0 has a total capacity of 1 GiB"]}
    assert tm.quoting_entries("CUDA out of memory. Tried to allocate {}. GPU {} has a total "
                              "capacity of {}", entries) == ["err-oom"]
    assert tm.quoting_entries("has a total capacity of {}", entries) == ["err-oom", "err-other"]
    assert tm.quoting_entries("Tried to allocate {} out of memory. CUDA", entries) == []
    assert tm.quoting_entries("GPU {} has {}", entries) == []  # too little fixed text


def test_library_strings_are_read_from_the_read_only_data():
    lib = Path(tm.environment(sys.executable)[0]) / "torch" / "lib" / "libc10_cuda.so"
    if not lib.exists():
        pytest.skip("this PyTorch build has no libc10_cuda.so")
    texts = {tm.normalise(text) for _, text in tm.library_messages(lib)}
    assert any(text.startswith("CUDA out of memory. Tried to allocate") for text in texts)
    assert not any("INTERNAL ASSERT FAILED" in t and tm.is_message(t) for t in texts)


def test_the_output_reads_back():
    found = [tm.Message("memory", "torch", "library", "torch/lib/libc10_cuda.so", "err-oom",
                        "line one\n\tline two with a \\ backslash")]
    text = tm.render({"torch": "2.14.1"}, found)
    assert tm.parse(text) == ({"torch": "2.14.1"}, found)
    assert len(text.splitlines()) == 8  # six header lines, the column names, one message


def test_the_command_line_diffs_against_a_file(tmp_path, monkeypatch, capsys):
    found = [tm.Message("memory", "torch", "library", "a.so", "-", "CUDA out of memory. Tried")]
    monkeypatch.setattr(tm, "messages", lambda python: ({"torch": "2.14.1"}, list(found)))
    out = tmp_path / "messages.tsv"
    assert tm.main(["--out", str(out)]) == 0
    assert tm.main(["--diff", str(out)]) == 0
    found.append(tm.Message("device", "torch", "RuntimeError", "torch/cuda/__init__.py", "-",
                            "No CUDA GPUs are available"))
    assert tm.main(["--diff", str(out)]) == 1
    assert "+device\ttorch\tRuntimeError\ttorch/cuda/__init__.py\t-\tNo CUDA GPUs are " \
           "available" in capsys.readouterr().out


def test_the_tool_documents_its_rules():
    doc = ast.get_docstring(ast.parse((ROOT / "tools" / "torch_messages.py").read_text()))
    for name in ("PATH_TOPICS", "WORD_TOPICS", "PY_FOLDERS", "LIBRARIES", "--diff"):
        assert name in doc, name


def test_the_page_names_the_versions_its_messages_come_from():
    """The troubleshooting page's method section names each package version the committed
    outputs were extracted from (a regenerated output with a new version fails here until the
    page says so)."""
    text = (ROOT / "chapters" / "09_troubleshooting.md").read_text()
    method = text[text.index("(grp-method)="):]
    method = " ".join(method.split())
    for out in OUTPUTS.values():
        versions, _ = tm.parse(out.read_text())
        missing = {p: v for p, v in versions.items() if v not in method}
        assert not missing, f"the method section does not name {missing} ({out.name})"
