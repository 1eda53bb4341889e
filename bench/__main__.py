"""The book's benchmark command: ``python -m bench`` (appendix: Measured results).

Runs every chapter's measured workload on this machine's best device and writes one result
file per machine, ``results/<machine>.json``, which the chapters and the appendix read.

    python -m bench                 # the full run; writes results/<machine>.json
    python -m bench --list          # the workloads it would run
    python -m bench --quick         # small sizes, a smoke test; writes _build/bench/
    python -m bench --only matmul   # one workload (repeatable); writes _build/bench/
    python -m bench --device cpu    # another device; the file name says which

Rules that keep the committed files trustworthy:

- The workloads are the modules beside this one (``bench/<name>.py``), found with
  :mod:`pkgutil`, so a new module is picked up without touching this file. A module that fails
  to import stops the run with its error: a result file never lacks a workload silently.
- The file is written only after every workload has succeeded and the document has passed the
  schema (:mod:`bench.schema`), through a temporary file in the same folder and
  :func:`os.replace`; a run that fails or is interrupted leaves the previous file as it was.
  A second full run on the same machine replaces that machine's file.
- Only a full run of every workload may write into the committed ``results/`` folder. Quick
  and partial (``--only``) runs go to the checkout's ``_build/bench/`` unless ``--out`` names
  another folder (an installed package without a checkout uses a new temporary folder and
  says where), and naming ``results/`` for them is refused.
- The output folder is checked for writing before anything is measured, and ``meta`` (shapes
  without data, no computation) is refused.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pkgutil
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from . import core, schema

#: Modules of this package that hold no workload.
NOT_WORKLOADS = frozenset({"core", "schema", "report"})

#: Exit statuses: 0 success, 1 a workload failed, 2 bad usage or a broken workload module.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class BenchError(Exception):
    """A problem that stops the run before any file is written; the message says what."""


def load_workload_modules(package: str = __package__) -> list[tuple[str, str]]:
    """Import every workload module of ``package``; return ``(module, error)`` for each failure.

    Modules whose names start with ``_`` and the package's own plumbing (``core``, ``schema``,
    ``report``) are not workloads.
    """
    pkg = importlib.import_module(package)
    failures = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in NOT_WORKLOADS:
            continue
        name = f"{package}.{info.name}"
        try:
            importlib.import_module(name)
        except Exception as exc:  # an import error in one module must be reported, not hidden
            failures.append((name, f"{type(exc).__name__}: {exc}"))
    return failures


def _chapter_key(w: core.Workload) -> tuple:
    return (0, w.chapter, "") if isinstance(w.chapter, int) else (1, 0, str(w.chapter))


def registered() -> list[core.Workload]:
    """The registered workloads in chapter order (registration order within a chapter)."""
    return sorted(core.WORKLOADS.values(), key=_chapter_key)


def machine_record(device: torch.device) -> dict[str, Any]:
    """``core.machine_info()`` plus the file's slug; a run on a device other than the machine's
    best one gets the device in its slug (``...-on-cpu``), so it never replaces the main file."""
    info = core.machine_info()
    slug = core.machine_slug(info)
    from helpers.devices import available_devices

    if str(device) != available_devices()[0]:
        slug = f"{slug}-on-{str(device).replace(':', '')}"
    return {"slug": slug, **info}


def _figures(workload: core.Workload, produced: Any) -> list[dict[str, Any]]:
    if not isinstance(produced, list) or not produced:
        raise BenchError(f"workload {workload.name!r} returned {type(produced).__name__} "
                         "instead of a non-empty list of Figure objects")
    rows = []
    for fig in produced:
        if not isinstance(fig, core.Figure):
            raise BenchError(f"workload {workload.name!r} returned {fig!r}, not a Figure")
        row = fig.as_dict()
        for key in ("value", "spread"):
            if row[key] is not None:
                row[key] = float(row[key])
                if not math.isfinite(row[key]):
                    raise BenchError(f"workload {workload.name!r}: figure {fig.name!r} has "
                                     f"{key} {row[key]}")
        rows.append({"workload": workload.name, "chapter": workload.chapter, **row})
    return rows


def _part_key(machine: dict[str, Any], device: torch.device, quick: bool) -> dict[str, Any]:
    """What a saved part must share with this run to be reused: the same machine, device,
    torch, book commit and sizes."""
    return {"slug": machine["slug"], "device": str(device), "torch": machine["torch"],
            "book_commit": machine["book_commit"], "quick": bool(quick)}


def _load_part(parts: Path, name: str, key: dict[str, Any]) -> dict[str, Any] | None:
    path = parts / f"{name}.json"
    try:
        part = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return part if part.get("key") == key else None


def run_workloads(workloads: Sequence[core.Workload], device: torch.device, *, quick: bool,
                  progress: bool = True, parts: Path | None = None,
                  key: dict[str, Any] | None = None, keep_going: bool = False,
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Run each workload once on ``device``; return (figures, per-workload records, the names
    of the workloads that failed).

    Without ``parts`` the first failure raises and nothing is written. With ``parts`` (a
    folder) each workload's figures are saved there as soon as it finishes, and a workload
    whose saved part matches ``key`` (:func:`_part_key`) is taken from it instead of run
    again: a run cut short keeps what it measured, and the next one completes the rest. With
    ``keep_going`` a failing workload is reported and the others still run.
    """
    from tqdm.auto import tqdm

    figures, records, failed = [], [], []
    bar = tqdm(workloads, desc="benchmark", unit="workload", disable=not progress)
    for w in bar:
        bar.set_postfix_str(w.name)
        saved = _load_part(parts, w.name, key) if parts is not None else None
        if saved is not None:
            figures += saved["figures"]
            records.append(saved["record"])
            bar.write(f"  {w.name} (chapter {w.chapter}): {len(saved['figures'])} figures "
                      f"measured earlier, taken from {parts / (w.name + '.json')}")
            continue
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            rows = _figures(w, w.fn(device, quick=quick))
        except Exception as exc:
            if not keep_going:
                raise
            traceback.print_exc()
            bar.write(f"  {w.name} (chapter {w.chapter}): FAILED ({type(exc).__name__}: {exc})")
            failed.append(w.name)
            continue
        seconds = time.perf_counter() - start
        record = {"name": w.name, "chapter": w.chapter, "description": w.description,
                  "figures": len(rows), "duration_s": round(seconds, 3)}
        figures += rows
        records.append(record)
        if parts is not None:
            write_atomically({"key": key, "record": record, "figures": rows},
                             parts / f"{w.name}.json")
        bar.write(f"  {w.name} (chapter {w.chapter}): {len(rows)} figures in {seconds:.1f} s")
    bar.close()
    return figures, records, failed


def write_atomically(doc: dict[str, Any], path: Path) -> None:
    """Write ``doc`` as JSON to ``path`` through a temporary file in the same folder and
    :func:`os.replace`, so ``path`` holds either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default_scratch() -> Path:
    """``_build/bench`` in the book's checkout; without a checkout (an installed package), a
    new temporary folder: never the home folder, ``/`` or ``site-packages``."""
    root = core.book_root()
    if root is not None:
        return root / "_build" / "bench"
    return Path(tempfile.mkdtemp(prefix="book-bench-"))


def _check_writable(folder: Path) -> str | None:
    """Why a result file cannot be written into ``folder``, or None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run every chapter's measured workload on this machine and write "
                    "results/<machine>.json (the figures the chapters and the appendix show).")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--only", action="append", metavar="WORKLOAD", default=[],
                   help="run only this workload (repeatable); a partial run is written to "
                        "_build/bench/ unless --out says otherwise")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, a smoke test; written to _build/bench/ unless --out "
                        "says otherwise, never to results/")
    p.add_argument("--device", help="device to measure on (default: the best one here, or "
                                    "$BOOK_DEVICE)")
    p.add_argument("--out", type=Path, help="folder for the result file (default: results/ "
                                            "for a full run, the checkout's _build/bench/ "
                                            "otherwise)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--parts", type=Path,
                   help="save each workload's figures in this folder as it finishes, and reuse "
                        "the ones saved there by an earlier run of this machine, torch and "
                        "commit: a run cut short keeps what it measured")
    p.add_argument("--allow-partial", action="store_true",
                   help="with --parts: when some workloads fail, still write the result file "
                        "with the others, listing the missing ones in it")
    return p


def _same_folder(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    from helpers.devices import best_device
    from helpers.results import results_dir

    broken = load_workload_modules()
    for module, error in broken:
        print(f"error: the workload module {module} failed to import: {error}", file=sys.stderr)
    workloads = registered()

    if args.list:
        for w in workloads:
            summary = w.description.splitlines()[0] if w.description else ""
            print(f"{w.name:<16} chapter {w.chapter!s:<9} {summary}")
        if not workloads:
            print("no workloads are registered")
        return EXIT_USAGE if broken else EXIT_OK
    if broken:
        print("No result file was written: fix the module(s) above and run again.",
              file=sys.stderr)
        return EXIT_USAGE
    if not workloads:
        print("error: no workloads are registered; nothing to measure.", file=sys.stderr)
        return EXIT_USAGE

    known = {w.name for w in workloads}
    unknown = [name for name in args.only if name not in known]
    if unknown:
        print(f"error: unknown workload(s) {', '.join(map(repr, unknown))}; known: "
              f"{', '.join(sorted(known))}", file=sys.stderr)
        return EXIT_USAGE
    if args.only:
        workloads = [w for w in workloads if w.name in set(args.only)]
    full = not args.quick and len(workloads) == len(known)
    committed_dir = results_dir()
    if args.out is not None:
        out = args.out
    elif full and (core.book_root() is not None or os.environ.get("BOOK_RESULTS_DIR")):
        out = committed_dir
    else:
        out = _default_scratch()
        if core.book_root() is None:
            print(f"No checkout of the book here: the result file goes to the temporary folder "
                  f"{out} (name another with --out).")
    if not full and _same_folder(out, committed_dir):
        print(f"error: a quick or partial run may not write into {committed_dir}, which holds "
              "the committed full runs; choose another folder with --out.", file=sys.stderr)
        return EXIT_USAGE

    try:
        device = best_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    unwritable = _check_writable(out)
    if unwritable is not None:
        print(f"error: cannot write the result file into {out} ({unwritable}); nothing was "
              "measured. Choose a writable folder with --out.", file=sys.stderr)
        return EXIT_USAGE
    machine = machine_record(device)
    machine_problems = schema.validate_machine(machine)
    if machine_problems:
        print("error: this machine cannot be described completely, so its results could not "
              "be labelled:\n  - " + "\n  - ".join(machine_problems), file=sys.stderr)
        return EXIT_USAGE

    path = out / f"{machine['slug']}.json"
    if full:
        kind = "full"
    else:
        kind = " and ".join(k for k, on in (("quick", args.quick),
                                            ("partial", len(workloads) < len(known))) if on)
    print(f"Measuring {len(workloads)} workload(s) ({kind} run) on {device} "
          f"[{machine['device_name']}], torch {machine['torch']}; result file: {path}")
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    if args.allow_partial and args.parts is None:
        print("error: --allow-partial needs --parts (the folder that keeps each workload's "
              "figures)", file=sys.stderr)
        return EXIT_USAGE
    key = _part_key(machine, device, args.quick)
    try:
        figures, records, failed = run_workloads(
            workloads, device, quick=args.quick, progress=not args.no_progress,
            parts=args.parts, key=key, keep_going=args.parts is not None)
    except KeyboardInterrupt:
        kept = f"; the workloads that finished are kept in {args.parts}" if args.parts else ""
        print(f"\nInterrupted: {path} was left unchanged{kept}.", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        traceback.print_exc()
        print(f"error: the benchmark failed ({type(exc).__name__}: {exc}); {path} was left "
              "unchanged.", file=sys.stderr)
        return EXIT_FAILED

    if failed and not (args.allow_partial and records):
        print(f"error: workload(s) {', '.join(failed)} failed, so {path} was left unchanged; "
              f"the others are kept in {args.parts} and the next run with --parts measures "
              "only what is missing (--allow-partial writes what there is).", file=sys.stderr)
        return EXIT_FAILED
    doc = {
        "schema_version": schema.SCHEMA_VERSION,
        "date": started.isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", *argv]),
        "quick": bool(args.quick),
        "device": str(device),
        "duration_s": round(time.perf_counter() - t0, 1),
        "machine": machine,
        "workloads": records,
        "figures": figures,
    }
    if failed:
        doc["missing_workloads"] = failed
    problems = schema.validate(doc)
    if problems:
        print("error: the measured figures do not match the result-file schema, so "
              f"{path} was left unchanged:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return EXIT_FAILED
    existed = path.exists()
    write_atomically(doc, path)
    print(f"{'Replaced' if existed else 'Wrote'} {path}: {len(figures)} figures from "
          f"{len(records)} workload(s) in {doc['duration_s']:.0f} s"
          + (f"; missing: {', '.join(failed)}." if failed else "."))
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
