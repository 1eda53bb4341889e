"""Every figure on the built pages says what it shows (issue 30, item 9).

MyST-NB gives a notebook's PNG output an ``<img>`` whose alt text, with none set, is the
image's file path (a SHA-256 hash): a screen reader reads the hash. helpers.plotting puts the
figure's own description in the output's metadata and _ext/figure_alt.py copies it onto the
page (tests/library/test_plotting_alt.py tests both); this test reads the built pages in
Chromium. ``BOOK_HTML=<folder>`` points it at a small test book.
"""

from __future__ import annotations

import re

import pytest

from tests.support import toc_files

pytestmark = pytest.mark.book

#: Pages that fail today, in chapters other sessions own: {page: why}. Strict: remove an
#: entry once its chapter is fixed.
KNOWN_FAILURES: dict[str, str] = {}
_PATH_LIKE = re.compile(r"(\.(png|jpe?g|svg|gif)\b)|(/_images/)|\b[0-9a-f]{32,}\b")


def bad_alt(alt: str | None) -> str | None:
    """Why ``alt`` does not say what a figure shows, or None when it does."""
    if not alt or not alt.strip():
        return "no alt text"
    if _PATH_LIKE.search(alt):
        return f"a file path, not a description: {alt!r}"
    if len(alt.split()) < 3:
        return f"too short to say what the figure shows: {alt!r}"
    return None


def test_bad_alt_texts_are_recognised() -> None:
    assert bad_alt("../_images/3f2a9c0e1d4b5a6978812233445566778899aabbccddeeff0011223344556677.png")
    assert bad_alt("") and bad_alt("plot")
    assert bad_alt("MNIST CNN on cpu: bars of seconds per epoch: Accelerate 0.650.") is None


def _params() -> list:
    return [pytest.param(file, id=file.rsplit("/", 1)[-1], marks=[
        pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[file])] if file in KNOWN_FAILURES
        else []) for file in toc_files()]


@pytest.mark.parametrize("file", _params())
def test_every_figure_says_what_it_shows(file, built_book, built_page) -> None:
    if not (built_book / f"{file}.html").exists():
        pytest.skip(f"{file} is not in this build (BOOK_HTML: a small test book)")
    shown = built_page(file)  # every img of .cell_output in the article: its alt
    assert shown["ok"], f"{file}.html did not load"
    alts = shown["alts"]
    problems = [why for why in map(bad_alt, alts) if why]
    assert not problems, f"{file}: {len(problems)} of {len(alts)} figures: {problems}"
