"""Findability (issue 29, step 4): a message drawn from tools/torch_messages.py's output, filled
in as a reader pastes it (another run's numbers and devices, the traceback's last line, often
with the lines above it), typed into the book's search box in Chromium, lands first on the
troubleshooting entry that quotes it.

The messages are drawn by a rule, not chosen: for each entry that messages of the committed
output (torch 2.14.1) are quoted by, in the order of the page, the first such message that no
other entry quotes. The pasted text is the entry's quoted block that holds the message, its
varying parts (what the message's ``{}`` stand for; for a library string, whatever surrounds
it) given other values: each digit moved on by 3, so ``cuda:0`` becomes ``cuda:3`` and
``20.00 MiB`` becomes ``53.33 MiB``. Every other one is pasted with the traceback above it,
from a script at /home/user/train.py.

With a small book (only the troubleshooting page): ``BOOK_HTML=<its _build/html>``."""

from __future__ import annotations

import re

import pytest

from tests.book.test_browser import TROUBLESHOOTING, page_errors
from tests.conftest import ROOT
from tests.support import read_entries
from tools import torch_messages as tm

pytestmark = pytest.mark.book

OUTPUT = ROOT / "tests" / "fixtures" / "torch-messages.tsv"
TRACEBACK = ('Traceback (most recent call last):\n  File "/home/user/train.py", line 42, in '
             '<module>\n    loss = model(x.to(device)).sum()\n')
AT_LEAST = 20


def drawn() -> list[tuple[str, str]]:
    """(label, message) for each entry quoted alone by a message of the output, in the page's
    order: the first such message of the output."""
    _, found = tm.parse(OUTPUT.read_text())
    first: dict[str, str] = {}
    for message in found:
        labels = message.entries.split(",")
        if len(labels) == 1 and labels[0] != "-":
            first.setdefault(labels[0], message.text)
    return [(label, first[label]) for label in read_entries() if label in first]


def other_run(text: str) -> str:
    return re.sub(r"\d", lambda d: str((int(d[0]) + 3) % 10), text)


def pasted(label: str, message: str, index: int) -> str:
    """The entry's block that holds the message, its varying parts from another run."""
    entry = read_entries()[label]
    parts = [re.escape(p) for p in message.split(tm.PLACEHOLDER)]
    pattern = re.compile("(.*?)".join(parts), re.S)
    for block in entry.blocks + [b for blocks in entry.older.values() for b in blocks]:
        found = pattern.search(block)
        if not found:
            continue
        if found.re.groups:  # what the {} stand for
            spans = [found.span(i) for i in range(1, found.re.groups + 1)]
        else:  # a library string: what surrounds it
            spans = [(0, found.start()), (found.end(), len(block))]
        out, at = "", 0
        for start, end in spans:
            out += block[at:start] + other_run(block[start:end])
            at = end
        text = out + block[at:]
        return TRACEBACK + text if index % 2 else text
    raise AssertionError(f"[{label}] quotes no block that holds {message!r}")


CASES = drawn()


def test_enough_messages_are_drawn():
    assert len(CASES) >= AT_LEAST, f"only {len(CASES)} entries quote a message of {OUTPUT.name}"


@pytest.fixture(scope="module")
def search_page(server, browser):
    """One search page for every message (each search is one navigation, as a reader's
    second search from the results page is), and the script errors it raises."""
    page = browser.new_page()
    errors = page_errors(page)
    page.goto(f"{server}/search.html", wait_until="load")
    yield page, errors
    page.close()


def search_box(page, text: str) -> list[str]:
    """Type ``text`` into the search page's box, submit it; the result links, best first."""
    box = page.locator("#search-results").locator("xpath=..").locator("input[name='q']")
    if not box.count():
        box = page.locator("form[action$='search.html'] input[name='q']:visible")
    box.first.fill(text)
    with page.expect_navigation(wait_until="load"):
        box.first.press("Enter")
    page.wait_for_selector("#search-results .search-summary", timeout=60_000)
    return page.eval_on_selector_all("#search-results li > a", "els => els.map(e => e.href)")


@pytest.mark.parametrize(("index", "label", "message"),
                         [(i, label, message) for i, (label, message) in enumerate(CASES)],
                         ids=[label for label, _ in CASES])
def test_a_pasted_message_from_the_tool_lands_on_its_entry(index, label, message, server,
                                                            search_page):
    text = pasted(label, message, index)
    page, errors = search_page
    errors.clear()
    links = search_box(page, text)
    assert links, f"searching {text!r} found nothing"
    assert links[0] == f"{server}/{TROUBLESHOOTING}.html#{label}", \
        f"searching {text!r} lists first {links[0]} (then {links[1:3]})"
    assert not errors, f"the search page raised: {errors}"
