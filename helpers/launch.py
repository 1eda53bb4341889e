"""Launching training runs in other processes, with a time limit and a clean stop.

Introduced in chapter 7 (Data parallelism), used again in chapter 10 (Trainers):

- :func:`launch` runs ``torchrun`` (``python -m torch.distributed.run``) with ``N`` processes,
  prints their output as it comes and stops every process after a time limit, naming the
  likely causes of a failure or a hang (:class:`LaunchError`);
- :func:`run_ddp` launches chapter 7's DDP script, ``helpers.ddp_mnist``, that way;
- :func:`run_for_results` runs a script (under torchrun with ``nproc``, or as one plain
  process) with ``--out FOLDER`` and returns the JSON result file each process wrote there:
  files, not printed lines, since processes sharing one output stream interleave their lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

__all__ = ["LaunchError", "launch", "run_ddp", "run_for_results", "torchrun_command"]


class LaunchError(RuntimeError):
    """A launched run failed or ran past its time limit; the message names the likely causes
    (chapter 7)."""


_CAUSES = {
    "port": ("the rendezvous port is taken (\"address already in use\"): another run still "
             "holds MASTER_PORT. Wait for it to end, or pick a free port (--standalone picks "
             "one for you; --master-port N does not)."),
    "peers": ("the processes cannot reach each other: NCCL (or gloo) found no route to its "
              "peers, because of a firewall, the wrong network interface (set "
              "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) or an unreachable MASTER_ADDR. Re-run "
              "with NCCL_DEBUG=INFO to see which."),
    "crash": ("a rank crashed: its traceback is in the workers' output; the other ranks then "
              "wait for it in their next collective."),
    "world": ("the world size does not match: fewer processes joined than WORLD_SIZE / "
              "--nproc-per-node says (more processes than GPUs gives 'invalid device "
              "ordinal'), so the others wait for ranks that never come."),
}


def _check_nproc(nproc: object, *, allow_none: bool = False) -> None:
    if allow_none and nproc is None:
        return
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be a whole number of processes such as 2, got {nproc!r} "
                        f"({type(nproc).__name__})"
                        + ("; or None for one plain process" if allow_none else ""))
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}: give the number of "
                         "processes to start (one per GPU, or 2 on the CPU)")


def _check_seconds(name: str, value: object, *, zero_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r} "
                        f"({type(value).__name__})")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be {'non-negative' if zero_ok else 'positive'} "
                         f"seconds, got {value}")


def _check_program(program: object, cwd: str | Path | None = None) -> list[str]:
    """``program`` as a list of strings; a script it names must exist."""
    if isinstance(program, (str, bytes, Path)):
        raise TypeError(f"program must be a list of arguments, such as [{str(program)!r}] or "
                        f"['-m', 'module'], got the single {type(program).__name__} "
                        f"{str(program)!r}")
    try:
        args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in program]
    except TypeError:
        raise TypeError(f"program must be a list of arguments, got {program!r}") from None
    if not args:
        raise ValueError("program is empty: give a script path or ['-m', 'module']")
    if args[0] == "-m":
        if len(args) < 2 or not args[1]:
            raise ValueError(f"program {args} has '-m' but no module name after it")
    elif not args[0].startswith("-"):
        script = Path(cwd or ".") / args[0]
        if not script.is_file():
            what = "a folder" if script.is_dir() else "not found"
            raise FileNotFoundError(f"program's script {args[0]!r} is {what} (looked in "
                                    f"{Path(cwd or '.').resolve()}): give the path of a "
                                    "Python file, or ['-m', 'module'] for a module")
    return args


def torchrun_command(nproc: int, program: list[str], *,
                     log_dir: str | Path | None = None) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N <program>``: torchrun
    run by this Python, so the workers use the same environment (chapter 7).

    ``log_dir`` is passed as ``--log-dir``: without it torchrun makes a ``torchelastic_*``
    folder in the system's temporary directory for every run and never removes it.
    """
    _check_nproc(nproc)
    if isinstance(program, (str, bytes)) or not list(program):
        raise ValueError(f"program must be a non-empty list of arguments, such as "
                         f"['script.py'] or ['-m', 'module'], got {program!r}")
    if log_dir is not None and Path(log_dir).exists() and not Path(log_dir).is_dir():
        raise NotADirectoryError(f"log_dir {str(log_dir)!r} is a file: give a folder (or "
                                 "None) for torchrun's logs")
    logs = [] if log_dir is None else ["--log-dir", str(log_dir)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), *logs, *map(str, program)]


def _likely_causes(output: str, timed_out: bool) -> list[str]:
    text = output.lower()
    found = []
    if "address already in use" in text or "eaddrinuse" in text:
        found.append("port")
    if any(s in text for s in ("connection refused", "no route to host", "nccl error",
                               "unhandled system error", "connection reset", "socket timeout")):
        found.append("peers")
    if "invalid device ordinal" in text or "world_size" in text or "world size" in text:
        found.append("world")
    if any(s in text for s in ("traceback", "childfailederror", "exitcode", "signal")):
        found.append("crash")
    if timed_out or not found:
        # A hang leaves no message: any of them can be the reason.
        found += [key for key in ("crash", "world", "peers", "port") if key not in found]
    return [_CAUSES[key] for key in found]


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """Stop torchrun and every worker it started.

    torchrun starts each worker in a session of its own, so a signal to torchrun's group
    does not reach them; SIGTERM to torchrun makes it stop its workers and wait for them.
    Whatever is left after ``grace`` seconds (torchrun's group, and every worker whose
    parent is torchrun, read again just before the kill, since torchrun may have started
    workers in the meantime) is killed.
    """
    if proc.poll() is not None:
        return
    workers = set(_children(proc.pid))
    if os.name == "nt":
        proc.terminate()
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        workers.update(_children(proc.pid))  # while torchrun lives its workers are its children
        if os.name == "nt":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in sorted(workers):  # normally gone already; never leave a worker behind
        for kill in (lambda p: os.killpg(p, signal.SIGKILL), lambda p: os.kill(p, signal.SIGKILL)):
            try:
                kill(pid)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def launch(nproc: int, program: list[str], *, timeout: float = 600.0, grace: float = 10.0,
           env: dict[str, str] | None = None, cwd: str | Path | None = None,
           echo: bool = True) -> str:
    """Run ``torchrun --standalone --nproc-per-node nproc <program>`` (chapter 7).

    The workers' output is printed as it comes (``echo``) and returned. After ``timeout``
    seconds, or when torchrun fails, every process is stopped and ``LaunchError`` names
    the likely causes. ``program`` is ``["-m", "module", args...]`` or ``["script.py", ...]``.
    torchrun's log folder is a temporary one, removed when the run ends.
    """
    _check_nproc(nproc)
    _check_seconds("timeout", timeout)
    _check_seconds("grace", grace, zero_ok=True)
    program = _check_program(program, cwd)
    env = _check_env(env)
    if cwd is not None and not Path(cwd).is_dir():
        raise NotADirectoryError(f"cwd {str(cwd)!r} is not a folder: give the folder the "
                                 "workers should start in, or None for this one")
    shown = " ".join(["torchrun --standalone --nproc-per-node", str(nproc), *program])
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with tempfile.TemporaryDirectory(prefix="torchrun-logs-") as logs:
        output, code, timed_out = _run_and_watch(
            torchrun_command(nproc, program, log_dir=logs), run_env, cwd, timeout, grace, echo)
    if timed_out or code != 0:
        what = (f"torchrun ran past its time limit of {timeout:g} s and was stopped"
                if timed_out else f"torchrun failed with exit code {code}")
        causes = "\n".join(f"  - {c}" for c in _likely_causes(output, timed_out))
        # Without echo nobody saw the output: the tracebacks it holds go into the error.
        said = "" if echo else f"\nThe output ended with:\n{output[-3000:]}"
        raise LaunchError(f"{what} ({shown}). Likely causes:\n{causes}{said}")
    return output


def _check_env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables, got {env!r}")
    bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        raise TypeError(f"env's names and values must be strings, got {bad!r}: write "
                        "numbers as strings, e.g. {'NCCL_DEBUG': 'INFO', 'OMP_NUM_THREADS': "
                        "'1'}")
    return env


def _run_and_watch(command: list[str], env: dict[str, str], cwd: str | Path | None,
                   timeout: float, grace: float, echo: bool) -> tuple[str, int | None, bool]:
    """Run ``command``, echoing its output; stop it after ``timeout`` seconds. Returns the
    output's last 200 lines, the exit code and whether it timed out."""
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                            start_new_session=os.name != "nt")
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # a thread reads, so the main thread can keep an eye on the clock
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    tail: deque[str] = deque(maxlen=200)

    def take(line: str) -> None:
        tail.append(line)
        if echo:
            print(line, end="", flush=True)

    deadline = time.monotonic() + timeout
    timed_out = finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                finished = True
                break
            take(line)
    finally:
        if finished:  # the output ended: torchrun is exiting on its own
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _stop(proc, grace)  # a no-op after a clean exit; also runs on KeyboardInterrupt
        # What torchrun printed while stopping (which worker it killed, with which signal)
        # belongs in the output and in the error message too.
        reader.join(timeout=grace)  # every writer is gone, so the pipe reaches its end
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                take(line)
        if not reader.is_alive():  # closing a pipe another thread still reads could block
            assert proc.stdout is not None
            proc.stdout.close()
    return "".join(tail), proc.returncode, timed_out


def run_ddp(nproc: int, backend: str, out: str | Path, *extra: object,
            timeout: float = 600.0, echo: bool = True) -> dict:
    """Train with ``torchrun -m helpers.ddp_mnist`` on ``nproc`` processes, printing the
    command and the output live (``echo``; with ``echo=False`` nothing is printed), and
    return rank 0's summary (chapter 7). Raises ``LaunchError`` after ``timeout`` seconds
    or on failure, with the end of the output when it was not echoed.

    The arguments are checked here, before any process starts: ``backend`` is ``"gloo"``
    or ``"nccl"`` (one CUDA GPU per process), ``out`` a folder (made if missing) that this
    user can write, and ``extra`` the script's other options (``--epochs 2`` ...).
    """
    from helpers.ddp_mnist import SUMMARY_NAME, parse_args

    _check_nproc(nproc)
    _check_seconds("timeout", timeout)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend {backend!r} is not one this script runs: use 'gloo' (CPU "
                         "processes) or 'nccl' (one CUDA GPU per process)")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < nproc:
            raise ValueError(f"backend 'nccl' needs one CUDA GPU per process: {nproc} "
                             f"processes, {gpus} GPU(s) here. Start at most {gpus} "
                             "processes, or use backend 'gloo' on the CPU")
    program = ["-m", "helpers.ddp_mnist", "--backend", backend, "--out", str(out),
               *map(str, extra)]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # the script's own checks, here, not per rank
            parse_args(program[2:])
    except SystemExit:
        reason = said.getvalue().strip().splitlines()[-1:] or ["invalid options"]
        raise ValueError(f"helpers.ddp_mnist refuses the options {program[2:]}: "
                         f"{reason[0]}") from None
    _writable_folder(Path(out))
    if echo:
        print("$ torchrun --standalone --nproc-per-node", nproc, *program, flush=True)
    start = time.perf_counter()
    launch(nproc, program, timeout=timeout, echo=echo)
    if echo:
        print(f"(wall time including process start-up: {time.perf_counter() - start:.1f} s)")
    return json.loads((Path(out) / SUMMARY_NAME).read_text())


def _writable_folder(out: Path) -> None:
    """Make ``out`` if missing; refuse a file, or a folder this user cannot write."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"out {str(out)!r} is a file: give a folder for the "
                                 "checkpoint and the result files")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        raise PermissionError(f"cannot write into out folder {str(out)!r} ({err.strerror}): "
                              "give a folder you can write") from None


def run_for_results(program: list[str], *, nproc: int | None = None, timeout: float = 300.0,
                    echo: bool = False) -> list[dict]:
    """Run ``program`` with ``--out FOLDER`` and return the JSON files its processes wrote
    there, in name order (chapter 10).

    ``program`` is ``["script.py", args...]`` or ``["-m", "module", args...]``. With ``nproc``
    it runs under torchrun (:func:`launch`), else as one process of this Python; either way
    with a time limit, one CPU thread per process and a clean stop. A failure raises
    :class:`LaunchError` with the end of the output.
    """
    _check_nproc(nproc, allow_none=True)
    _check_seconds("timeout", timeout)
    program = _check_program(program)
    with tempfile.TemporaryDirectory(prefix="run-results-") as out:
        if nproc is not None:
            launch(nproc, [*program, "--out", out], timeout=timeout, echo=echo)
        else:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            command = [sys.executable, *program, "--out", out]
            output, code, timed_out = _run_and_watch(command, env, None, timeout, 10.0, echo)
            if timed_out or code != 0:
                what = (f"ran past its time limit of {timeout:g} s and was stopped" if timed_out
                        else f"failed with exit code {code}")
                raise LaunchError(f"{' '.join(program)} {what}. Its output ended with:\n"
                                  f"{output[-3000:]}")
        files = sorted(Path(out).glob("*.json"))
        if not files:
            raise LaunchError(f"{' '.join(program)} finished but wrote no result file into "
                              "its --out folder")
        results = []
        for f in files:
            try:
                results.append(json.loads(f.read_text()))
            except (ValueError, UnicodeDecodeError) as err:
                raise LaunchError(f"{' '.join(program)} wrote {f.name}, which is not JSON "
                                  f"({err}): each process must write one JSON file") from None
        return results
