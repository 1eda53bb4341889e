"""The troubleshooting index folds its groups (_static/troubleshooting-fold.js), in Chromium.

Folded, the page fits 30 screens at 1280x900; an address that names an entry (as the book's
search results and the contents list do) opens that entry's group and shows it; the page's
search still lands on entries. Run against the built book (`make book`) or a small book that
holds only this page: ``BOOK_HTML=<its _build/html>``.
"""

from __future__ import annotations

from urllib.parse import quote_plus

import pytest

from tests.support import read_entries

pytestmark = pytest.mark.book

PAGE = "chapters/09_troubleshooting"
SCREEN = {"width": 1280, "height": 900}
MAX_SCREENS = 30

STATE = """() => {
    const groups = [...document.querySelectorAll("section > span[id^='grp-']")]
        .map((label) => label.parentElement);
    const shown = (el) => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
    return {
        height: document.documentElement.scrollHeight,
        groups: groups.length,
        open: groups.filter((g) => g.classList.contains("ts-open")).map((g) =>
            g.querySelector(":scope > span").id),
        toggles: document.querySelectorAll("h2 > button.ts-fold-toggle").length,
        until_found: document.querySelectorAll("[hidden='until-found']").length,
        entries_shown: [...document.querySelectorAll("span[id^='err-']")]
            .filter((s) => shown(s.parentElement.querySelector(":scope > h3"))).map((s) => s.id),
    };
}"""

IN_VIEW = """(label) => {
    const heading = document.getElementById(label).parentElement.querySelector(":scope > h3");
    const box = heading.getBoundingClientRect();
    return heading.checkVisibility() && box.height > 0 && box.top >= -1
        && box.top < window.innerHeight;
}"""


def open_page(browser, url: str):
    page = browser.new_page(viewport=SCREEN)
    response = page.goto(url, wait_until="load")
    assert response is not None and response.ok, f"{url} did not load"
    page.wait_for_selector("h2 > button.ts-fold-toggle", state="attached")
    return page


def test_the_folded_page_fits_30_screens_and_each_group_opens(server, browser):
    page = open_page(browser, f"{server}/{PAGE}.html")
    try:
        state = page.evaluate(STATE)
        assert state["groups"] >= 10 and state["toggles"] == state["groups"], state
        assert state["open"] == [] and state["entries_shown"] == [], state
        assert state["until_found"] > 0, "folded parts should stay findable (hidden=until-found)"
        screens = state["height"] / SCREEN["height"]
        assert screens <= MAX_SCREENS, f"the folded page is {screens:.1f} screens long"
        # Each heading opens its group: with every group open the page shows every entry.
        page.eval_on_selector_all("h2 > button.ts-fold-toggle", "bs => bs.forEach(b => b.click())")
        opened = page.evaluate(STATE)
        assert len(opened["entries_shown"]) == len(read_entries()), opened["entries_shown"]
        assert opened["height"] > state["height"] + 10 * SCREEN["height"]
        page.locator("h2 > button.ts-fold-toggle").first.click()  # and closes it again
        assert len(page.evaluate(STATE)["open"]) == state["groups"] - 1
        page.eval_on_selector_all("h2 > button.ts-fold-toggle", "bs => bs.forEach(b => b.click())")
        assert page.evaluate(STATE)["open"] == ["grp-devices"]
        # The browser's find-in-page opens a folded group where it finds a match: the browser
        # fires `beforematch` on the hidden part (simulated here; headless find has no UI).
        page.evaluate("""() => document.getElementById('err-mps-float64').parentElement
            .dispatchEvent(new Event('beforematch'))""")
        assert sorted(page.evaluate(STATE)["open"]) == ["grp-devices", "grp-mps"]
    finally:
        page.close()


def test_an_address_naming_an_entry_opens_its_group(server, browser):
    page = open_page(browser, f"{server}/{PAGE}.html#err-cuda-oom")
    try:
        state = page.evaluate(STATE)
        assert state["open"] == ["grp-memory"], state["open"]
        assert "err-cuda-oom" in state["entries_shown"]
        assert page.evaluate(IN_VIEW, "err-cuda-oom"), "the entry is not on the screen"
        # A later change of the address (a link in the contents list) opens that group too.
        page.evaluate("location.hash = '#err-numpy-cuda'")
        page.wait_for_function(
            "() => document.getElementById('err-numpy-cuda').parentElement"
            ".querySelector(':scope > h3').checkVisibility()")
        assert page.evaluate(IN_VIEW, "err-numpy-cuda")
        assert sorted(page.evaluate(STATE)["open"]) == ["grp-memory", "grp-numpy"]
    finally:
        page.close()


def test_the_search_still_lands_on_a_folded_entry(server, browser):
    entries = read_entries()
    page = browser.new_page(viewport=SCREEN)
    try:
        for label in ("err-cuda-oom", "err-same-device", "err-no-cxx-compiler"):
            message = entries[label].blocks[0]
            page.goto(f"{server}/search.html?q={quote_plus(message)}", wait_until="load")
            page.wait_for_selector("#search-results .search-summary", timeout=60_000)
            links = page.eval_on_selector_all("#search-results li > a",
                                              "els => els.map(e => e.href)")
            assert links and links[0] == f"{server}/{PAGE}.html#{label}", (label, links[:3])
            page.goto(links[0], wait_until="load")
            page.wait_for_selector("h2 > button.ts-fold-toggle", state="attached")
            assert page.evaluate(IN_VIEW, label), f"{links[0]} does not show {label}"
    finally:
        page.close()
