"""Shared fixtures for the book's tests."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
STAGE = ROOT / "_executed"
# Every chapter executed again with the oldest supported torch (`make oldest`).
OLDEST = ROOT / "_oldest" / "chapters"


@pytest.fixture(autouse=True)
def _no_device_override(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests choose devices explicitly; a BOOK_DEVICE set in the shell must not leak in.
    monkeypatch.delenv("BOOK_DEVICE", raising=False)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def pytest_report_header(config: pytest.Config) -> str:
    import torch

    return f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, cpus: {os.cpu_count()}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-book", action="store_true",
                     help="fail (instead of skip) the tests that need `make book`'s output")


@pytest.fixture(scope="session")
def built_book(request: pytest.FixtureRequest) -> Path:
    """The built HTML book; skipped (or, with --require-book, failed) when it is missing."""
    if not (HTML / ".built").exists():
        message = "the book is not built: run `make book` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    return HTML
