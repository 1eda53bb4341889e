"""How a page keeps its claims true, and how it shows cells that need a GPU.

Introduced in chapter 1 and used by every chapter:

- :func:`expect` checks a claim that depends on the hardware (a timing relation, a speed-up).
  Where the book is built and tested (``BOOK_STRICT=1``: CI, ``make book``, ``make test``, the
  GPU report) a failed claim fails the run; in a reader's session it warns, naming the claim and
  the measured numbers, and the chapter goes on. Correctness checks (equal results, devices,
  shapes, accuracy floors) are plain ``assert`` statements everywhere.
- ``%%gpu_only`` is a cell magic, registered by :func:`helpers.chapter_setup`, for the cells that
  can only do their work on a GPU (streams, pinned copies, sync-debug mode, two GPUs). Where the
  chapter's device is such a GPU the cell runs as usual; elsewhere its body is skipped and one
  short line says what it needs and how to run it.
"""

from __future__ import annotations

import argparse
import ast
import os
import shlex
import warnings
from typing import Any

import torch

__all__ = [
    "COLAB_HINT",
    "STRICT_ENV_VAR",
    "ClaimNotMet",
    "ClaimWarning",
    "expect",
    "gpu_only_reason",
    "register_magics",
    "strict",
]

#: Set to ``1`` where a failed hardware-dependent claim must fail the run (CI, make, GPU report).
STRICT_ENV_VAR = "BOOK_STRICT"

#: Where a reader without a GPU can run a GPU-only cell.
COLAB_HINT = "to run it, open the chapter in Colab with a T4 GPU runtime"


class ClaimNotMet(AssertionError):
    """A hardware-dependent claim of the page did not hold, in a strict run (chapter 1)."""


class ClaimWarning(UserWarning):
    """A hardware-dependent claim of the page did not hold in a reader's session (chapter 1)."""


def strict() -> bool:
    """True where failed claims fail the run: ``$BOOK_STRICT`` is ``1`` (chapter 1)."""
    value = os.environ.get(STRICT_ENV_VAR, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"${STRICT_ENV_VAR}={value!r}: use 1 (claims are strict) or 0 (they warn)")
    return value == "1"


def _figures(figures: dict[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    return ", ".join(f"{name}={fmt(value)}" for name, value in figures.items())


def expect(condition: bool, claim: str, **figures: Any) -> bool:
    """Check a hardware-dependent ``claim`` of the page; return whether it held (chapter 1).

    ``figures`` are the measured numbers behind the claim, printed with it when it fails.
    Strict runs (:func:`strict`) raise :class:`ClaimNotMet`; a reader's session gets a
    :class:`ClaimWarning` and the chapter goes on.
    """
    if not isinstance(claim, str) or not claim.strip():
        raise TypeError("expect() needs the claim in words, for example 'the GPU is faster'")
    try:
        held = bool(condition)
    except RuntimeError as exc:  # e.g. a tensor of several values
        raise TypeError(f"expect() needs a single truth value for {claim!r}: {exc}") from None
    if held:
        return True
    message = f"The page claims that {claim}, but not on this machine"
    if figures:
        message += f" ({_figures(figures)})"
    if strict():
        raise ClaimNotMet(message + ".")
    warnings.warn(message + ": timings vary between machines and runs; the chapter goes on.",
                  ClaimWarning, stacklevel=2)
    return False


# -- GPU-only cells ---------------------------------------------------------------------------

_KIND_NAMES = {"cuda": "a CUDA GPU", "mps": "an Apple GPU (mps)", "xpu": "an Intel GPU (xpu)"}

_PARSER = argparse.ArgumentParser(prog="%%gpu_only", add_help=False, exit_on_error=False)
_PARSER.add_argument("--gpus", type=int, default=1)
_PARSER.add_argument("--kinds", default="cuda")


def _parse(line: str) -> argparse.Namespace:
    try:
        args = _PARSER.parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit, ValueError) as exc:
        raise ValueError(f"%%gpu_only {line!r}: {exc}; use e.g. '%%gpu_only --gpus 2' or "
                         "'%%gpu_only --kinds cuda,mps'") from None
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in _KIND_NAMES]
    if not kinds or unknown or args.gpus < 1:
        raise ValueError(f"%%gpu_only {line!r}: --kinds takes {', '.join(_KIND_NAMES)} and "
                         "--gpus a count of at least 1")
    args.kinds = kinds
    return args


def _count(kind: str) -> int:
    from .devices import _type_count

    return _type_count(kind)


def gpu_only_reason(device: torch.device | str, line: str = "") -> str | None:
    """Why a ``%%gpu_only`` cell with options ``line`` cannot run on ``device``, or ``None``.

    Used by the cell magic (chapter 1); ``line`` is what follows ``%%gpu_only``.
    """
    args = _parse(line)
    device = torch.device(device)
    needs = " or ".join(_KIND_NAMES[k] for k in args.kinds)
    if args.gpus > 1:
        needs = f"{args.gpus} GPUs ({needs})"
    if device.type not in args.kinds:
        where = (COLAB_HINT if args.gpus == 1 else
                 "to run it, use a machine with several GPUs (Colab's runtimes have one)")
        return f"This cell needs {needs}; this run uses {device}: {where}."
    if args.gpus > 1 and _count(device.type) < args.gpus:
        return (f"This cell needs {needs}; this machine has {_count(device.type)}. "
                "Run it on a machine with several GPUs.")
    return None


def _run_body(shell: Any, body: str) -> None:
    # Executed in the notebook's namespace, so the cell reads and defines the reader's
    # variables; exceptions propagate and fail the cell, and a final expression is displayed.
    tree = ast.parse(body, filename="<gpu_only cell>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<gpu_only cell>", "exec"), shell.user_ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<gpu_only cell>", "eval"), shell.user_ns)
        if value is not None:
            shell.displayhook(value)


def register_magics(device: torch.device) -> bool:
    """Register ``%%gpu_only`` in the running IPython kernel for ``device`` (chapter 1).

    Returns False outside IPython (a plain Python script has no cell magics).
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False

    def gpu_only(line: str, cell: str) -> None:
        reason = gpu_only_reason(device, line)
        if reason:
            print(reason)
            return
        _run_body(shell, cell)

    shell.register_magic_function(gpu_only, magic_kind="cell", magic_name="gpu_only")
    return True
