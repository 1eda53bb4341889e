"""Dropdown titles a reader can read (issue 30, item 9: chapter 2 once showed "Going deeper:
when pinning pays off, mps, and the hazards seen happen").

No rule can tell a garbled phrase from a terse one, so the guard is a reviewed list: every
dropdown title of the book is in ``tests/fixtures/dropdown-titles.tsv``, which a reviewer
extends after reading the new or edited title aloud. A title edited anywhere fails here until
it is read and listed, and a listed title the book no longer has fails too (the list is the
book's titles, no more). Mechanical rules catch the usual slips of an edit on top of that
(a doubled word, a title cut after a function word, unbalanced code marks or brackets, one
too long for a line), and the built pages are read in Chromium: each title shows as written,
unclipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import toc_files

LISTED = ROOT / "tests" / "fixtures" / "dropdown-titles.tsv"
DROPDOWN = re.compile(r"^(?:`{3,}|:{3,})\{dropdown\}[ \t]*(.*)$", re.M)
#: A title does not end on one of these: an edit that cut it short.
DANGLING = {"a", "an", "the", "and", "or", "of", "to", "in", "on", "for", "with", "by", "at",
            "from", "as", "is", "are", "its", "their", "what", "why", "how", "when", "where"}
LONGEST = 90  # characters: one line of the content column at 1280 px


def book_titles() -> set[tuple[str, str]]:
    """(chapter file, title) of every dropdown in the book's sources."""
    found: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "chapters").glob("*.md")):
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text())["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        else:
            text = path.read_text()
        found |= {(str(path.relative_to(ROOT)), m[1].strip()) for m in DROPDOWN.finditer(text)}
    return found


def listed_titles(path: Path = LISTED) -> set[tuple[str, str]]:
    rows = [line.split("\t") for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    bad = [row for row in rows if len(row) != 2]
    assert not bad, f"{path.name}: lines not of the form <file><TAB><title>: {bad}"
    return {(file, title) for file, title in rows}


def slips(title: str) -> list[str]:
    """What is mechanically wrong with a title (empty when nothing is)."""
    problems = []
    words = re.findall(r"[\w.'()-]+", title.lower())
    doubled = [a for a, b in zip(words, words[1:], strict=False) if a == b]
    if doubled:
        problems.append(f"doubled word {doubled}")
    if not words or words[-1] in DANGLING or title.rstrip()[-1:] in ",:;-":
        problems.append("ends as if cut short")
    if title.count("`") % 2 or title.count("(") != title.count(")"):
        problems.append("unbalanced code marks or brackets")
    if "{" in title or "**" in title:
        problems.append("markup a dropdown title does not render")
    if len(title) > LONGEST:
        problems.append(f"{len(title)} characters (at most {LONGEST})")
    if title != title.strip() or "  " in title:
        problems.append("stray spaces")
    return problems


def test_every_dropdown_title_was_read_by_a_reviewer() -> None:
    book, listed = book_titles(), listed_titles()
    new = sorted(book - listed)
    assert not new, ("dropdown titles nobody has read yet (new or edited): "
                     + "; ".join(f"{f}: {t!r}" for f, t in new)
                     + f". Read each aloud as a reader would (does it name what the dropdown holds, "
                     f"in plain words?), then add it to {LISTED.relative_to(ROOT)}.")
    gone = sorted(listed - book)
    assert not gone, (f"{LISTED.relative_to(ROOT)} lists titles the book no longer has: {gone}; "
                      "remove them")


def test_no_dropdown_title_shows_the_slips_of_an_edit() -> None:
    found = {f"{file}: {title!r}": slips(title) for file, title in sorted(book_titles())}
    bad = {k: v for k, v in found.items() if v}
    assert not bad, bad


@pytest.mark.parametrize("title, problem", [
    ("Going deeper: the the two hazards", "doubled word"),
    ("Going deeper: when pinning pays off, and the", "cut short"),
    ("Going deeper: what `pin_memory does", "unbalanced"),
    ("Going deeper: {doc}`chapter 2 <02_moving_tensors>`", "markup"),
    ("Going deeper: " + "very " * 20 + "long", "characters"),
    ("Going deeper:  two spaces", "stray spaces"),
    ("Going deeper: pinning, mps,", "cut short"),
    ("Going deeper: pinning -", "cut short"),
    ("Going deeper: **pinning**", "markup"),
    ("Going deeper: pinning (and mps", "unbalanced"),
    ("", "cut short"),
])
def test_the_rules_catch_each_slip(title: str, problem: str) -> None:
    assert any(problem in found for found in slips(title)), slips(title)
    assert not slips("Going deeper: when pinning pays off, mps, and two GPUs")


@pytest.mark.book
def test_each_built_title_shows_as_written_and_unclipped(built_book, built_page) -> None:
    listed: dict[str, set[str]] = {}  # page -> the titles its source has, as they render
    for file, title in listed_titles():
        listed.setdefault(file.rsplit(".", 1)[0], set()).add(title.replace("`", ""))
    problems, pages = [], 0
    for file in toc_files():
        if not (built_book / f"{file}.html").exists():
            continue  # BOOK_HTML: a small test book
        pages += 1
        # Read with every folded part (chapter 9's groups) open, so each title is laid out.
        page = built_page(file)
        assert page["ok"], f"{file}.html did not load"
        shown = page["dropdowns"]
        texts = {text for text, _, _ in shown}
        if texts != listed.get(file, set()):
            problems.append(f"{file}: shows {sorted(texts - listed.get(file, set()))} that no "
                            f"reviewed title reads as, lacks {sorted(listed.get(file, set()) - texts)}")
        problems += [f"{file}: {text!r} is clipped" for text, clipped, _ in shown if clipped]
        problems += [f"{file}: {text!r} is not laid out" for text, _, width in shown if not width]
    if not pages or not (built_book / "chapters/02_moving_tensors.html").exists():
        pytest.skip("a small test book without the chapters")
    assert not problems, problems
