"""The GPU report: run the whole book on this machine and record what it shows.

    python tools/gpu_report.py                  # every chapter + the full benchmark
    make gpu-report                               # the same
    python tools/gpu_report.py --wheelhouse W   # first install from a wheelhouse, offline
    python tools/gpu_report.py --chapters 01_devices,05_mnist --quick --results /tmp/r

It runs the benchmark, then executes every chapter (the appendix excepted: the book renders
it from ``results/``) on this machine's best device (or ``$BOOK_DEVICE``), keeping the
executed notebooks in ``_build/gpu-report/chapters/``, and writes, under ``results/``:

- ``<machine>.json``, the benchmark's result file (only a full run writes it there);
- ``pages/<machine>/<chapter>.ipynb``, each executed chapter, stamped (in its metadata and in a
  short note under its title) with the device, driver, CUDA, torch, the book's commit, the
  date and a hash of the chapter's code cells.

Everything runs with this checkout's ``helpers`` (first on ``sys.path`` and ``PYTHONPATH``), so
an installed copy never decides where pages, data or the commit come from. Without a GPU (or
another accelerator) it refuses, unless ``--allow-cpu``. A copy of the book without ``.git``
names its commit with ``BOOK_COMMIT``.

The book build (``stage``) shows a recorded run when its code hash matches the chapter's current
code: the current chapter (its prose from the CPU build) with the recorded outputs of its code
cells, except the committed-figures tables, which come from the CPU build so they list every
committed machine; otherwise the CPU outputs, saying so:

    python tools/gpu_report.py stage --executed _executed/chapters --out _build/pages/chapters

It runs with whatever torch the machine has, at or above the book's minimum, and records it.

In lanes: the benchmark, then every chapter whose outputs or claims are timings
(:data:`RUN_ALONE`), each alone on the machine; then the chapters that measure no time,
``--workers`` at a time, beside the unit tests (``--tests``, their own part, on
``--test-workers``). Each page's stamp says whether it ran alone or beside others. Every
chapter's kernel starts, and imports the chapter's packages, all at once before the benchmark
(:class:`Turn`; ``--cold-kernels``: each at its turn).
``--budget`` bounds the whole run: past it (or on SIGINT or SIGTERM) what runs is stopped,
the rest does not start, and the summary and the archive are still written.
``--archive FILE`` packs everything the run wrote into one file (at most 16 MiB), for a
machine one cannot keep; on the machine one keeps, in the book's folder:

    python tools/gpu_report.py unpack FILE   # then commit results/
"""

from __future__ import annotations

import argparse
import atexit
import copy
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
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
#: The wheelhouse's MNIST archive: xz now, gzip in wheelhouses built before.
MNIST_ARCHIVES = ("mnist-raw.tar.xz", "mnist-raw.tar.gz")
#: Rendered by the book from results/, never recorded: it must list every committed machine.
NOT_RECORDED_PREFIX = "appendix"


def use_checkout() -> None:
    """Make this checkout's ``helpers`` the one that runs, here and in every process started
    from here (kernels, the benchmark), ahead of any installed copy: the pages, the data and
    the commit then belong to this book folder."""
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *rest])
    importlib.invalidate_caches()
    loaded = sys.modules.get("helpers")
    if loaded is not None and Path(loaded.__file__).resolve().parent != ROOT / "helpers":
        raise SystemExit(f"helpers was already imported from {loaded.__file__}, not from {ROOT}")


def code_hash(nb) -> str:
    """SHA-256 of a notebook's code cells (sources only, in order): a recorded page is
    current while this matches the chapter's."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.strip().encode())
            digest.update(b"\0")
    return digest.hexdigest()


# Recording ---------------------------------------------------------------------------------

def installed_versions() -> dict[str, str]:
    """The distributions this Python sees, by normalised name."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normal(name), dist.version)
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels_to_install(wheelhouse: Path, installed: dict[str, str]) -> tuple[list[Path], list[str]]:
    """The wheelhouse's wheels this machine lacks, and those it has in the same version
    (skipped). A wheel of a package this machine has in another version stops everything:
    installing it would replace the server's own. The helpers wheel is never installed: the
    report runs this checkout's helpers (use_checkout), and an installed copy would silently
    shadow later edits to helpers/ in any run without PYTHONPATH."""
    install, same, clash = [], [], []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        name = _normal(name)
        if name == "pytorch-on-the-gpu-helpers":
            continue
        if name not in installed:
            install.append(wheel)
        elif installed[name] == version:
            same.append(f"{name} {version}")
        else:
            clash.append(f"{name} (the wheelhouse has {version}, this machine {installed[name]})")
    if clash:
        raise SystemExit(
            f"{wheelhouse} would replace package(s) this machine has: {'; '.join(clash)}. "
            "Nothing was installed. Build a wheelhouse for this server: `python -m pip list "
            "--format=freeze > server.txt` here, then `python tools/wheelhouse.py --out DIR "
            "--server-has server.txt` on a machine with internet.")
    return install, same


def install_wheelhouse(wheelhouse: Path) -> None:
    """Install the wheels this machine lacks from the wheelhouse, offline and without their
    dependencies (``--no-deps``: pip replaces and upgrades nothing the machine has), and
    unpack its MNIST archive."""
    requirements = wheelhouse / WHEELHOUSE_REQUIREMENTS
    manifest = wheelhouse / "wheelhouse.json"
    if not requirements.exists():
        raise SystemExit(f"{wheelhouse} has no {WHEELHOUSE_REQUIREMENTS}: build it with "
                         "`python tools/wheelhouse.py --out DIR` on a machine with internet")
    install, same = wheels_to_install(wheelhouse, installed_versions())
    if same:
        print(f"Already here in the same version: {', '.join(same)}")
    if install:
        before = pip_check()
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                            "--no-deps", *map(str, install)], check=True)
        except subprocess.CalledProcessError:
            built = json.loads(manifest.read_text()).get("python") if manifest.exists() else None
            raise SystemExit(
                f"pip could not install the wheels of {wheelhouse} (its message is above). "
                "The wheelhouse was built for Python "
                f"{built or 'an unrecorded version'}, this is {sys.version_info.major}."
                f"{sys.version_info.minor}: build one for this machine with `make wheelhouse "
                "WHEEL_PYTHON=X.Y` (WHEEL_PLATFORM for another platform).") from None
        print(f"Installed {len(install)} wheel(s) from {wheelhouse}")
        # What the install broke or left unmet; what pip check said before is the machine's own.
        new = sorted(pip_check() - before)
        if new:
            print("pip check, since the install (a chapter that imports these may fail; build "
                  "the wheelhouse with --server-has, this machine's `pip list "
                  "--format=freeze`):\n" + "\n".join(f"  {line}" for line in new),
                  file=sys.stderr)
    importlib.invalidate_caches()  # the packages just installed must be importable now
    for name in MNIST_ARCHIVES:
        if (wheelhouse / name).exists():
            unpack_mnist(wheelhouse / name)
            break


def pip_check() -> set[str]:
    """What ``pip check`` says is unmet or conflicting here, a line each (none when it finds
    nothing broken)."""
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                           text=True)
    return {line.strip() for line in (check.stdout or "").splitlines()
            if line.strip() and not line.startswith("No broken requirements")}


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
    print(f"Unpacked {len(members)} MNIST files into {shown(raw)}")
    return raw


def check_torch() -> str:
    """This machine's torch version; exits when it is older than the book's minimum."""
    try:
        import torch
    except ImportError:
        raise SystemExit("torch is not installed here: the report runs with the machine's own "
                         "torch (>= the book's minimum); install it first") from None

    import helpers

    version = str(torch.__version__)
    if helpers._release(version) < helpers._release(helpers.MIN_TORCH):
        raise SystemExit(f"torch {version} is older than {helpers.MIN_TORCH}, the oldest the "
                         f"book supports: install torch>={helpers.MIN_TORCH} first")
    return version


class Stopper:
    """Stops the parts of a run that are running, once: when the ``--budget`` is spent or a
    SIGINT or SIGTERM comes. Each command run with :func:`run_logged` is asked to stop (SIGINT:
    pytest then prints its summary; SIGTERM to its process group after :attr:`GRACE` seconds,
    SIGKILL after as many again), and each chapter's kernel is killed (its chapter then fails,
    saying it was cut short). After it, no part starts; the report writes what it has."""

    #: Seconds a command gets after SIGINT, and again after SIGTERM, before the next signal.
    GRACE = 10.0

    def __init__(self) -> None:
        self.event = threading.Event()
        self.why = ""
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._kernels: set[Any] = set()

    def __bool__(self) -> bool:
        return self.event.is_set()

    def stop(self, why: str) -> None:
        """Stop everything running, saying ``why``. Safe in a signal handler: the work is done
        by threads, so this returns at once."""
        with self._lock:
            if self.event.is_set():
                return
            self.why = why
            self.event.set()
            procs, kernels = list(self._procs), list(self._kernels)
        print(f"Stopping ({why}): what was recorded is kept and written out.", file=sys.stderr,
              flush=True)
        for proc in procs:
            threading.Thread(target=self._stop_process, args=(proc,), daemon=True).start()
        if kernels:
            threading.Thread(target=self._kill_kernels, daemon=True).start()

    def add_process(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.add(proc)
            stopped = self.event.is_set()
        if stopped:  # started as the run was being stopped
            threading.Thread(target=self._stop_process, args=(proc,), daemon=True).start()

    def remove_process(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)

    def add_kernel(self, km: Any) -> None:
        with self._lock:
            self._kernels.add(km)

    def remove_kernel(self, km: Any) -> None:
        with self._lock:
            self._kernels.discard(km)

    def _stop_process(self, proc: subprocess.Popen) -> None:
        """SIGINT to the command (pytest prints its summary, the benchmark keeps its parts),
        then SIGTERM and SIGKILL to its process group (xdist's workers among it)."""
        for sig, whom in ((signal.SIGINT, "leader"), (signal.SIGTERM, "group"),
                          (signal.SIGKILL, "group")):
            try:
                if whom == "leader":
                    os.kill(proc.pid, sig)
                else:
                    os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(self.GRACE)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone: what it started in its group goes with it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return

    def _kill_kernels(self) -> None:
        """Kill each running chapter's kernel (its process group), until none is left: nbclient
        then finds it dead and the chapter returns. A kernel still starting is killed on a
        later pass."""
        deadline = time.monotonic() + 2 * self.GRACE
        while time.monotonic() < deadline:
            with self._lock:
                kernels = list(self._kernels)
            if not kernels:
                return
            for km in kernels:
                provisioner = getattr(km, "provisioner", None)
                group = getattr(provisioner, "pgid", None) or getattr(provisioner, "pid", None)
                if group:
                    try:
                        os.killpg(group, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.5)


#: The stopper of the run in progress (:func:`record`), which :func:`execute` tells about its
#: kernels; None outside a run.
_stopper: Stopper | None = None


def run_logged(command: list[str], env: dict[str, str], log: Path, echo: bool,
               stopper: Stopper | None = None) -> int:
    """Run ``command`` in the checkout, in a process group of its own, with its output in
    ``log`` line by line as it comes (and here, if ``echo``): a command stopped or killed
    keeps its log. ``stopper`` stops it (:class:`Stopper`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", buffering=1) as f:  # line-buffered: each line is on disk at once
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        if stopper is not None:
            stopper.add_process(proc)
        try:
            for line in proc.stdout:
                f.write(line)
                if echo:
                    print(line, end="", flush=True)
            return proc.wait()
        finally:
            if stopper is not None:
                stopper.remove_process(proc)
            if proc.poll() is None:  # this report itself is being ended: end the command too
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _last_line(log: Path) -> str:
    if not log.exists():
        return "no output"
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no output"


def stamp_text(run: dict[str, Any]) -> str:
    """The note under a recorded page's title."""
    from helpers.results import software_versions

    versions = software_versions(run)
    commit = run.get("book_commit") or "unknown"
    # Pages recorded before the report had lanes say nothing about it.
    lane = {None: "", "alone": " It ran alone on the machine."}.get(
        run.get("ran"), f" It measures no time and ran {run.get('ran')}.")
    return ("```{note}\n"
            f"The outputs on this page come from a run on **{run['machine_label']}** "
            f"(`{run['device']}`; {', '.join(versions)}), recorded {run['date'][:10]} from the "
            f"book's commit `{commit[:10]}`.{lane} CI also runs this page on a CPU-only "
            "machine.\n```")


def stamp_page(nb, chapter, run: dict[str, Any]):
    """Put the run's record in the metadata (``book.recorded_run``) and the note under the title."""
    nb.metadata.setdefault("book", {})["recorded_run"] = {**run, "code_hash": code_hash(chapter)}
    _insert_note(nb, stamp_text(run), STAMP_TAG)
    return nb


# No absolute path of this machine in what the report writes --------------------------------

def machine_places(*extra: tuple[Path | None, str]) -> list[tuple[str, str]]:
    """This machine's folders that a page, log or result file must not name, each with the
    word that stands for it (the book's folder is ``BOOK``, the home folder ``~``, Python's
    own folders ``PYTHON``, ``STDLIB`` and ``SITE``; ``extra`` adds the report's own, such as
    ``WORK``), the longest first, so that the most precise word wins."""
    import sysconfig

    # A Python installed in a folder other programs share (/usr: Ubuntu's python3, the base
    # of the H200 server's venv) is named by its library folders, not by that folder:
    # /usr/local/cuda is no folder of Python's.
    pythons = [(Path(p), "PYTHON") for p in {sys.prefix, sys.base_prefix}
               if Path(p).resolve() not in SHARED_FOLDERS]
    paths = sysconfig.get_paths()
    places: list[tuple[Path | None, str]] = [
        *extra, (ROOT, "BOOK"), (pytest_temp(), "PYTEST_TMP"), (Path.home(), "~"), *pythons,
        *[(Path(paths[k]), "STDLIB") for k in ("stdlib", "platstdlib")],
        *[(Path(paths[k]), "SITE") for k in ("purelib", "platlib")]]
    found: dict[str, str] = {}
    for path, word in places:
        if path is None:
            continue
        for form in (str(path), str(path.resolve())):
            if len(form) > 1 and form not in found:  # never "/" itself
                found[form] = word
    return sorted(found.items(), key=lambda item: -len(item[0]))


def pytest_temp() -> Path:
    """The folder under which pytest makes each test's ``tmp_path`` (its default basetemp's
    parent, ``<temp folder>/pytest-of-<user>``): a failing test's message names it."""
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (ImportError, KeyError, OSError):  # pytest's own fallback, where no user is named
        user = "unknown"
    return Path(tempfile.gettempdir()) / f"pytest-of-{user}"


#: The machine's name in a JUnit report (``<testsuite hostname="...">``): nobody's business.
_HOSTNAME = re.compile(r'(<testsuite\b[^>]*?\shostname=")[^"]*(")')


#: Folders many programs share: a Python installed there is named by its library folders.
SHARED_FOLDERS = frozenset(Path(p) for p in ("/", "/usr", "/usr/local", "/opt"))
_ANSI_END = re.compile(r"\x1b\[[\d;]*m\Z")  # a colour code right before a path (tracebacks)


def without_places(text: str, places: list[tuple[str, str]]) -> str:
    """``text`` with each of ``places`` replaced by its word, where it names that folder
    (``/home/ann`` in ``/home/ann/book``, not in ``/home/anna`` nor in ``/tmp/home/ann``)."""
    def replace(match: re.Match, word: str) -> str:
        before = match.string[max(0, match.start() - 12):match.start()]
        inside_a_name = re.search(r"[\w.-]\Z", before) and not _ANSI_END.search(before)
        return match.group() if inside_a_name else word

    for path, word in places:
        text = re.sub(re.escape(path) + r"(?![\w.-])",
                      lambda match, word=word: replace(match, word), text)
    return text


def scrub_notebook(nb, places: list[tuple[str, str]]) -> None:
    """Every text a cell printed, without this machine's folders (images are left alone)."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = without_places(out["text"], places)
            if "evalue" in out:
                out["evalue"] = without_places(out["evalue"], places)
                out["traceback"] = [without_places(t, places) for t in out["traceback"]]
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    out["data"][mime] = without_places(value, places)


def scrub_file(path: Path, places: list[tuple[str, str]]) -> None:
    """A written log, test report or summary, without this machine's folders (nor, in a
    JUnit report, its name)."""
    if path.is_file():
        text = path.read_text(errors="replace")
        clean = without_places(text, places)
        if path.suffix == ".xml":
            clean = _HOSTNAME.sub(r"\1GPU-SERVER\2", clean)
        if clean != text:
            path.write_text(clean)


def scrub_data(value: Any, places: list[tuple[str, str]]) -> Any:
    """``value`` (the summary: dicts, lists, strings) with every string, key or value,
    without this machine's folders. Scrubbed before it is written as JSON: JSON escapes the
    colour code before a traceback's path (``\\u001b[32m/home/ann/...``), which then reads
    as part of a longer name and would be left alone."""
    if isinstance(value, str):
        return without_places(value, places)
    if isinstance(value, dict):
        return {scrub_data(k, places): scrub_data(v, places) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_data(v, places) for v in value]
    return value


def scrub_command(result: Path, places: list[tuple[str, str]]) -> None:
    """The result file's ``command`` (what the benchmark was told, a ``--work`` outside the
    checkout among it), without this machine's folders; the figures are left as written."""
    if result.is_file():
        doc = json.loads(result.read_text())
        command = doc.get("command")
        if isinstance(command, str) and without_places(command, places) != command:
            doc["command"] = without_places(command, places)
            result.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


def shown(path: Path) -> str:
    """How a message names one of the report's paths: from the book's folder where inside."""
    try:
        return str(Path(path).resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)


#: The matplotlib backend of the kernel that records a page: Jupyter's inline backend, which
#: puts each figure ``plt.show()`` draws into the cell's outputs. An ``MPLBACKEND`` set in the
#: environment (``Agg`` on many servers) would otherwise reach the kernel, draw into nothing,
#: and the recorded page would lose its figures (the first GPU run did).
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def kernel_env() -> dict[str, str]:
    """The environment a chapter's kernel gets: this one, with the inline backend, and without
    pytest's variable (a report run by the tests), under which ipykernel would not show what
    C++ code writes to stderr (:mod:`tools.nbmake_kernel`)."""
    from tools.nbmake_kernel import reader_environment

    return {**reader_environment(), "MPLBACKEND": INLINE_BACKEND}


def kernel_transport(km) -> str | None:
    """Put ``km``'s kernel on IPC sockets in a private folder, where this system has them:
    ipykernel 7 warns on the console that "Kernel is running over TCP without encryption" for
    every kernel on TCP, the default. Unix sockets are reachable by this user only (their
    folder is ``mkdtemp``'s, mode 700); their path is absolute, since the kernel runs in the
    chapter's folder and this report in the book's (a relative one, jupyter_client's default,
    names two places). Returns the folder (removed after the kernel), or None where TCP stays:
    not POSIX, or a path too long for a socket (about 107 bytes)."""
    if os.name != "posix":
        return None
    folder = tempfile.mkdtemp(prefix="kernel-")
    if len(folder) > 80:
        os.rmdir(folder)
        return None
    km.transport = "ipc"
    km.ip = os.path.join(folder, "ipc")
    return folder


#: What a chapter's kernel imports before its turn (:class:`Turn`), where the chapter imports it
#: at the top level of a code cell (:func:`warm_imports`): the packages whose first import takes
#: seconds, and the book's own modules (``helpers.training`` imports torchmetrics: 2.8 s on a
#: CPU). The chapter's own cells still run every import (then at once). Not Lightning: its
#: import sets PYTORCH_NVML_BASED_CUDA_CHECK, which would reach the cells before chapter 10's
#: own import (:data:`WARM_ENVIRONMENT`).
WARM_IMPORTS = ("helpers", "torch", "torchvision", "torchmetrics", "pandas", "matplotlib.pyplot")


def warm_imports(nb) -> list[str]:
    """What ``nb``'s kernel imports before its turn: each module of :data:`WARM_IMPORTS` and
    each ``helpers.*`` module that a code cell imports at its top level (``import a.b`` or
    ``from a.b import c``, as a statement of the cell or of a ``try`` block in it: the setup
    cell imports ``helpers`` in one). Imports in functions, in ``if`` branches and in cell
    magics (``%%gpu_only``) may never run, and are left to the chapter."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    found: list[str] = []
    transform = TransformerManager().transform_cell
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(transform(cell.source))
        except SyntaxError:
            continue
        statements = list(tree.body)
        for node in tree.body:
            if isinstance(node, ast.Try):
                statements += node.body
        for node in statements:
            if isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append(node.module)
    # In the chapter's order: a package imported first by another (torchmetrics imports
    # matplotlib.pyplot) would point its import-time warnings there, not at the chapter.
    chosen: list[str] = []
    for f in found:
        name = f if f.startswith("helpers.") else next(
            (m for m in WARM_IMPORTS if f == m or f.startswith(m + ".")), None)
        if name is not None and name not in chosen:
            chosen.append(name)
    return chosen


class NotRun(Exception):
    """A chapter whose turn never came: the run was stopped (or out of time) first."""


class Turn:
    """A chapter's place in a lane when its kernel starts before its turn (:func:`execute`):
    the kernel starts and imports the chapter's heavy packages (:func:`warm_imports`) while
    nothing is measured, says so (:attr:`warmed`), and runs the chapter's cells only when the
    lane says :meth:`go`. ``stopped`` says whether the run is stopped or out of time."""

    def __init__(self, stopped: Any) -> None:
        self.warmed = threading.Event()
        self._go = threading.Event()
        self._stopped = stopped
        #: ``time.perf_counter()`` when the chapter's turn came; None before.
        self.started: float | None = None
        #: Seconds the kernel took to start and import; what made it start again cold, if so.
        self.warm_up: dict[str, Any] = {}

    def go(self) -> None:
        self._go.set()

    def stopped(self) -> bool:
        return bool(self._stopped())

    def wait(self) -> None:
        """Return when the chapter's turn comes; raise :class:`NotRun` if the run is stopped
        first."""
        while not self._go.wait(0.1):
            if self.stopped():
                raise NotRun
        if self.stopped():
            raise NotRun
        self.started = time.perf_counter()


#: What a warm-up may change in the kernel's environment: helpers sets KINETO_LOG_LEVEL as the
#: setup cell (the first) would; importing torchvision sets TORCHINDUCTOR_CACHE_DIR to the
#: folder torch uses anyway. Any other change (``import lightning`` sets
#: PYTORCH_NVML_BASED_CUDA_CHECK) would reach cells that run before the chapter's own import.
WARM_ENVIRONMENT = ("KINETO_LOG_LEVEL", "TORCHINDUCTOR_CACHE_DIR")

#: Run silently in a warmed kernel: imports the modules without binding a name in the
#: chapter's namespace, and prints what they changed in the environment (nothing, if all goes
#: well; anything printed undoes the warm-up).
WARM_UP_CODE = """\
def _book_warm_up(names, allowed):
    import os
    before = dict(os.environ)
    for name in names:
        __import__(name)  # not importlib's: a warning would point into importlib, unseen
    changed = sorted(k for k in set(before) | set(os.environ)
                     if before.get(k) != os.environ.get(k) and k not in allowed)
    if changed:
        print("importing", ", ".join(names), "changed the environment:", ", ".join(changed))
_book_warm_up({names!r}, {allowed!r})
del _book_warm_up
"""


def _warm_up(client: Any, modules: list[str], timeout: int, stopped: Any) -> str:
    """Start ``client``'s kernel (in the chapter's folder, with :func:`kernel_env`) and import
    ``modules`` there silently: no execution count is used, nothing is kept in the history, no
    name is bound. Returns what the imports printed (a warning, an error, a change to the
    environment), or ``""``. Raises :class:`NotRun` as soon as ``stopped()`` says so, and
    RuntimeError if the kernel dies or takes ``timeout`` seconds: the caller never waits on a
    dead kernel (jupyter_client's own execute_interactive would, until its timeout)."""
    from queue import Empty

    from jupyter_core.utils import run_sync

    client.start_new_kernel(env=kernel_env())
    client.start_new_kernel_client()
    if not modules:
        return ""
    kc = client.kc
    msg_id = kc.execute(WARM_UP_CODE.format(names=modules, allowed=WARM_ENVIRONMENT),
                        silent=True, store_history=False, allow_stdin=False)
    printed: list[str] = []
    failed = ""
    deadline = time.monotonic() + timeout
    idle = replied = False
    while not (idle and replied):
        if stopped():
            raise NotRun
        if time.monotonic() > deadline:
            raise RuntimeError(f"importing {', '.join(modules)} took over {timeout} s")
        if not run_sync(client.km.is_alive)():
            raise RuntimeError(f"the kernel died importing {', '.join(modules)}")
        try:
            if not replied:
                reply = run_sync(kc.get_shell_msg)(timeout=0.2)
                if reply["parent_header"].get("msg_id") == msg_id:
                    replied = True
                    if reply["content"]["status"] != "ok":  # its traceback comes on iopub
                        failed = (f"{reply['content'].get('ename')}: "
                                  f"{reply['content'].get('evalue')}\n")
            msg = run_sync(kc.get_iopub_msg)(timeout=0.2)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status":
            idle = content["execution_state"] == "idle"
        elif kind == "stream":
            printed.append(content["text"])
        elif kind == "error":
            printed.append(f"{content['ename']}: {content['evalue']}\n")
        elif kind in ("display_data", "execute_result"):
            printed.append(content.get("data", {}).get("text/plain", kind) + "\n")
    return "".join(printed) or failed


def execute(path: Path, timeout: int, turn: Turn | None = None) -> tuple[bool, str]:
    """Execute ``path`` in place in its own folder, as the book build does, with the inline
    backend whatever ``MPLBACKEND`` says (:func:`kernel_env`), its kernel on IPC sockets
    (:func:`kernel_transport`). A run being stopped (:class:`Stopper`) kills its kernel: the
    chapter then fails, saying it was cut short.

    With a ``turn``, the kernel starts and imports the chapter's heavy packages at once, then
    waits for :meth:`Turn.go` (raising :class:`NotRun` if the run stops first): a lane of
    chapters that run alone pays for no kernel start and no first import between them. A
    warm-up that prints anything (a warning the page would have shown where the chapter
    imports the package) is undone: the kernel is killed and a fresh one starts at the turn.
    The kernel is killed once the last cell has replied (every output is in by then): a
    graceful shutdown waited 2-3 s for Python to tear torch down."""
    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(path.parent)}})
    stopper = _stopper
    sockets: list[str] = []

    def new_kernel_manager() -> Any:
        km = client.create_kernel_manager()
        folder = kernel_transport(km)
        if folder:
            sockets.append(folder)
        if stopper is not None:
            stopper.add_kernel(km)
        return km

    def fresh_kernel(why: str) -> None:
        """Undo a warm-up: end its kernel; nbclient starts a fresh one at the turn."""
        turn.warm_up["started_again_cold"] = why[-500:]
        if client.km is not None:  # nbclient ended a kernel that never got ready itself
            try:
                client._cleanup_kernel()
            except Exception:  # already gone: nothing left to end
                pass
        if stopper is not None:
            stopper.remove_kernel(kms[-1])
        kms.append(new_kernel_manager())

    kms = [new_kernel_manager()]
    error = ""
    try:
        if turn is not None:
            # Whatever happens here, the chapter waits for its turn (or the run's end): the
            # lanes decide when it runs, and what it ran beside.
            def stopped() -> bool:
                return bool(stopper) or turn.stopped()

            tic = time.perf_counter()
            printed, modules = "", []
            try:
                modules = warm_imports(nb)
                printed = _warm_up(client, modules, timeout, stopped)
            except NotRun:
                pass
            except Exception as exc:  # no kernel, or a dead one: a fresh one at the turn
                printed = f"{type(exc).__name__}: {exc}"
            finally:
                turn.warm_up = {"seconds": round(time.perf_counter() - tic, 1),
                                "imports": modules}
                turn.warmed.set()
            if stopped():
                raise NotRun
            if printed:
                fresh_kernel(printed)
            turn.wait()
            # (a manager fresh_kernel made has no kernel yet: nbclient starts it)
            if (client.km is not None and client.km.has_kernel
                    and not run_sync(client.km.is_alive)()):
                fresh_kernel("the kernel died while it waited for its turn")
        if stopper:
            error = "not started"
        else:
            client.execute(env=kernel_env())
    except NotRun:
        raise
    except CellExecutionError as exc:
        error = str(exc)[-2000:]
    except Exception as exc:  # a dead kernel or a timeout: record it, go on with the others
        error = f"{type(exc).__name__}: {exc}"[-2000:]
    finally:
        if client.km is not None:  # not run, or failed before its cells: nbclient left it
            try:
                client._cleanup_kernel()
            except Exception:  # already dead (a stop killed it): nothing left to end
                pass
        for km in kms:
            if stopper is not None:
                stopper.remove_kernel(km)
        # A kernel that died while starting leaves nbclient's exit hook registered, which
        # would fail at exit (its manager is gone); the kernel was cleaned up already.
        atexit.unregister(client._cleanup_kernel)
        for folder in sockets:
            shutil.rmtree(folder, ignore_errors=True)
    if error and stopper:
        error = f"cut short ({stopper.why}): {error}"
    nbformat.write(nb, path)
    return not error, error


#: The chapters whose lessons need a GPU most run first, so a short time on one records them.
FIRST = ("03_matmul", "05_mnist", "11_cuda_semantics", "12_performance", "13_memory")
#: The chapters whose outputs or claims are timings, and what they time: each runs alone on
#: the machine, after the benchmark (which runs alone too). Work beside them would share the
#: GPU and the CPU cores and slow what they measure. The others measure no time and run side
#: by side (``--workers`` at a time), beside the unit tests.
RUN_ALONE = {
    "02_moving_tensors": "the GPU still busy when .to() returns, a copy that waits behind "
                         "half a second of GPU work (host against GPU timing)",
    "03_matmul": "matrix products timed on the CPU and the GPU, speed-ups claimed",
    "04_linear_regression": "CPU and GPU training loops timed, the speed-up and the cost of "
                            ".item() claimed",
    "05_mnist": "epochs timed, speed-ups claimed",
    "06_image_folder": "loader throughput with worker processes (the CPU cores) claimed",
    "10_trainers": "the trainers' seconds per epoch (table, figure)",
    "11_cuda_semantics": "when calls return, stream overlap, graph replay, fusion: all timed",
    "12_performance": "each recipe timed, speed-ups claimed",
    "13_memory": "checkpointing claimed to make a step slower (timed)",
    "14_fast_mnist": "every step's images/s and training seconds timed, goals claimed",
}
#: Alone only on a machine of this many GPUs: chapter 7's two-GPU cell prints a DDP run's
#: seconds; on one GPU that cell does not run and the chapter measures no time.
RUN_ALONE_FROM_GPUS = {"07_data_parallel": 2}


def runs_alone(stem: str, gpu_count: int) -> bool:
    """Whether a chapter measures time on a machine of ``gpu_count`` GPUs (:data:`RUN_ALONE`)."""
    return stem in RUN_ALONE or gpu_count >= RUN_ALONE_FROM_GPUS.get(stem, 10**6)


def chosen_chapters(spec: str) -> list[Path]:
    """The chapters ``--chapters`` names, or every recordable chapter when empty: those of
    :data:`FIRST` first, then the others in order."""
    recordable = [p for p in sorted(CHAPTERS.glob("*.ipynb"))
                  if not p.stem.startswith(NOT_RECORDED_PREFIX)]
    if not spec:
        return sorted(recordable, key=lambda p: (p.stem not in FIRST,
                                                 FIRST.index(p.stem) if p.stem in FIRST else 0,
                                                 p.stem))
    wanted = [c.strip().removesuffix(".ipynb") for c in spec.split(",") if c.strip()]
    unknown = [w for w in wanted if not (CHAPTERS / f"{w}.ipynb").exists()]
    if unknown:
        raise SystemExit(f"no such chapter(s): {', '.join(unknown)}; known: "
                         f"{', '.join(p.stem for p in recordable)}")
    skipped = [w for w in wanted if w.startswith(NOT_RECORDED_PREFIX)]
    if skipped:
        raise SystemExit(f"{', '.join(skipped)} is rendered from results/ by the book build and "
                         "never recorded: leave it out of --chapters")
    return [CHAPTERS / f"{w}.ipynb" for w in wanted]


def record(args: argparse.Namespace) -> int:
    use_checkout()
    # Before anything is installed: a torch too old for the book makes the rest pointless.
    torch_version = check_torch()
    if args.wheelhouse:
        install_wheelhouse(args.wheelhouse)
    if args.install_only:
        print(f"Installed from {args.wheelhouse}. To run the chapters yourself with this "
              f"book's helpers: PYTHONPATH={ROOT} python -m pytest -p tools.nbmake_kernel "
              "--nbmake chapters")
        return 0
    if args.data:
        unpack_mnist(args.data)
    import nbformat

    from bench import __main__ as runner
    from bench.core import book_commit
    from helpers.devices import best_device
    from helpers.results import machine_label

    device = best_device(None)
    if device.type == "cpu" and not args.allow_cpu:
        import torch

        raise SystemExit(
            f"no GPU or other accelerator is usable here (torch {torch_version}, built for CUDA "
            f"{torch.version.cuda or 'none'}): a CPU run is not a GPU report. If the machine has "
            "a GPU, check that this torch build supports its driver (nvidia-smi), or run the "
            "report with the machine's own Python (make gpu-report REPORT_PY=python3). "
            "--allow-cpu records a CPU run anyway (a test of the report).")
    # A part (some chapters, --no-bench, --no-chapters) is committable; a quick run is not.
    smoke = bool(args.quick or args.bench_only)
    commit = book_commit()
    if commit == "unknown" and not smoke:
        raise SystemExit("this copy of the book has no .git to name its commit: set "
                         "BOOK_COMMIT=<the commit it was copied from> and run again")
    machine = runner.machine_record(device)
    slug = machine["slug"]
    results = args.results or ROOT / "results"
    pages = results / "pages" / slug
    work = args.work / "chapters"
    work.mkdir(parents=True, exist_ok=True)
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run = {"slug": slug, "machine_label": machine_label({"machine": machine}),
           "device": str(device), "device_name": machine["device_name"],
           "gpu_count": machine["gpu_count"], "accelerator": machine["accelerator"],
           "driver": machine["driver"], "cuda": machine["cuda"], "hip": machine.get("hip"),
           "torch": torch_version, "python": machine["python"],
           "book_commit": commit, "date": date}
    chosen = chosen_chapters(args.chapters)
    if args.budget is not None and args.budget < 0:
        raise SystemExit(f"--budget must be seconds >= 0, got {args.budget:g}")
    print(f"GPU report for {run['machine_label']} on {device}, torch {torch_version}, book "
          f"commit {commit[:10]}: "
          + ("no benchmark" if args.no_bench else
             f"the {'quick' if args.quick else 'full'} benchmark")
          + f", then {0 if args.no_chapters else len(chosen)} chapter(s).", flush=True)
    summary: dict[str, Any] = {"run": run, "chapters": {}}
    # The whole run within --budget (the tests too) and a run told to stop (SIGINT, SIGTERM)
    # still says what it did and packs its archive: a run on a machine one cannot keep must
    # come back as one copy. What is running is stopped (Stopper); no part starts after.
    global _stopper
    stopper = _stopper = Stopper()
    started = time.monotonic()
    budget_spent = f"the --budget of {args.budget or 0:g} s was spent"
    timer = None
    if args.budget is not None:
        timer = threading.Timer(args.budget, stopper.stop, (budget_spent,))
        timer.daemon = True
        timer.start()
    previous = catch_signals(stopper)

    def out_of_time() -> bool:
        return bool(stopper) or (args.budget is not None
                                 and time.monotonic() - started > args.budget)

    def why_not() -> str:
        return stopper.why or budget_spent

    # The benchmark first, so the chapters run beside this machine's own result file. Each
    # workload's figures are kept under the work folder as it finishes (--parts): a run cut
    # short keeps them, and the next run measures only what is missing.
    bench = [sys.executable, "-m", "bench", "--no-progress", "--parts",
             shown(args.work / "bench-parts")]
    if args.quick:
        bench.append("--quick")
    for name in args.bench_only:
        bench += ["--only", name]
    # A full run writes results/<machine>.json; a smoke test writes where it was told to, or
    # into the work folder, never into the committed results/.
    out = args.results or (args.work / "bench" if args.quick or args.bench_only else results)
    bench += ["--out", shown(out)]
    env = {**os.environ, "BOOK_COMMIT": commit, "BOOK_STRICT": "1"}
    # What the report writes names no folder of this machine (the bench and the tests run in
    # the checkout, so their paths are relative to it; logs, pages and the summary are
    # scrubbed).
    places = machine_places(*[(p, w) for p, w in ((args.work, "WORK"), (results, "RESULTS"))
                              if not p.resolve().is_relative_to(ROOT.resolve())],
                            (args.wheelhouse, "WHEELS"), (args.data, "DATA"))
    lock = threading.Lock()

    def write_summary() -> None:
        with lock:  # a chapter's or the tests' thread may be changing it
            text = json.dumps(scrub_data(summary, places), indent=1) + "\n"
        (args.work / "report.json").write_text(text)

    bench_rc = 0
    clock: dict[str, float] = {}
    wrote: list[Path] = []  # what this run wrote, for --archive
    not_run: list[str] = []
    tests = None
    tests_log = args.work / "tests.log"
    turns: dict[Path, Turn] = {}
    started_early: dict[Path, Future] = {}
    warm_pool = None
    run_order: list[Path] = []  # the lanes' order: the alone lane's, then the others
    try:
        os.environ["BOOK_STRICT"] = "1"  # the chapters' timing claims are strict here
        if args.no_chapters:
            chosen = []
        elif args.resume:
            # A page already recorded on this machine for the chapter's current code is kept.
            kept = [c for c in chosen if (pages / c.name).exists() and code_hash(
                nbformat.read(pages / c.name, as_version=4)) == code_hash(
                nbformat.read(c, as_version=4))]
            if kept:
                print("Already recorded for the current code: "
                      + ", ".join(c.stem for c in kept))
            chosen = [c for c in chosen if c not in kept]
        # The tests' own output checks, so no page they would reject is written (the checkout
        # is on sys.path: use_checkout).
        from tools.notebook import output_problems, trim_errors

        def record_chapter(source: Path, ran: dict[str, Any], turn: Turn | None = None) -> None:
            if turn is None:
                if out_of_time():
                    with lock:
                        not_run.append(source.stem)
                    return
                (pages / source.name).unlink(missing_ok=True)
            target = work / source.name
            shutil.copy(source, target)
            start = time.perf_counter()
            try:
                ok, error = execute(target, args.timeout, turn)
            except NotRun:
                target.unlink(missing_ok=True)
                with lock:
                    not_run.append(source.stem)
                return
            if turn is not None and turn.started is not None:
                start = turn.started  # from its turn on, not from its kernel's early start
            seconds = round(time.perf_counter() - start, 1)
            problems: list[str] = []
            nb = nbformat.read(target, as_version=4)
            if ok:
                trim_errors(nb)
                problems = output_problems(nb)
                if problems:
                    ok, error = False, "; ".join(problems)
            scrub_notebook(nb, places)
            nbformat.write(nb, target)
            if ok:
                page = stamp_page(nb, nbformat.read(source, as_version=4), {**run, **ran})
                pages.mkdir(parents=True, exist_ok=True)
                nbformat.write(page, pages / source.name)
            with lock:
                wrote.append(target)
                if ok:
                    wrote.append(pages / source.name)
                summary["chapters"][source.stem] = {"ok": ok, "seconds": seconds,
                                                    "error": error, **ran}
                if turn is not None:
                    summary["chapters"][source.stem]["kernel_started_early"] = turn.warm_up
                if not ok and stopper:
                    summary["chapters"][source.stem]["cut_short"] = stopper.why
            print(f"  {source.stem}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s"
                  f" ({ran['ran']})", flush=True)
            for line in [] if ok else problems or (
                    [error.strip().splitlines()[-1]] if error.strip() else []):
                print("    " + without_places(line, places), flush=True)
            # Rewritten after every chapter: a run cut short still says what it did.
            write_summary()

        # The lanes. First, alone on the machine (after the benchmark): the chapters that time
        # something. Then side by side: the chapters that measure no time, --workers at a
        # time, beside the unit tests (their own part, with --test-workers).
        alone = [c for c in chosen if runs_alone(c.stem, run["gpu_count"])]
        beside = [c for c in chosen if c not in alone]
        run_order += alone + beside
        # What the chapters that run side by side ran beside: known once the tests start.
        beside_ran: dict[str, Any] = {}
        if chosen and not args.cold_kernels and not out_of_time():
            # Every chapter's kernel starts now, all at once, and imports its packages, before
            # the benchmark: then idle, they take neither a core nor the GPU from it, and in
            # its lane each chapter starts at its first cell. On the H200 each chapter spent
            # 1.5-3.8 s outside its cells (its kernel's start and shutdown), and its first
            # cells then imported torch and the rest: 10 chapters one after the other.
            tic = time.monotonic()
            turns = {c: Turn(out_of_time) for c in chosen}
            warm_pool = ThreadPoolExecutor(len(chosen))
            started_early = {c: warm_pool.submit(
                record_chapter, c, {"ran": "alone"} if c in alone else beside_ran, turns[c])
                for c in chosen}
            for c, future in started_early.items():
                while not (turns[c].warmed.wait(0.1) or future.done() or stopper):
                    pass
            clock["kernels started early"] = time.monotonic() - tic
            print(f"Kernels: {len(chosen)} started and imported their chapters' packages in "
                  f"{clock['kernels started early']:.0f} s, before the benchmark.", flush=True)

        def take_turn(source: Path) -> None:
            """Let a chapter whose kernel started early run, and wait until it is done."""
            if not out_of_time():
                (pages / source.name).unlink(missing_ok=True)
            turns[source].go()
            _result(started_early[source])

        if args.no_bench:
            summary["benchmark"] = {"skipped": "--no-bench"}
        elif out_of_time():
            summary["benchmark"] = {"command": bench[1:], "not_run": why_not()}
        else:
            print("Benchmark: " + " ".join(bench[1:]), flush=True)
            tic = time.monotonic()
            summary["benchmark"] = {"command": bench[1:], "returncode": -1}
            wrote += [args.work / "bench.log", out / f"{slug}.json"]  # pack skips what is not
            bench_rc = run_logged(bench, env, args.work / "bench.log", echo=True,
                                  stopper=stopper)
            scrub_file(args.work / "bench.log", places)
            scrub_command(out / f"{slug}.json", places)
            clock["benchmark"] = time.monotonic() - tic
            summary["benchmark"]["returncode"] = bench_rc
            if stopper:
                summary["benchmark"]["cut_short"] = stopper.why

        # No page of an earlier run survives a chapter that fails now (or one deleted since).
        if not args.chapters and not args.resume and not args.no_chapters:
            shutil.rmtree(pages, ignore_errors=True)
        tic = time.monotonic()
        if turns:
            for source in alone:
                take_turn(source)
        else:
            # In a thread of its own, like the others: in the main thread nbclient takes SIGINT
            # and SIGTERM over while a chapter runs, and puts Python's defaults back after it,
            # so a signal would no longer stop the run (catch_signals) but end the report
            # unpacked.
            with ThreadPoolExecutor(1) as pool:
                for source in alone:
                    _result(pool.submit(record_chapter, source, {"ran": "alone"}))
        clock["chapters alone"] = time.monotonic() - tic
        tic = time.monotonic()
        if args.tests:
            command = tests_command(args.work, args.test_workers)
            if out_of_time():
                summary["tests"] = {"command": command[1:], "not_run": why_not()}
            else:
                print("Tests: " + " ".join(command[1:]) + f" (log: {shown(tests_log)})",
                      flush=True)

                def run_tests() -> None:
                    returncode = -1  # if running them fails, the summary says so
                    try:
                        returncode = run_logged(command, env, tests_log, echo=not beside,
                                                stopper=stopper)
                    finally:
                        with lock:
                            summary["tests"] = {"command": command[1:],
                                                "returncode": returncode,
                                                "seconds": round(time.monotonic() - tic, 1)}
                            if stopper:
                                summary["tests"]["cut_short"] = stopper.why

                tests = threading.Thread(target=run_tests)
                tests.start()
                wrote += [tests_log, args.work / "tests.xml"]
        workers = max(1, min(args.workers, len(beside)))
        others = ([f"other chapters ({workers} at a time)"] if workers > 1 else []) + (
            ["the unit tests"] if tests else [])
        beside_ran["ran"] = "beside " + " and ".join(others) if others else "alone"
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(take_turn, source) if turns else
                           pool.submit(record_chapter, source, beside_ran) for source in beside]:
                _result(future)
        clock["chapters side by side"] = time.monotonic() - tic
        if tests is not None:
            while tests.is_alive():  # in steps, as _result
                tests.join(0.2)
            clock["tests"] = summary["tests"]["seconds"]
    except BaseException as failure:
        # The report itself failed or was told twice to stop: stop what runs, keep the rest.
        stopper.stop(f"the report stopped: {type(failure).__name__}: {failure}"[:200])
        raise
    finally:
        if warm_pool is not None:
            # A run stopped before their turns: each chapter still waiting finds it stopped
            # and ends its kernel. Waited for in steps (see _result); told again to stop, the
            # report packs what it has without them.
            for turn in turns.values():
                turn.go()
            try:
                while not all(f.done() for f in started_early.values()):
                    futures_wait(list(started_early.values()), timeout=0.2)
            except KeyboardInterrupt:
                pass
            warm_pool.shutdown(wait=False)
        if timer is not None:
            timer.cancel()
        _stopper = None
        # The report's signal handlers hold until the archive is packed: a stop that comes
        # now (an outer `timeout -s INT` as the run ends) has nothing left to stop, and with
        # Python's own handlers back it would end the report half-packed.
        try:
            # Scrubbed here too: a report ended during the benchmark skipped it above.
            for name in ("bench.log", "tests.log", "tests.xml"):
                scrub_file(args.work / name, places)
            if "returncode" in summary.get("benchmark", {}):  # it was started
                scrub_command(out / f"{slug}.json", places)
            clock["total"] = time.monotonic() - started
            with lock:
                summary["parts_seconds"] = {k: round(v, 1) for k, v in clock.items()}
                # in the run's order: chapters waiting for their turns end all at once
                order = [c.stem for c in run_order]
                not_run.sort(key=lambda s: order.index(s) if s in order else len(order))
                summary["not_run"] = list(not_run)
                if stopper:
                    summary["stopped"] = stopper.why
            write_summary()
            if args.archive:
                wrote.append(args.work / "report.json")
                with lock:
                    files = list(wrote)
                size = pack(args.archive, files, results, args.work)
                print(f"Archive: {args.archive} ({size / 2**20:.1f} MiB): on the machine you "
                      f"keep, `python tools/gpu_report.py unpack {args.archive.name}` in the "
                      "book's folder", flush=True)
        finally:
            restore_signals(previous)
    if "tests" in clock:
        print(f"  tests: exit status {summary['tests']['returncode']} in "
              f"{clock['tests']:.0f} s; {_last_line(tests_log)}", flush=True)
    print("Parts: " + ", ".join(f"{k} {v:.0f} s" for k, v in clock.items()), flush=True)
    tests_rc = summary.get("tests", {}).get("returncode", 0)
    skipped = [name for name, part in (("the benchmark", summary.get("benchmark", {})),
                                       ("the unit tests", summary.get("tests", {})))
               if "not_run" in part]
    if stopper:
        cut = [name for name, part in (("the benchmark", summary.get("benchmark", {})),
                                       ("the unit tests", summary.get("tests", {})))
               if "cut_short" in part] + [c for c, r in summary["chapters"].items()
                                          if "cut_short" in r]
        print(f"Stopped ({stopper.why}): cut short: {', '.join(cut) or 'nothing'}; not run: "
              f"{', '.join(skipped + not_run) or 'nothing'}. Run again with --resume --no-bench "
              "to record the chapters left.", file=sys.stderr)
    failed = sorted(name for name, c in summary["chapters"].items() if not c["ok"])
    print(f"Pages in {shown(pages)}; executed notebooks in {shown(work)}; summary in "
          f"{shown(args.work / 'report.json')}")
    if failed or bench_rc or tests_rc or not_run or skipped or stopper:
        print(f"Not complete: failed chapter(s) {', '.join(failed) or 'none'}; benchmark exit "
              f"status {bench_rc}; tests exit status {tests_rc}. What passed is recorded and "
              "may be committed as a partial run.", file=sys.stderr)
        return 1
    if smoke:
        print("Done: a smoke test (quick or partial benchmark, or some chapters), not for "
              "committing.")
    elif device.type == "cpu":
        print("Done: a CPU run (--allow-cpu), not a GPU report.")
    else:
        print(f"Done. Commit results/{slug}.json and results/pages/{slug}/ (never edit them).")
    return 0


def _result(future: Future) -> Any:
    """``future.result()``, waiting in steps of 0.2 s: Python runs a signal's handler in the
    main thread, when it next runs Python there; a signal the system gave another thread would
    wait for an untimed wait to end (a whole chapter), and the stop with it. (Not
    ``result(timeout=...)`` in a loop: a future that raised TimeoutError would spin it.)"""
    while not future.done():
        futures_wait([future], timeout=0.2)
    return future.result()


def tests_command(work: Path, workers: int) -> list[str]:
    """The unit tests, GPU branches included (they skip without a GPU), with a report file:
    the short summary names each failure, error and skip (``-rfEs``) and the 15 slowest tests
    are listed (``--durations``). pytest-benchmark's plugin is left out (``-p no:benchmark``;
    a name pytest ignores where that plugin is absent): under xdist it only warns, once per
    worker, that it measures nothing."""
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not book", "-rfEs",
               "--durations=15", f"--junitxml={shown(work / 'tests.xml')}",
               "-p", "no:cacheprovider", "-p", "no:benchmark"]
    if workers > 1:
        command += ["-n", str(workers)]
    return command + ["tests/library", "tests/benchmark", "tests/book/test_troubleshooting_gpu.py"]


def catch_signals(stopper: Stopper) -> dict[int, Any]:
    """SIGINT and SIGTERM stop the run (:class:`Stopper`) instead of ending the report: it
    then writes what it has. Another, 5 s or more later, raises KeyboardInterrupt (the report
    still writes its summary and archive on its way out). Only in the main thread (where
    Python runs signal handlers); returns the handlers replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    first: list[float] = []

    def on_signal(signum: int, frame: Any) -> None:
        if first:
            # One stop sent twice (`timeout` signals its child, then their process group)
            # counts once; a later one means: stop waiting.
            if time.monotonic() - first[0] > 5:
                raise KeyboardInterrupt
            return
        first.append(time.monotonic())
        # stop() prints and takes a lock: in a thread, never inside this handler.
        threading.Thread(target=stopper.stop, daemon=True,
                         args=(f"{signal.Signals(signum).name} received",)).start()

    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


# One archive back ----------------------------------------------------------------------------

#: An archive of a run comes back from a machine one cannot keep as one file of at most this.
ARCHIVE_LIMIT = 16 * 2**20
#: What an archive may unpack to, relative to the checkout: result files, recorded pages and
#: the report's work folder (executed notebooks, summary, test report, logs).
ARCHIVE_PLACES = ("results/<machine>.json", "results/pages/<machine>/<chapter>.ipynb",
                  "_build/gpu-report/...")


def _a_report_place(name: str) -> bool:
    parts = name.split("/")
    if parts[0] == "results":
        return (len(parts) == 2 and parts[1].endswith(".json")) or (
            len(parts) == 4 and parts[1] == "pages" and parts[3].endswith(".ipynb"))
    return parts[:2] == ["_build", "gpu-report"] and len(parts) > 2
#: Never more than this unpacked (a small archive can expand enormously).
UNPACKED_LIMIT = 512 * 2**20


def archive_name(path: Path, results: Path, work: Path) -> str:
    """Where ``path`` (written under ``results`` or ``work``) goes in a checkout."""
    for base, place in ((work, "_build/gpu-report"), (results, "results")):
        try:
            return f"{place}/{path.resolve().relative_to(base.resolve()).as_posix()}"
        except ValueError:
            continue
    raise ValueError(f"{path} is neither under {results} nor under {work}")


def pack(archive: Path, files: list[Path], results: Path, work: Path,
         limit: int = ARCHIVE_LIMIT) -> int:
    """Write ``files`` into ``archive`` (tar, xz) under their places in a checkout; returns
    its size. Each recorded page sits beside its executed notebook, so xz stores the two
    nearly equal copies about once. Refuses (leaving no archive) above ``limit`` bytes."""
    names = {archive_name(f, results, work): f for f in files if f.is_file()}
    order = sorted(names, key=lambda n: (Path(n).name, n))
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz") as tar:
        for name in order:
            info = tar.gettarinfo(names[name], arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(names[name], "rb") as f:
                tar.addfile(info, f)
    size = partial.stat().st_size
    if size > limit:
        partial.unlink()
        biggest = sorted(names, key=lambda n: names[n].stat().st_size, reverse=True)[:5]
        raise SystemExit(f"the archive would be {size / 2**20:.1f} MiB, over its "
                         f"{limit / 2**20:g} MiB: the largest files are " + ", ".join(
                             f"{n} ({names[n].stat().st_size / 2**20:.1f} MiB)" for n in biggest))
    partial.replace(archive)
    return size


def _written_by_a_report(path: Path, name: str) -> bool:
    """Whether an existing file of the checkout is one a report writes (and may replace)."""
    if name.startswith("_build/gpu-report/"):
        return True
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if name.endswith(".ipynb"):
        return "recorded_run" in doc.get("metadata", {}).get("book", {})
    return isinstance(doc, dict) and {"schema_version", "machine", "figures"} <= doc.keys()


def _archive_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The archive's members, read one at a time: past :data:`UNPACKED_LIMIT` bytes of files it
    stops, before decompressing the rest (a small archive can expand enormously)."""
    members, total = [], 0
    for m in tar:
        members.append(m)
        total += max(m.size, 0) if m.isfile() else 0
        if total > UNPACKED_LIMIT:
            raise SystemExit(f"{tar.name} cannot be unpacked (nothing was): its files hold "
                             f"over {UNPACKED_LIMIT / 2**20:g} MiB, more than a run writes")
    return members


def _archive_problems(members: list[tarfile.TarInfo], root: Path) -> list[str]:
    problems, seen = [], set()
    for m in members:
        name = m.name
        parts = Path(name).parts
        if m.isdir():
            continue
        if not m.isfile():
            problems.append(f"{name}: not a plain file")
        elif name.startswith("/") or ".." in parts or not parts:
            problems.append(f"{name}: outside the checkout")
        elif not _a_report_place(name):
            problems.append(f"{name}: not a place a report writes "
                            f"({', '.join(ARCHIVE_PLACES)})")
        elif not (root / name).resolve().is_relative_to(root.resolve()):
            problems.append(f"{name}: outside the checkout")
        elif (root / name).exists() and not _written_by_a_report(root / name, name):
            problems.append(f"{name}: would overwrite a file no report wrote")
        elif name in seen:
            problems.append(f"{name}: twice in the archive")
        seen.add(name)
    return problems


def unpack(archive: Path, root: Path = ROOT, limit: int = ARCHIVE_LIMIT) -> list[str]:
    """Put a run's archive into the checkout ``root``, all of it or (on any problem) nothing:
    every member is checked first, then unpacked beside the checkout's files and moved into
    place, the files it replaces kept until every move has succeeded. The pages of chapters
    the run found failing leave the checkout with it (:func:`_pages_of_failed_chapters`)."""
    size = archive.stat().st_size
    if size > limit:
        raise SystemExit(f"{archive} is {size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB "
                         "an archive of a run may have: nothing unpacked")
    try:
        with tarfile.open(archive) as tar:
            members = _archive_members(tar)
            problems = _archive_problems(members, root)
            if problems:
                raise SystemExit(f"{archive} cannot be unpacked (nothing was): "
                                 + "; ".join(problems))
            files = [m for m in members if m.isfile()]
            (root / "_build").mkdir(exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=root / "_build"))
            try:
                tar.extractall(staging / "new", members=files, filter="data")
                names = [m.name for m in files]
                failed = _pages_of_failed_chapters(staging / "new", names, root)
                _move_into_place(names, staging, root, remove=failed)
                for name in failed:
                    print(f"Removed {name}: the run found that chapter failing (the report "
                          "removes its page of an earlier run)")
            finally:
                if not _kept_back(staging):
                    shutil.rmtree(staging, ignore_errors=True)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SystemExit(f"{archive} cannot be unpacked (nothing was): "
                         f"{type(exc).__name__}: {exc}") from None
    return [m.name for m in files]


def _pages_of_failed_chapters(new: Path, names: list[str], root: Path) -> list[str]:
    """The checkout's pages, of the run's machine, of each chapter the run's summary (in the
    unpacked folder ``new``) says failed: on its machine the report removed them, since no page
    of an earlier run may survive a chapter that fails now; unpack does the same."""
    try:
        summary = json.loads((new / "_build" / "gpu-report" / "report.json").read_text())
        slug, chapters = summary["run"]["slug"], summary["chapters"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(slug, str) or not isinstance(chapters, dict):
        return []
    pages = []
    for stem, result in chapters.items():
        name = f"results/pages/{slug}/{stem}.ipynb"
        path = root / name
        if (isinstance(result, dict) and result.get("ok") is False and name not in names
                and _a_report_place(name)
                and ".." not in Path(name).parts and path.is_file()
                and path.resolve().is_relative_to(root.resolve())
                and _written_by_a_report(path, name)):
            pages.append(name)
    return sorted(pages)


def _kept_back(staging: Path) -> bool:
    """Whether a file the checkout had is still in ``staging``, not put back (see below)."""
    return (staging / "KEPT").exists()


def _move_into_place(names: list[str], staging: Path, root: Path,
                     remove: list[str] = ()) -> None:
    """Move each of ``names`` from ``staging/new`` to the checkout ``root``, and each of
    ``remove`` out of it, moving the file it replaces to ``staging/old``; on any failure, undo
    every move, remove the folders made, and should a file not go back, keep ``staging`` and
    say where it is."""
    done: list[tuple[Path, Path | None]] = []
    made: list[Path] = []  # folders this made, outermost first
    try:
        for i, name in enumerate([*names, *remove]):
            target = root / name
            backup = None
            if target.exists() or target.is_symlink():
                backup = staging / "old" / str(i)
                backup.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(target, backup)
            done.append((target, backup))
            if i >= len(names):
                continue
            missing = [p for p in target.parents if p.is_relative_to(root) and not p.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            made += reversed(missing)
            shutil.move(staging / "new" / name, target)
    except BaseException as failure:
        stuck = []
        for target, backup in reversed(done):
            try:
                target.unlink(missing_ok=True)
                if backup is not None:
                    shutil.move(backup, target)
            except OSError as exc:
                stuck.append(f"{target.relative_to(root)} ({backup}: {exc})")
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        if stuck:
            (staging / "KEPT").write_text("\n".join(stuck) + "\n")
            raise SystemExit(f"unpacking stopped ({type(failure).__name__}: {failure}) and "
                             f"{len(stuck)} file(s) of the checkout could not be put back; "
                             f"each is kept in {staging / 'old'}: " + "; ".join(stuck)
                             ) from failure
        raise


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
    return (f"```{{note}}\nThe outputs on this page come from a CPU-only build: {why}. "
            "Cells that need a GPU say so in one line.\n```")


def _is_committed_table(output) -> bool:
    """An output ``helpers.results.show_committed`` displayed (it marks its tables)."""
    from helpers.results import DISPLAY_KEY

    return DISPLAY_KEY in output.get("metadata", {})


def splice(executed, recorded):
    """The page a matching recorded run gives: ``executed`` (the current chapter as the CPU
    build ran it: its prose and metadata current) with each code cell's outputs taken from
    ``recorded`` by position, except the committed-figures tables ``show_committed`` marks,
    which stay the CPU build's (they must list every machine committed now, this one included).
    Both notebooks must have the same code cells (their code hashes match)."""
    page = copy.deepcopy(executed)
    mine = [c for c in page.cells if c.cell_type == "code"]
    theirs = [c for c in recorded.cells if c.cell_type == "code"]
    if len(mine) != len(theirs):
        raise ValueError(f"the recorded run has {len(theirs)} code cells, the chapter "
                         f"{len(mine)}: their code hashes cannot match")
    for cell, rec in zip(mine, theirs, strict=True):
        tables = [o for o in cell.outputs if _is_committed_table(o)]
        outputs = []
        for out in rec.outputs:
            if not _is_committed_table(out):
                outputs.append(copy.deepcopy(out))
            elif tables:
                outputs.extend(tables)
                tables = []
        outputs.extend(tables)  # a table the recorded run did not mark
        cell.outputs = outputs
        cell.execution_count = rec.get("execution_count")
    book = page.metadata.setdefault("book", {})
    book["recorded_run"] = recorded.metadata["book"]["recorded_run"]
    if "widgets" in recorded.metadata:  # the state of the recorded progress bars
        page.metadata["widgets"] = recorded.metadata["widgets"]
    else:
        page.metadata.pop("widgets", None)
    return page


GPU_ONLY_MAGIC = "%%gpu_only"


def splice_gpu_only(page, recorded: list[tuple[Path, Any]]) -> int:
    """Give each ``%%gpu_only`` cell of a CPU-built ``page`` the outputs a recorded GPU run has
    for a cell with the same code (newest run first), headed with the run's machine and date.
    The rest of the page stays the CPU build's. Returns how many cells were filled in."""
    import nbformat

    runs = sorted(recorded, key=lambda item: item[1].metadata["book"]["recorded_run"].get(
        "date", ""), reverse=True)
    filled = 0
    for cell in page.cells:
        if cell.cell_type != "code" or not cell.source.lstrip().startswith(GPU_ONLY_MAGIC):
            continue
        for _path, nb in runs:
            match = next((c for c in nb.cells if c.cell_type == "code"
                          and c.source.strip() == cell.source.strip() and c.get("outputs")), None)
            if match is None:
                continue
            run = nb.metadata["book"]["recorded_run"]
            head = nbformat.v4.new_output(
                "stream", name="stdout",
                text=f"[recorded on {run.get('machine_label', run.get('slug'))}, torch "
                     f"{run.get('torch')}, {str(run.get('date', ''))[:10]}]\n")
            cell.outputs = [head, *copy.deepcopy(match.outputs)]
            filled += 1
            break
    return filled


def _insert_note(page, source: str, tag: str) -> None:
    import nbformat

    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["tags"] = [tag]
    cell["id"] = tag
    page.cells.insert(1 if page.cells and page.cells[0].cell_type == "markdown" else 0, cell)


def stage(args: argparse.Namespace) -> int:
    import nbformat

    args.out.mkdir(parents=True, exist_ok=True)
    shown = []
    for executed in sorted(args.executed.glob("*.ipynb")):
        chapter_path = args.chapter_dir / executed.name
        if not chapter_path.exists():
            continue
        page = nbformat.read(executed, as_version=4)
        if executed.stem.startswith(NOT_RECORDED_PREFIX):
            nbformat.write(page, args.out / executed.name)
            continue
        chapter = nbformat.read(chapter_path, as_version=4)
        recorded, stale = choose_page(chapter, args.pages, executed.stem)
        if recorded is not None:
            page = splice(page, recorded)
            _insert_note(page, stamp_text(page.metadata["book"]["recorded_run"]), STAMP_TAG)
            shown.append(f"{executed.stem} ({page.metadata['book']['recorded_run']['slug']})")
        elif page.metadata.get("book", {}).get("best_on", "gpu") != "cpu":
            filled = splice_gpu_only(page, recorded_pages(args.pages, executed.stem))
            if filled:
                shown.append(f"{executed.stem} ({filled} GPU-only cell(s))")
            _insert_note(page, cpu_note(stale), CPU_NOTE_TAG)
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
    parser.add_argument("--allow-cpu", action="store_true",
                        help="record a run without a GPU (a test of the report, never committed)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--no-bench", action="store_true",
                        help="skip the benchmark (a part of the report: chapters only)")
    parser.add_argument("--no-chapters", action="store_true",
                        help="skip the chapters (a part of the report: the benchmark only)")
    parser.add_argument("--tests", action="store_true",
                        help="also run the unit tests, GPU branches included (a part of their "
                             "own, beside the chapters that measure no time)")
    parser.add_argument("--cold-kernels", action="store_true",
                        help="start each chapter's kernel at its turn, as a reader's run does "
                             "(by default every kernel starts, and imports its chapter's "
                             "packages, all at once before the benchmark)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the chapters already recorded on this machine for their "
                             "current code, and keep their pages")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="stop the run after this many seconds, the tests too (as SIGINT "
                             "and SIGTERM do): what was recorded is kept, the summary says "
                             "what was cut short or not run, --archive is still written, and "
                             "--resume completes the chapters")
    cores = os.cpu_count() or 1
    parser.add_argument("--workers", type=int, default=max(1, min(4, cores // 4)),
                        help="chapters that measure no time run this many at a time (default: "
                             "a quarter of the cores, at most 4); those that time something "
                             "always run alone")
    parser.add_argument("--test-workers", type=int, default=max(1, min(8, cores // 2)),
                        help="pytest-xdist workers for --tests (default: half the cores, at "
                             "most 8; 1 for none)")
    parser.add_argument("--archive", type=Path, metavar="FILE",
                        help="pack everything this run wrote (result file, pages, executed "
                             "notebooks, test report, logs) into FILE (tar.xz, at most 16 MiB)"
                             "; `unpack FILE` puts it into a checkout")
    u = sub.add_parser("unpack", help="put a run's --archive into this checkout, for committing")
    u.add_argument("archive", type=Path)
    s = sub.add_parser("stage", help="choose the outputs each page of the book shows")
    s.add_argument("--executed", type=Path, required=True, help="the CPU-executed chapters")
    s.add_argument("--out", type=Path, required=True, help="where the book's pages go")
    s.add_argument("--chapter-dir", type=Path, default=CHAPTERS, help="the current chapters")
    s.add_argument("--pages", type=Path, default=ROOT / "results" / "pages",
                   help="the recorded runs (results/pages)")
    args = parser.parse_args(argv)
    if args.cmd == "stage":
        return stage(args)
    if args.cmd == "unpack":
        names = unpack(args.archive)
        print(f"Unpacked {len(names)} file(s) from {args.archive} into {ROOT}: commit "
              "results/ (the result file and the pages); _build/gpu-report/ holds the rest")
        return 0
    if args.workers < 1 or args.test_workers < 1:
        raise SystemExit("--workers and --test-workers must be at least 1")
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
