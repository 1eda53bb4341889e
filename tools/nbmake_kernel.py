"""A pytest plugin for the book's chapter runs: ``pytest -p tools.nbmake_kernel --nbmake ...``.

nbmake's kernels differ from a reader's Jupyter kernel in two ways that this plugin undoes:

- **What the page shows.** A kernel started under pytest inherits ``PYTEST_CURRENT_TEST``, and
  ipykernel then leaves the process's own stdout and stderr alone (pytest captures them): what
  C++ code writes there (torch's profiler, kineto, c10d) never reaches the notebook. In
  Jupyter it does, as a stderr stream under the cell. Here the kernel starts without that
  variable, so the executed chapter shows what a reader's shows, and the book's output checks
  see it.
- **How it ends.** nbclient shuts a kernel down gracefully, and Python then took 2-3 s (about
  2 CPU-s) to tear torch down after the last cell, for every chapter run. Every output is in
  once the last cell has replied, so the kernel is killed instead (its process group, as
  jupyter_client does).
"""

from __future__ import annotations

import os
from typing import Any

#: Set by pytest while a test runs; ipykernel does not capture the process's file descriptors
#: where it is set.
PYTEST_VARIABLE = "PYTEST_CURRENT_TEST"


def reader_environment() -> dict[str, str]:
    """This process's environment without pytest's variable: a reader's kernel gets none."""
    return {k: v for k, v in os.environ.items() if k != PYTEST_VARIABLE}


def pytest_configure(config: Any) -> None:
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    if getattr(NotebookClient, "_book_reader_kernel", False):
        return
    start = NotebookClient.async_start_new_kernel

    async def start_like_jupyter(self: Any, **kwargs: Any) -> None:
        kwargs.setdefault("env", reader_environment())
        await start(self, **kwargs)

    # nbmake runs the asynchronous one; the synchronous one wraps the original, so both.
    NotebookClient.async_start_new_kernel = start_like_jupyter
    NotebookClient.start_new_kernel = run_sync(start_like_jupyter)
    NotebookClient.shutdown_kernel.default_value = "immediate"
    NotebookClient._book_reader_kernel = True
