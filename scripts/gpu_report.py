"""The GPU report: run the whole book on this machine and record what it shows.

    python scripts/gpu_report.py                  # every chapter + the full benchmark
    make gpu-report                               # the same
    python scripts/gpu_report.py --wheelhouse W   # first install from a wheelhouse, offline
    python scripts/gpu_report.py --chapters 01_devices,05_mnist --quick --results /tmp/r

It executes every chapter on this machine's best device (or ``$BOOK_DEVICE``), keeping the
executed notebooks in ``_build/gpu-report/chapters/``; runs the benchmark; and writes, under
``results/``:

- ``<machine>.json``, the benchmark's result file (only a full run writes it there);
- ``pages/<machine>/<chapter>.ipynb``, each executed chapter, stamped (in its metadata and in a
  short note under its title) with the device, driver, CUDA, torch, the book's commit, the
  date and a hash of the chapter's code cells.

The book build (``stage``) shows a recorded page instead of the CPU build's outputs when its
code hash matches the chapter's current code; otherwise the CPU outputs, saying so:

    python scripts/gpu_report.py stage --executed _executed/chapters --out _build/pages/chapters

It runs with whatever torch the machine has, at or above the book's minimum, and records it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
WORK = ROOT / "_build" / "gpu-report"
STAMP_TAG = "recorded-run-stamp"
CPU_NOTE_TAG = "cpu-run-note"
#: What the wheelhouse's requirements name, installed offline with ``--wheelhouse``.
WHEELHOUSE_REQUIREMENTS = "requirements.txt"
MNIST_ARCHIVE = "mnist-raw.tar.gz"


def code_hash(nb) -> str:
    """SHA-256 of a notebook's code cells (sources only, in order): a recorded page is
    current while this matches the chapter's."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.strip().encode())
            digest.update(b"\0")
    return digest.hexdigest()


def _notebook_tools():
    spec = importlib.util.spec_from_file_location("book_notebook_tools", ROOT / "scripts" / "notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Recording ---------------------------------------------------------------------------------

def install_wheelhouse(wheelhouse: Path) -> None:
    """Install what the wheelhouse holds, without a network, and unpack its MNIST archive."""
    requirements = wheelhouse / WHEELHOUSE_REQUIREMENTS
    if not requirements.exists():
        raise SystemExit(f"{wheelhouse} has no {WHEELHOUSE_REQUIREMENTS}: build it with "
                         "`python scripts/wheelhouse.py --out DIR` on a machine with internet")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
           "--find-links", str(wheelhouse)]
    if requirements.read_text().split():
        subprocess.run([*pip, "-r", str(requirements)], check=True)
    # The book's own helpers, as this wheelhouse built them, replace any older copy.
    helpers_wheels = sorted(wheelhouse.glob("pytorch_on_the_gpu_helpers-*.whl"))
    if helpers_wheels:
        subprocess.run([*pip, "--force-reinstall", "--no-deps", str(helpers_wheels[-1])],
                       check=True)
    importlib.invalidate_caches()  # the packages just installed must be importable now
    archive = wheelhouse / MNIST_ARCHIVE
    if archive.exists():
        unpack_mnist(archive)


def unpack_mnist(archive: Path) -> Path:
    """Unpack ``MNIST/raw/*`` from ``archive`` into the book's data folder, unless it is there."""
    from helpers.data import data_dir

    target = data_dir()
    raw = target / "MNIST" / "raw"
    if raw.is_dir() and len(list(raw.iterdir())) >= 4:
        return raw
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("MNIST/raw/")
                   and ".." not in Path(m.name).parts]
        tar.extractall(target, members=members, filter="data")
    print(f"Unpacked {len(members)} MNIST files into {raw}")
    return raw


def check_torch() -> str:
    import torch

    import helpers

    version = str(torch.__version__)
    if helpers._release(version) < helpers._release(helpers.MIN_TORCH):
        raise SystemExit(f"torch {version} is older than {helpers.MIN_TORCH}, the oldest the "
                         f"book supports: install torch>={helpers.MIN_TORCH} first")
    return version


def stamp_text(run: dict[str, Any]) -> str:
    """The note under a recorded page's title."""
    versions = [f"torch {run['torch']}"]
    if run.get("cuda"):
        versions.append(f"CUDA {run['cuda']}")
    if run.get("hip"):
        versions.append(f"ROCm/HIP {run['hip']}")
    if run.get("driver"):
        versions.append(f"driver {run['driver']}")
    commit = run.get("book_commit") or "unknown"
    return ("```{note}\n"
            f"The outputs on this page come from a run on **{run['machine_label']}** "
            f"(`{run['device']}`; {', '.join(versions)}), recorded {run['date'][:10]} from the "
            f"book's commit `{commit[:10]}`. CI also runs this page on a CPU-only machine.\n"
            "```")


def stamp_page(nb, chapter, run: dict[str, Any]):
    """Put the run's record in the metadata (``book.recorded_run``) and the note under the title."""
    import nbformat

    nb.metadata.setdefault("book", {})["recorded_run"] = {**run, "code_hash": code_hash(chapter)}
    cell = nbformat.v4.new_markdown_cell(stamp_text(run))
    cell.metadata["tags"] = [STAMP_TAG]
    cell["id"] = "recorded-run-stamp"
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, cell)
    return nb


def execute(path: Path, timeout: int) -> tuple[bool, str]:
    """Execute ``path`` in place in its own folder, as the book build does."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
        error = ""
    except CellExecutionError as exc:
        error = str(exc)[-2000:]
    except Exception as exc:  # a dead kernel or a timeout: record it, go on with the others
        error = f"{type(exc).__name__}: {exc}"[-2000:]
    nbformat.write(nb, path)
    return not error, error


def record(args: argparse.Namespace) -> int:
    if args.wheelhouse:
        install_wheelhouse(args.wheelhouse)
    if args.install_only:
        return 0
    try:
        import helpers  # noqa: F401
    except ImportError:
        raise SystemExit("the book's helpers are not installed here: `pip install --no-deps -e .`"
                         " in the book's folder, or pass --wheelhouse") from None
    torch_version = check_torch()
    if args.data:
        unpack_mnist(args.data)
    import nbformat

    from helpers.bench import __main__ as runner
    from helpers.bench import core
    from helpers.bench.report import machine_label
    from helpers.devices import best_device
    from helpers.results import results_dir

    device = best_device(None)
    machine = runner.machine_record(device)
    slug = machine["slug"]
    results = args.results or results_dir()
    pages = results / "pages" / slug
    work = args.work / "chapters"
    work.mkdir(parents=True, exist_ok=True)
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run = {"slug": slug, "machine_label": machine_label({"machine": machine}),
           "device": str(device), "device_name": machine["device_name"],
           "gpu_count": machine["gpu_count"], "accelerator": machine["accelerator"],
           "driver": machine["driver"], "cuda": machine["cuda"], "hip": machine.get("hip"),
           "torch": torch_version, "python": machine["python"],
           "book_commit": core.book_commit(), "date": date}
    chosen = sorted(CHAPTERS.glob("*.ipynb"))
    if args.chapters:
        wanted = [c.strip().removesuffix(".ipynb") for c in args.chapters.split(",") if c.strip()]
        unknown = [w for w in wanted if not (CHAPTERS / f"{w}.ipynb").exists()]
        if unknown:
            raise SystemExit(f"no such chapter(s): {', '.join(unknown)}; known: "
                             f"{', '.join(p.stem for p in chosen)}")
        chosen = [CHAPTERS / f"{w}.ipynb" for w in wanted]
    print(f"GPU report for {run['machine_label']} on {device}, torch {torch_version}: "
          f"{len(chosen)} chapter(s), then the {'quick' if args.quick else 'full'} benchmark.")
    tools = _notebook_tools()
    summary: dict[str, Any] = {"run": run, "chapters": {}}
    for source in chosen:
        target = work / source.name
        shutil.copy(source, target)
        start = time.perf_counter()
        ok, error = execute(target, args.timeout)
        seconds = round(time.perf_counter() - start, 1)
        summary["chapters"][source.stem] = {"ok": ok, "seconds": seconds, "error": error}
        print(f"  {source.stem}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not ok:
            print("    " + error.strip().splitlines()[-1] if error.strip() else "", flush=True)
            continue
        nb = nbformat.read(target, as_version=4)
        tools.trim_errors(nb)
        nbformat.write(nb, target)
        page = stamp_page(nb, nbformat.read(source, as_version=4), run)
        pages.mkdir(parents=True, exist_ok=True)
        nbformat.write(page, pages / source.name)

    bench = [sys.executable, "-m", "helpers.bench", "--no-progress"]
    if args.quick:
        bench.append("--quick")
    for name in args.bench_only:
        bench += ["--only", name]
    # A full run writes results/<machine>.json; a smoke test writes where it was told to, or
    # into the work folder, never into the committed results/.
    out = args.results or (args.work / "bench" if args.quick or args.bench_only else None)
    if out is not None:
        bench += ["--out", str(out)]
    env = {**os.environ, "BOOK_COMMIT": run["book_commit"]}
    print("Benchmark: " + " ".join(bench[1:]), flush=True)
    bench_rc = subprocess.run(bench, cwd=ROOT, env=env).returncode
    summary["benchmark"] = {"command": bench[1:], "returncode": bench_rc}
    (args.work / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [name for name, c in summary["chapters"].items() if not c["ok"]]
    print(f"Pages in {pages}; executed notebooks in {work}; summary in {args.work / 'report.json'}")
    if failed or bench_rc:
        print(f"Not complete: failed chapter(s) {', '.join(failed) or 'none'}; benchmark exit "
              f"status {bench_rc}.", file=sys.stderr)
        return 1
    if args.quick or args.bench_only:
        print("Done: a smoke test (quick or partial benchmark), not for committing.")
    else:
        print(f"Done. Commit results/{slug}.json and results/pages/{slug}/ (never edit them).")
    return 0


# Staging the book's pages ------------------------------------------------------------------

def recorded_pages(pages: Path, stem: str) -> list[tuple[Path, Any]]:
    import nbformat

    found = []
    for path in sorted(pages.glob(f"*/{stem}.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if "recorded_run" in nb.metadata.get("book", {}):
            found.append((path, nb))
    return found


def choose_page(chapter, pages: Path, stem: str):
    """The recorded run to show for a chapter: ``(page, stale_runs)``. ``page`` is the newest
    recorded GPU run whose code hash matches ``chapter``'s code, or None; ``stale_runs`` are
    the recorded runs made with other code."""
    current = code_hash(chapter)
    matching, stale = [], []
    for path, nb in recorded_pages(pages, stem):
        run = nb.metadata["book"]["recorded_run"]
        (matching if run.get("code_hash") == current else stale).append((run, path, nb))
    matching.sort(key=lambda item: (bool(item[0].get("gpu_count")), item[0].get("date", "")))
    return (matching[-1][2] if matching else None), [run for run, _, _ in stale]


def cpu_note(stale: list[dict[str, Any]]) -> str:
    if stale:
        why = ("the recorded run on " + ", ".join(sorted({r['machine_label'] for r in stale}))
               + " was made with an earlier version of this page's code")
    else:
        why = "no run of this page on a GPU is recorded yet"
    return (f"```{{note}}\nThe outputs on this page come from the book's CPU-only build machine: "
            f"{why}.\n```")


def stage(args: argparse.Namespace) -> int:
    import nbformat

    args.out.mkdir(parents=True, exist_ok=True)
    shown = []
    for executed in sorted(args.executed.glob("*.ipynb")):
        chapter_path = args.chapter_dir / executed.name
        if not chapter_path.exists():
            continue
        chapter = nbformat.read(chapter_path, as_version=4)
        page, stale = choose_page(chapter, args.pages, executed.stem)
        if page is None:
            page = nbformat.read(executed, as_version=4)
            if page.metadata.get("book", {}).get("best_on", "gpu") != "cpu":
                cell = nbformat.v4.new_markdown_cell(cpu_note(stale))
                cell.metadata["tags"] = [CPU_NOTE_TAG]
                cell["id"] = "cpu-run-note"
                page.cells.insert(1 if page.cells and page.cells[0].cell_type == "markdown"
                                  else 0, cell)
        else:
            shown.append(f"{executed.stem} ({page.metadata['book']['recorded_run']['slug']})")
        nbformat.write(page, args.out / executed.name)
    print("Recorded GPU pages shown: " + (", ".join(shown) if shown else "none"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    parser.add_argument("--chapters", default=os.environ.get("BOOK_REPORT_CHAPTERS", ""),
                        help="comma-separated chapter file names to run (default: every chapter,"
                             " or $BOOK_REPORT_CHAPTERS)")
    parser.add_argument("--quick", action="store_true",
                        help="the benchmark at quick sizes (a smoke test; never committed)")
    parser.add_argument("--bench-only", action="append", default=[], metavar="WORKLOAD",
                        help="run only this benchmark workload (repeatable; a smoke test)")
    parser.add_argument("--results", type=Path,
                        help="folder for the result file and pages (default: results/)")
    parser.add_argument("--work", type=Path, default=WORK,
                        help="folder for the executed notebooks (default: _build/gpu-report)")
    parser.add_argument("--wheelhouse", type=Path,
                        help="install the missing packages from this folder, offline, first")
    parser.add_argument("--data", type=Path, help="an MNIST archive (MNIST/raw/*) to unpack")
    parser.add_argument("--install-only", action="store_true",
                        help="only install from --wheelhouse (and unpack its data), then stop")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    s = sub.add_parser("stage", help="choose the outputs each page of the book shows")
    s.add_argument("--executed", type=Path, required=True, help="the CPU-executed chapters")
    s.add_argument("--out", type=Path, required=True, help="where the book's pages go")
    s.add_argument("--chapter-dir", type=Path, default=CHAPTERS, help="the current chapters")
    s.add_argument("--pages", type=Path, default=ROOT / "results" / "pages",
                   help="the recorded runs (results/pages)")
    args = parser.parse_args(argv)
    if args.cmd == "stage":
        return stage(args)
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
