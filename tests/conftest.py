"""Shared fixtures for the book's tests."""

from __future__ import annotations

import functools
import http.server
import os
import threading
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
# The browser the page tests read the built book in, and where they keep screenshots.
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = BUILD / "screenshots"
#: Screenshots (of every page, and of a few searches) are for a maintainer to look at and are
#: asserted on by nothing: taken only with BOOK_SCREENSHOTS=1 (CONTRIBUTING.md).
SCREENSHOTS = os.environ.get("BOOK_SCREENSHOTS", "") not in ("", "0")


def screenshot(page, name: str, **kwargs) -> None:
    """Save a screenshot of ``page`` under _build/screenshots/, when BOOK_SCREENSHOTS=1."""
    if SCREENSHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / name), **kwargs)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests marked slow run first (in their own order): on several workers, which
    # pytest-xdist hands tests in this order, a long test started last would keep one worker
    # busy long after the others are done.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-book", action="store_true",
                     help="fail (instead of skip) the tests that need `make book`'s output")


@pytest.fixture(scope="session")
def built_book(request: pytest.FixtureRequest) -> Path:
    """The built HTML book; skipped (or, with --require-book, failed) when it is missing.
    ``BOOK_HTML=<folder>`` points the tests at a book built elsewhere (a small test book)."""
    if os.environ.get("BOOK_HTML"):
        return Path(os.environ["BOOK_HTML"])
    if not (HTML / ".built").exists():
        message = "the book is not built: run `make book` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    return HTML


@pytest.fixture(scope="session")
def server(built_book: Path):
    """The built book served over HTTP on a free local port: its base URL (one server per
    test process)."""
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test log readable
        pass


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (playwright) for the tests that read the built pages: one per test
    process; each test opens its own pages (a fresh context each) and closes them."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="session")
def built_page(server: str, browser):
    """``built_page(file)``: what the page tests check of the built page ``file`` (see
    tests.support.read_built_page), read in Chromium once per test process, however many
    tests check it. With BOOK_SCREENSHOTS=1 that load also saves the page's full-page
    screenshot under _build/screenshots/."""
    from tests.support import read_built_page

    read: dict[str, dict] = {}

    def facts(file: str) -> dict:
        if file not in read:
            shot = None
            if SCREENSHOTS:
                SHOTS.mkdir(parents=True, exist_ok=True)
                shot = SHOTS / f"{Path(file).name}.png"
            read[file] = read_built_page(browser, f"{server}/{file}.html", shot)
        return read[file]

    return facts


@pytest.fixture(scope="module")
def real_root() -> Path:
    """The folder holding the real, MD5-checked MNIST files (``make data`` fetched them)."""
    from helpers.data import DataError, data_dir, verify_mnist

    try:
        verify_mnist()
    except DataError as exc:  # pragma: no cover - the Makefile fetches it first
        pytest.fail(f"MNIST is not fetched: {exc}")
    return data_dir()


@pytest.fixture
def copy_root(tmp_path: Path, real_root: Path) -> Path:
    """A private copy of the MNIST files, for tests that damage or move them."""
    import shutil

    from helpers.data import MNIST_FILES

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        shutil.copy(real_root / "MNIST" / "raw" / name, raw / name)
    return tmp_path


@pytest.fixture(scope="module")
def troubleshooting():
    """The entries of the troubleshooting page (chapter 9), by label."""
    from tests.support import read_entries

    return read_entries()
