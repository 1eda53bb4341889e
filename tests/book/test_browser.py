"""The built book, opened page by page in a real browser (Debian's Chromium, driven by
Playwright). Each page is loaded once per test process (conftest's ``built_page``) for all the
checks of it; with BOOK_SCREENSHOTS=1 a screenshot of every page is saved under
_build/screenshots/."""

from __future__ import annotations

import json
import re
from urllib.parse import quote_plus

import nbformat
import pytest

from tests.conftest import ROOT, STAGE, screenshot
from tests.support import read_entries, toc_files
from tools.notebook import repository_url

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


@pytest.mark.parametrize("file", toc_files())
def test_page_renders(file, built_page):
    shown = built_page(file)  # with BOOK_SCREENSHOTS=1, its full-page screenshot
    assert shown["ok"], f"{file}.html did not load"
    title = page_title(file)
    assert shown["h1"] is not None, f"{file}.html has no article heading"
    assert title in shown["title"], f"title {shown['title']!r} does not contain {title!r}"
    assert title in shown["h1"]

    main = shown["text"]
    assert "Traceback (most recent call last)" not in main
    assert len(main) > 500, "the page is nearly empty"

    if (ROOT / f"{file}.ipynb").exists():
        colab = shown["colab"]
        assert len(colab) >= 1, "no Colab launch button"
        owner_repo = repository_url().removeprefix("https://github.com/")
        expected = (f"https://colab.research.google.com/github/{owner_repo}/blob/main/"
                    f"{file}.ipynb")
        assert colab[0] == expected

    assert not shown["broken"], f"images that did not load: {shown['broken']}"
    expected_images = image_outputs(file)
    assert shown["images"] >= expected_images, \
        f"the notebook made {expected_images} plots, the page shows {shown['images']}"


# Five messages as a reader pastes them, whole, into the search box: each must lead first to its
# entry. The out-of-memory one comes from another run (other sizes) than the page's quote.
TROUBLESHOOTING = "chapters/09_troubleshooting"


def pasted_messages() -> dict[str, str]:
    entries = read_entries()
    other_run = iter(["512.00 MiB", "15.77 GiB", "80.12 MiB", "15.69 GiB", "14.98 GiB",
                      "330.52 MiB"])
    oom = re.sub(r"\d+\.\d+ [KMG]iB", lambda _: next(other_run), entries["err-cuda-oom"].blocks[0])
    assert oom != entries["err-cuda-oom"].blocks[0]
    return {
        "err-same-device": entries["err-same-device"].blocks[0],
        "err-cuda-oom": oom,
        "err-forked-cuda": entries["err-forked-cuda"].blocks[0],
        "err-numpy-cuda": entries["err-numpy-cuda"].blocks[0],
        "err-weights-only": entries["err-weights-only"].blocks[0],  # several lines
    }


# sphinx-thebe's configuration script appears twice on each page (Jupyter Book's doing), and
# the second declaration of its constant fails: not an error of the search.
THEME_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)


def page_errors(page) -> list[str]:
    """The uncaught script errors of a page, collected from now on."""
    errors: list[str] = []
    page.on("pageerror", lambda error: None if str(error) in THEME_ERRORS
            else errors.append(str(error)))
    return errors


def search(page, server: str, query: str) -> list[str]:
    """The result links of the book's search page for a query, best first."""
    page.goto(f"{server}/search.html?q={quote_plus(query)}", wait_until="load")
    page.wait_for_selector("#search-results .search-summary", timeout=60_000)
    return page.eval_on_selector_all("#search-results li > a", "els => els.map(e => e.href)")


@pytest.mark.parametrize("label", list(pasted_messages()))
def test_a_pasted_message_lands_first_on_its_entry(label, server, browser):
    if TROUBLESHOOTING not in toc_files():
        pytest.fail("the troubleshooting page is not in the table of contents")
    message = pasted_messages()[label]
    page = browser.new_page()
    errors = page_errors(page)
    try:
        links = search(page, server, message)
        assert links, f"searching the message of {label} found nothing"
        assert links[0] == f"{server}/{TROUBLESHOOTING}.html#{label}", \
            f"searching the message of {label} lists first {links[0]} (then {links[1:4]})"
        assert links.count(links[0]) == 1
        first = page.inner_text("#search-results li")
        assert "Fix:" in first, f"the entry's result shows no fix: {first!r}"
        assert not errors, f"the search page raised: {errors}"
        page.goto(links[0], wait_until="load")
        landed = page.evaluate(
            """(label) => {
                const target = document.getElementById(location.hash.slice(1));
                const section = target && target.closest("section");
                return target && target.id === label && section ? section.querySelector("h3").innerText
                                                                : null;
            }""", label)
        assert landed, f"{links[0]} does not lead to the entry {label}"
        assert read_entries()[label].heading.replace("`", "") in landed.replace("\u00b6", "")
        screenshot(page, f"search-{label}.png")
    finally:
        page.close()


def test_a_message_with_angle_brackets_is_shown_as_text(server, browser):
    """The entry's title goes into the result list as text: `<module '__main__' ...>` is not
    taken for an HTML tag (and lost)."""
    entry = read_entries()["err-spawn-main"]
    page = browser.new_page()
    try:
        links = search(page, server, entry.blocks[0])
        assert links and links[0].endswith("#err-spawn-main"), links[:3]
        shown = page.inner_text("#search-results li > a")
        assert "<module '__main__' (built-in)>" in shown, shown
    finally:
        page.close()


@pytest.mark.parametrize("query", ["pin_memory", "map_location weights_only"])
def test_a_keyword_search_is_sphinx_own(query, server, browser):
    """A few keywords are Sphinx's business: the same results with or without
    _static/error-search.js, and no error."""
    found = {}
    for script in (True, False):
        page = browser.new_page()
        errors = page_errors(page)
        if not script:
            page.route("**/error-search.js*", lambda route: route.abort())
        try:
            found[script] = search(page, server, query)
            assert not errors, f"the search page raised: {errors}"
        finally:
            page.close()
    assert found[True], f"searching {query!r} found nothing"
    assert found[True] == found[False]


def test_a_pasted_message_falls_back_to_sphinx_without_the_index(server, browser):
    """Where the troubleshooting page cannot be read (a file:// page, a failed request), the
    search page shows Sphinx's own results instead of nothing."""
    message = pasted_messages()["err-same-device"]
    page = browser.new_page()
    # Sphinx's own summary of that page fails to load too, with an error of its own.
    page.route(f"**/{TROUBLESHOOTING}.html", lambda route: route.abort())
    try:
        links = search(page, server, message)
        assert links, "no results at all when the troubleshooting page cannot be read"
        assert not any("#err-" in link for link in links), links
    finally:
        page.close()


@pytest.mark.parametrize("file", toc_files())
def test_no_code_or_output_box_is_clipped(file, built_page):
    """Outputs (and the messages the troubleshooting index quotes) wrap inside their box, and
    code of 88 columns fits its box at 1280 pixels (_static/book.css): none hides its end
    behind a horizontal scroll (tests.support.BOXES: code cells and code blocks, hidden ones
    included, and output boxes)."""
    shown = built_page(file)
    assert shown["ok"], f"{file}.html did not load"
    clipped = shown["clipped"]
    assert not clipped, f"{len(clipped)} boxes are clipped on the right: {clipped[:5]}"


@pytest.mark.parametrize("width", [375, 768])
def test_a_narrow_window_gives_the_text_its_whole_width(width, server, browser):
    """Below 1200 pixels the contents column is a drawer: the book's narrower column
    (_static/book.css) must not take room from the text there."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(f"{server}/chapters/03_matmul.html", wait_until="load")
        text = page.evaluate("document.querySelector('.bd-article-container')"
                             ".getBoundingClientRect().width")
        assert text >= width - 1, f"the text is {text:.0f} px wide in a {width}-pixel window"
    finally:
        page.close()


@pytest.fixture(scope="module")
def screens(built_page) -> dict[str, float]:
    """Each page's length in screens of a 1280x900 window, as it opens: collapsed dropdowns and
    hidden-cell toggles count collapsed."""
    lengths = {}
    for file in toc_files():
        shown = built_page(file)
        assert shown["ok"], f"{file}.html did not load"
        lengths[file] = shown["height"] / 900
    return lengths


def test_a_chapter_fits_a_reading(screens):
    # The appendix included: its tables of figures are folded, one per workload, so it no
    # longer grows a screen with each committed machine.
    lessons = {f: n for f, n in screens.items()
               if f.startswith("chapters/") and f != TROUBLESHOOTING}
    long = {f: round(n, 1) for f, n in lessons.items() if n > 15}
    assert not long, f"chapters over 15 screens at 1280x900: {long}"
    assert screens[TROUBLESHOOTING] <= 30, \
        f"the troubleshooting page is {screens[TROUBLESHOOTING]:.1f} screens at 1280x900"


def test_the_whole_book_fits_195_screens(screens):
    # 185 until 2026-11-28, when the symptom index, the cheat sheet's Part IV and the first GPU
    # run's lessons took the book to 201; folding the troubleshooting index's groups and the
    # appendix's tables brought it back to 178 before chapter 14 (10.4 screens) came: 189.
    total = sum(screens.values())
    assert total <= 195, (f"the book is {total:.0f} screens at 1280x900: "
                          + ", ".join(f"{f} {n:.1f}" for f, n in screens.items()))


def test_search_index_holds_every_troubleshooting_entry(built_book):
    """Every entry's heading is a title in Sphinx's search index, linked to its section, so the
    search box can land on any of them (the browser test above tries five)."""
    text = (built_book / "searchindex.js").read_text()
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    doc = index["docnames"].index(TROUBLESHOOTING)
    html = (built_book / f"{TROUBLESHOOTING}.html").read_text()
    for label, entry in read_entries().items():
        title = entry.heading.replace("`", "")
        hits = [anchor for d, anchor in index["alltitles"].get(title, []) if d == doc]
        assert hits, f"[{label}] {title!r} is not a title of the search index"
        section = re.search(rf'<section id="{re.escape(hits[0])}">(.*?)</section>', html, re.S)
        assert section and f'id="{label}"' in section[1], f"[{label}] the title's anchor is not its entry"


@pytest.mark.parametrize("query", ["CUDA out of memory", "out of memory"])
def test_a_short_message_lands_first_on_its_entry(query, server, browser):
    """A phrase of three words or more that an entry's heading holds word for word lists that
    entry first: the general out-of-memory entry, before the other three (issue 30: it was
    8th of 11, and no result linked the entry)."""
    page = browser.new_page()
    errors = page_errors(page)
    try:
        links = search(page, server, query)
        assert links and links[0] == f"{server}/{TROUBLESHOOTING}.html#err-cuda-oom", links[:4]
        first = page.inner_text("#search-results li")
        assert "Fix:" in first and "expandable_segments" in first, first
        assert not errors, f"the search page raised: {errors}"
    finally:
        page.close()


# Every entry of the right-hand contents column, each group opened as the theme opens the one
# being read; the column's right edge, and each entry's overflow, after that.
CLIPPED_CONTENTS = """() => {
  const side = document.querySelector('.bd-sidebar-secondary');
  const links = [...side.querySelectorAll('nav.page-toc a')];
  for (const a of links)
    for (let e = a.parentElement; e && e !== side; e = e.parentElement)
      if (e.tagName === 'UL') e.style.display = 'block';
  const right = side.getBoundingClientRect().right;
  return [links.length, links.filter((a) => a.scrollWidth > a.clientWidth + 1 ||
      a.getBoundingClientRect().right > right + 0.5 ||
      getComputedStyle(a).textOverflow === 'ellipsis').map((a) => a.innerText.slice(0, 60))];
}"""


@pytest.mark.parametrize("width", [1280, 1440])
def test_no_contents_entry_is_clipped(width, server, browser):
    """The troubleshooting page's contents column (95 titles, some quoting whole messages)
    wraps every title inside the column (_static/book.css); 39 were cut at the window's edge."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(f"{server}/{TROUBLESHOOTING}.html#err-cuda-oom", wait_until="load")
        count, clipped = page.evaluate(CLIPPED_CONTENTS)
        assert count >= len(read_entries()), f"the column lists {count} titles"
        assert not clipped, f"{len(clipped)} of {count} contents entries are clipped: {clipped[:5]}"
        screenshot(page, f"contents-{width}.png")
    finally:
        page.close()
