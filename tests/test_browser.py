"""The built book, opened page by page in a real browser (Debian's Chromium, driven by
Playwright). Saves a screenshot of every page under _build/screenshots/."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import nbformat
import pytest

from tests.conftest import BUILD, ROOT, STAGE
from tests.test_notebooks import repository_url, toc_files

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = BUILD / "screenshots"

pytestmark = pytest.mark.book


def page_title(file: str) -> str:
    """The H1 of a chapter, as its source spells it (without the markdown #)."""
    for ext in (".ipynb", ".md"):
        src = ROOT / f"{file}{ext}"
        if src.exists():
            text = (nbformat.read(src, as_version=4).cells[0].source if ext == ".ipynb"
                    else src.read_text())
            for line in text.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise AssertionError(f"{file} has no title line")


def image_outputs(file: str) -> int:
    path = STAGE / f"{file}.ipynb"
    if not path.exists():
        return 0
    nb = nbformat.read(path, as_version=4)
    return sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "image/png" in o.get("data", {}))


@pytest.fixture(scope="module")
def server(built_book: Path):
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test log readable
        pass


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.mark.parametrize("file", toc_files())
def test_page_renders(file, server, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        response = page.goto(f"{server}/{file}.html", wait_until="load")
        assert response is not None and response.ok, f"{file}.html did not load"
        page.wait_for_selector("article.bd-article h1")
        title = page_title(file)
        assert title in page.title(), f"title {page.title()!r} does not contain {title!r}"
        assert title in page.inner_text("article.bd-article h1")

        main = page.inner_text("article.bd-article")
        assert "Traceback (most recent call last)" not in main
        assert len(main) > 500, "the page is nearly empty"

        if (ROOT / f"{file}.ipynb").exists():
            colab = page.locator('a[href*="colab.research.google.com"]')
            assert colab.count() >= 1, "no Colab launch button"
            owner_repo = repository_url().removeprefix("https://github.com/")
            expected = (f"https://colab.research.google.com/github/{owner_repo}/blob/main/"
                        f"{file}.ipynb")
            assert colab.first.get_attribute("href") == expected

        images = page.locator("article.bd-article img")
        broken = page.evaluate(
            "() => Array.from(document.querySelectorAll('article.bd-article img'))"
            ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
        assert not broken, f"images that did not load: {broken}"
        expected_images = image_outputs(file)
        assert images.count() >= expected_images, \
            f"the notebook made {expected_images} plots, the page shows {images.count()}"
        page.screenshot(path=str(SHOTS / f"{Path(file).name}.png"), full_page=True)
    finally:
        page.close()


def test_search_finds_the_troubleshooting_page(server, browser):
    if not any("troubleshooting" in f for f in toc_files()):
        pytest.skip("no troubleshooting page in the table of contents")
    page = browser.new_page()
    try:
        page.goto(f"{server}/search.html?q=device", wait_until="load")
        page.wait_for_selector("#search-results a", timeout=30_000)
        links = page.eval_on_selector_all("#search-results a", "els => els.map(e => e.href)")
        assert any("troubleshooting" in href for href in links), links
    finally:
        page.close()
