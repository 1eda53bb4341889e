"""Helpers the book's tests share (fixtures live in conftest.py): bad input refused clearly,
commands and processes, result documents, executed pages, and the troubleshooting page."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import results as report
from tests.conftest import ROOT
from tools.notebook import code_cells, output_problems, output_texts  # noqa: F401 (shared)

# -- bad input: a clear error, and nothing half-done ------------------------------------------


def assert_mentions(text: str, words: Iterable[str]) -> None:
    """Every one of ``words`` is in ``text``; a failure names the missing word and the text."""
    for word in words:
        assert word in text, (word, text)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _state(model) -> list[tuple[str, Any]]:
    return [(name, t.detach().clone()) for name, t in model.state_dict().items()]


def assert_clear_error(call: Callable[[], object],
                       error: type[BaseException] | tuple[type[BaseException], ...],
                       words: Iterable[str], *, folder: Path | None = None, model=None,
                       settings: Callable[[], object] | None = None) -> BaseException:
    """``call()`` is refused with ``error``, whose message holds every one of ``words`` (the
    bad value and what to do), and leaves nothing half-done: ``folder`` holds the same files
    as before, ``model`` (an ``nn.Module``) the same weights and buffers, and ``settings()``
    returns what it returned before. Returns the exception, for checks of its own."""
    import torch

    files = _files(folder) if folder is not None else None
    state = _state(model) if model is not None else None
    before = settings() if settings is not None else None
    with pytest.raises(error) as info:
        call()
    assert_mentions(str(info.value), words)
    if folder is not None:
        assert _files(folder) == files, "a refused call left something behind"
    if model is not None:
        after = _state(model)
        assert [n for n, _ in after] == [n for n, _ in state] and all(
            torch.equal(a, b) for (_, a), (_, b) in zip(after, state, strict=True)), \
            "a refused call changed the model"
    if settings is not None:
        assert settings() == before, "a refused call changed a setting"
    return info.value


# -- commands and processes -------------------------------------------------------------------


def run_command(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd``, which must succeed; a failure shows the end of its output."""
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, \
        f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def execute_as_a_reader(nb: Any, timeout: int = 120, **client: Any) -> Any:
    """Execute ``nb`` in place in a kernel as Jupyter starts it (tools/nbmake_kernel.py): what
    C++ code writes to stderr is among the outputs, and the kernel is killed after its last
    cell. ``client`` goes to nbclient's NotebookClient."""
    from nbclient import NotebookClient

    from tools.nbmake_kernel import reader_environment

    NotebookClient(nb, timeout=timeout, kernel_name="python3", shutdown_kernel="immediate",
                   **client).execute(env=reader_environment())
    return nb


def run_bench(*argv: str) -> int:
    """``python -m bench`` in this process, without its progress bars."""
    from bench import __main__ as runner

    return runner.main(["--no-progress", *argv])


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (Linux: read from /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its exit status is left


# -- result documents (what ``python -m bench`` writes) ----------------------------------------

#: One figure of a result document; :func:`figure` varies it.
FIGURE = {"workload": "matmul", "chapter": 3, "name": "fp32_tflops", "value": 1.5,
          "unit": "TFLOP/s", "device": "cuda:0", "spread": 0.1, "note": ""}


def figure(**changes) -> dict:
    """:data:`FIGURE` with ``changes``."""
    return {**FIGURE, **changes}


def result_doc(slug: str = "gpu-x1", figures: list[dict] | None = None, *, gpu_count: int = 1,
               device_name: str | None = None, version: int = report.SCHEMA_VERSION,
               **changes) -> dict:
    """A result document of schema ``version`` that passes ``bench.schema.validate``: machine
    ``slug`` with ``gpu_count`` GPUs named ``device_name`` (default ``Device <slug>``) and its
    ``figures`` (default: one :data:`FIGURE`); ``changes`` replace top-level keys. Version 1
    lacks the machine keys version 2 added."""
    name = device_name or f"Device {slug}"
    machine = {"slug": slug, "device_name": name, "gpu_count": gpu_count,
               "gpus": [{"index": i, "name": name} for i in range(gpu_count)],
               "accelerator": "cuda" if gpu_count else None, "cpu": "Some CPU", "cpu_count": 8,
               "driver": "580.1" if gpu_count else None, "cuda": "13.0" if gpu_count else None,
               "torch": "2.14.1", "python": "3.11.9", "platform": "Linux",
               "book_commit": "abc1234def", "flags": {"cuda_matmul_allow_tf32": False}}
    if version == 1:
        for key in ("accelerator", "book_commit", "flags"):
            del machine[key]
    doc = {"schema_version": version, "date": "2026-01-02T03:04:05+00:00",
           "command": "python -m bench", "quick": False, "duration_s": 12.5, "machine": machine,
           "figures": [figure()] if figures is None else figures}
    return {**doc, **changes}


def write_result(folder: Path, content: Any, name: str | None = None) -> Path:
    """Write ``content`` (a document, or any JSON value or text) into ``folder`` as ``name``
    (default: the document's ``<slug>.json``)."""
    path = folder / (name or f"{content['machine']['slug']}.json")
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def check_report(docs: list[dict]) -> None:
    """What the appendix renders: a column per file, every figure, every machine named."""
    machines = report.machines_table(docs)
    assert list(machines.columns) == report.machine_labels(docs)
    for doc, label in zip(docs, report.machine_labels(docs), strict=True):
        assert machines.loc["device", label] == doc["machine"]["device_name"]
        assert machines.loc["torch", label] == doc["machine"]["torch"]
    table = report.figures_table(docs)
    assert report.missing_figures(docs, table) == []
    assert len(table) == len({(f["workload"], f["name"], f["unit"])
                              for d in docs for f in d["figures"]})
    gpu_labels = [label for label, doc in zip(report.machine_labels(docs), docs, strict=True)
                  if doc["machine"]["gpu_count"]]
    shares = report.peak_share_table(docs)
    speedups = report.speedup_table(docs)
    assert set(shares.columns) <= set(gpu_labels) and set(speedups.columns) <= set(gpu_labels)
    for name in report.workloads(docs):
        fig = report.plot_workload(docs, name)
        if fig is None:  # nothing to compare: the figures stay in the table
            assert not report.plot_panels(docs, name), name
            continue
        legend = {t.get_text() for t in fig.legends[0].get_texts()}
        for doc, label in zip(docs, report.machine_labels(docs), strict=True):
            if any(f["workload"] == name for f in doc["figures"]):
                assert any(text.startswith(label) for text in legend), (name, label)


FAKE_GPU = {"index": 0, "name": "Example GPU 80GB", "capability": "9.0", "memory_gib": 79.1,
            "multiprocessors": 132}


def write_results(folder: Path, monkeypatch: pytest.MonkeyPatch, gpu_machines: int = 1) -> None:
    """Run the real runner on fake workloads: this machine's CPU, plus made-up GPU machines."""
    from bench import __main__ as runner
    from bench import core

    # The CPU machine is this host's CPU with no accelerator, whatever this host has: on a GPU
    # host its own record would make the "CPU-only" file a GPU machine's. Every run measures
    # on the CPU, this host's only device as far as the runner knows, so no slug gets "-on-".
    real_info = {k: v for k, v in core.machine_info().items() if k != "hip"}
    cpu_info = {**real_info, "device_name": real_info["cpu"], "gpu_count": 0, "gpus": [],
                "accelerator": None, "driver": None, "cuda": None, "cudnn": None}
    with monkeypatch.context() as m:
        m.setattr(core, "WORKLOADS", {})
        m.setattr(runner, "load_workload_modules", lambda package=None: [])
        m.setattr(core, "machine_info", lambda: dict(cpu_info))
        m.setattr("helpers.devices.available_devices", lambda: ["cpu"])
        state = {"gpu": False, "scale": 1.0}

        @core.workload("matmul", 3)
        def matmul(device, *, quick):
            figs = [core.Figure("fp32 1024x1024 time", 0.02 / state["scale"], "s", "cpu",
                                spread=0.001),
                    core.Figure("fp32 1024x1024", 0.1 * state["scale"], "TFLOP/s", "cpu")]
            if state["gpu"]:
                figs.append(core.Figure("fp32 1024x1024", 50.0 * state["scale"], "TFLOP/s",
                                        "cuda:0", spread=0.4))
                figs.append(core.Figure("fp32_tflops_n1024", 40.0 * state["scale"], "TFLOP/s",
                                        "cuda:0"))
                figs.append(core.Figure("cpu_product_seconds", 2.0, "s", "cpu"))
                figs.append(core.Figure("product_seconds", 0.5 / state["scale"], "s", "cuda:0"))
            return figs

        @core.workload("mnist", 5)
        def mnist(device, *, quick):
            dev = "cuda:0" if state["gpu"] else "cpu"
            return [core.Figure("images per second", 900.0 * state["scale"], "images/s", dev)]

        assert run_bench("--device", "cpu", "--out", str(folder)) == 0
        state["gpu"] = True
        for i in range(gpu_machines):
            state["scale"] = 10.0 * (i + 1)
            gpu = {**FAKE_GPU, "name": f"Example GPU {i + 1} 80GB"}
            m.setattr(core, "machine_info", lambda gpu=gpu: {
                **real_info, "device_name": gpu["name"], "gpu_count": 1, "gpus": [gpu],
                "driver": "570.1", "cuda": "12.8", "cudnn": 90100, "accelerator": "cuda"})
            assert run_bench("--device", "cpu", "--out", str(folder)) == 0


# -- the book's pages --------------------------------------------------------------------------


def lesson_and_check(notebook: Path, marker: str) -> tuple[str, str]:
    """The source of the one cell of ``notebook`` that holds ``marker``, and of the hidden check
    cell right after it (tagged ``remove-cell``, starting ``# Check``), to run on the CPU."""
    cells = json.loads(notebook.read_text())["cells"]
    (index,) = [i for i, c in enumerate(cells) if marker in "".join(c["source"])]
    lesson, check = cells[index], cells[index + 1]
    assert "remove-cell" in check["metadata"].get("tags", [])
    assert "".join(check["source"]).startswith("# Check")
    return "".join(lesson["source"]), "".join(check["source"])


def toc_files() -> list[str]:
    """The book's pages, as _toc.yml lists them (paths without a suffix)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part["chapters"]]
    return files


# -- the troubleshooting page (chapter 9) ------------------------------------------------------

TROUBLESHOOTING = ROOT / "chapters" / "09_troubleshooting.md"
LABEL = re.compile(r"^\((err-[a-z0-9-]+)\)=$", re.M)
# The entry's last line, in small print: how it was checked.
# "Quoted for" where the tests cannot check the message on the machines that build the book.
MARK = re.compile(r"^<small>(?P<verb>Checked with|Quoted for) torch (?P<version>[\w.+]+): "
                  r"(?P<how>[^<]+)</small>$", re.M)
KINDS = {"reproduced live": "live", "found in installed files": "files",
         "found only in macOS builds": "macos"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def normalise(text: str) -> str:
    """Trailing spaces and terminal colour codes (bold text) do not count."""
    return "\n".join(line.rstrip() for line in ANSI.sub("", text).strip().splitlines())


@dataclass
class Entry:
    """One entry of the troubleshooting page: a message PyTorch prints, quoted."""

    label: str
    group: str
    heading: str
    blocks: list[str]
    version: str
    kind: str
    how: str
    text: str = field(repr=False)
    # Wordings of the oldest supported torch, where it prints the message differently: a block
    # whose paragraph before it ends with "torch X.Y.Z prints:".
    older: dict[str, list[str]] = field(default_factory=dict)


# A dropdown whose title starts "torch X.Y.Z" holds that torch's wording (the oldest supported);
# other dropdowns hold further forms of the message.
DROPDOWN = re.compile(r"^:::\{dropdown\} (?P<title>[^\n]+)\n(?P<body>.*?)^:::$", re.M | re.S)
OLDER = re.compile(r"^torch (\d+\.\d+\.\d+) ")


def read_entries() -> dict[str, Entry]:
    """The page's entries by label, each checked for the parts every entry has."""
    text = TROUBLESHOOTING.read_text()
    found: dict[str, Entry] = {}
    starts = [m.start() for m in LABEL.finditer(text)] + [len(text)]
    for start, end in zip(starts, starts[1:], strict=False):
        chunk = re.split(r"(?m)^\(grp-", text[start:end])[0]  # up to the next group
        label = LABEL.match(chunk).group(1)
        assert label not in found, f"label {label} appears twice"
        groups = re.findall(r"^## (.+)$", text[:start], re.M)
        heading = re.search(r"^### (.+)$", chunk, re.M)
        assert heading, f"[{label}] has no ### heading after its label"
        mark = MARK.search(chunk)
        assert mark, f"[{label}] has no '<small>Checked with torch X: ...</small>' line"
        kind = next((k for words, k in KINDS.items() if mark["how"].startswith(words)), None)
        assert kind, f"[{label}] says how it was checked in words the tests do not know"
        assert (mark["verb"] == "Quoted for") == (kind == "macos"), \
            f"[{label}] 'Quoted for' is for messages found only in macOS builds, and they use it"
        assert chunk.rstrip().endswith(mark[0]), f"[{label}] the 'Checked with' line is not last"
        blocks: list[str] = []
        older: dict[str, list[str]] = {}
        dropdowns = [(d.start("body"), d.end("body"), OLDER.match(d["title"]))
                     for d in DROPDOWN.finditer(chunk)]
        for block in re.finditer(r"```text\n(.*?)```", chunk, flags=re.S):
            version = next((v for start, end, v in dropdowns
                            if start <= block.start() < end), None)
            if version:
                older.setdefault(version[1], []).append(normalise(block[1]))
            else:
                blocks.append(normalise(block[1]))
        assert blocks, f"[{label}] quotes no message in a ```text block"
        found[label] = Entry(label, groups[-1] if groups else "", heading[1].strip(), blocks,
                             mark["version"], kind, mark["how"], chunk, older)
    return found


def type_name(cls: type) -> str:
    """How a traceback names an exception class."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def line(exc: BaseException) -> str:
    """The end of a traceback: ``ErrorType: message``."""
    return normalise(f"{type_name(type(exc))}: {exc}")


def raised(fn: Callable, *, expected: type = Exception) -> BaseException:
    """The exception ``fn()`` raises (an ``expected`` one); it must raise."""
    try:
        fn()
    except expected as exc:  # noqa: PERF203
        return exc
    raise AssertionError("no exception was raised")


# -- the built pages, each read once in Chromium -----------------------------------------------

#: Every code box (code cells and code blocks, hidden ones included) and every output box.
BOXES = "div.highlight pre, div.cell_output pre, div.cell_output div.output"
WIDGET = "application/vnd.jupyter.widget-view+json"
#: What the page tests check of a page as it opens (nothing unfolded yet), in one evaluation.
PAGE_FACTS = """([boxes, widget]) => {
  const article = document.querySelector('article.bd-article');
  const h1 = document.querySelector('article.bd-article h1');
  const imgs = Array.from(document.querySelectorAll('article.bd-article img'));
  return {
    title: document.title,
    h1: h1 ? h1.innerText : null,
    text: article ? article.innerText : null,
    colab: Array.from(document.querySelectorAll('a[href*="colab.research.google.com"]'))
      .map(a => a.getAttribute('href')),
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    alts: Array.from(document.querySelectorAll('article.bd-article .cell_output img'))
      .map(i => i.alt),
    clipped: Array.from(document.querySelectorAll(boxes))
      .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.slice(0, 80)),
    height: document.documentElement.scrollHeight,
    widgets: document.querySelectorAll(`script[type="${widget}"]`).length,
  };
}"""
#: Every dropdown title, with every folded part of the page (chapter 9's groups) unfolded so
#: that each title is laid out: [text, clipped, width].
DROPDOWN_TITLES = """() => {
  document.querySelectorAll('[hidden]').forEach(e => e.removeAttribute('hidden'));
  return Array.from(document.querySelectorAll('details.sd-dropdown > summary .sd-summary-text'))
    .map(e => [e.innerText.trim(), e.scrollWidth > e.clientWidth + 1,
               e.getBoundingClientRect().width]);
}"""


def read_built_page(browser, url: str, screenshot: Path | None = None) -> dict[str, Any]:
    """One load of a built page at 1280x900: what the page tests check of it (PAGE_FACTS as
    it opens, then its DROPDOWN_TITLES unfolded), and ``ok``, whether it loaded. With
    ``screenshot``, a full-page screenshot of it as it opens is saved there."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        response = page.goto(url, wait_until="load")
        facts = page.evaluate(PAGE_FACTS, [BOXES, WIDGET])
        facts["ok"] = response is not None and response.ok
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
        facts["dropdowns"] = page.evaluate(DROPDOWN_TITLES)
    finally:
        page.close()
    return facts


# -- chapter 7's DDP facts (helpers.ddp_mnist._buffer_and_sync_bn_facts) ---------------------

def check_buffer_and_sync_bn_facts(r0: dict, r1: dict) -> None:
    """What two gloo ranks recorded of DDP and BatchNorm (mp.spawn's demo and ``--ddp-facts``
    alike): at the start of every forward all ranks hold rank 0's buffers, after it their own;
    SyncBatchNorm replaces BatchNorm and refuses CPU tensors on every rank."""
    starts = [r["running_mean_at_forward_start"] for r in (r0, r1)]
    ends = [r["running_mean_after_forward"] for r in (r0, r1)]
    assert len(starts[0]) == len(ends[0]) == 3
    assert starts[0] == starts[1]
    assert all(a != b for a, b in zip(*ends, strict=True))
    assert starts[1][1] == ends[0][0]
    assert r0["sync_bn_type"] == r1["sync_bn_type"] == "SyncBatchNorm"
    refusal = "SyncBatchNorm expected input tensor to be on GPU"
    assert all(r["sync_bn_cpu_error"].startswith(refusal) for r in (r0, r1))
