"""The symptom index (chapters/symptoms.md): every symptom says how to confirm it and how to fix
it, and every link to a chapter's section names a heading that exists (MyST's heading anchors,
``myst_heading_anchors`` in _config.yml), in the sources and in the built book."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from myst_parser.mdit_to_docutils.base import default_slugify

from tests.conftest import ROOT
from tests.support import toc_files

SYMPTOMS = ROOT / "chapters" / "symptoms.md"
LINK = re.compile(r"\]\((?P<file>[\w.]+\.(?:ipynb|md))#(?P<anchor>[\w-]+)\)")
SYMPTOM_NAMES = ["gpu mostly idle", "tiny kernels", "synchronisation", "first epoch", "out of memory",
                 "grows every step", "hangs", "nan or inf under fp16"]


def headings(path: Path, deepest: int = 3) -> list[str]:
    """The page's headings of level 1 to `deepest`, as MyST reads their text."""
    if path.suffix == ".ipynb":
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "markdown")
    else:
        text = path.read_text()
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)  # not code's comments
    return [m[2] for m in re.finditer(rf"^(#{{1,{deepest}}}) (.+)$", text, re.M)]


def slug(heading: str) -> str:
    """MyST's anchor of a heading: its text (inline code without backticks), GitHub-style."""
    return default_slugify(heading.replace("`", "").strip())


def sections() -> dict[str, str]:
    text = SYMPTOMS.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_page_is_in_the_book_beside_the_error_index():
    files = toc_files()
    assert "chapters/symptoms" in files
    assert files.index("chapters/symptoms") == files.index("chapters/09_troubleshooting") + 1


@pytest.mark.parametrize("name", SYMPTOM_NAMES)
def test_each_symptom_says_how_to_confirm_and_fix_it(name):
    found = [(title, body) for title, body in sections().items() if name in title.lower()]
    assert len(found) == 1, f"one section for {name!r}; titles: {list(sections())}"
    title, body = found[0]
    confirm = re.search(r"\*\*Confirm:\*\*(.*?)\*\*Fix:\*\*", body, re.S)
    assert confirm, f"[{title}] no **Confirm:** followed by **Fix:**"
    assert re.search(r"`[^`]*\(", confirm[1]), f"[{title}] the confirmation names no call"
    assert LINK.search(confirm[1]), f"[{title}] the confirmation links no chapter section"


def links() -> list[tuple[str, str]]:
    return [(m["file"], m["anchor"]) for m in LINK.finditer(SYMPTOMS.read_text())]


def test_every_link_to_a_page_is_one_the_anchor_test_reads():
    """A link to a chapter (with or without a section) that LINK does not parse would escape
    the anchor test below: there is none."""
    text = SYMPTOMS.read_text()
    local = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [href for href in local if not href.startswith(("http:", "https:", "mailto:"))]
    assert len(local) >= len(SYMPTOM_NAMES), local
    unread = [href for href in local if not LINK.fullmatch(f"]({href})")]
    assert not unread, f"links the anchor test cannot read: {unread}"


@pytest.mark.parametrize("file, anchor", links(), ids=[f"{f}#{a}" for f, a in links()])
def test_a_link_names_an_existing_heading(file, anchor):
    target = ROOT / "chapters" / file
    assert target.exists(), f"{file} does not exist"
    slugs = [slug(h) for h in headings(target)]
    assert anchor in slugs, f"{file} has no heading with the anchor #{anchor}: {slugs}"


def test_the_oom_entry_links_chapter_13_sections_that_exist():
    entry = (ROOT / "chapters" / "09_troubleshooting.md").read_text()
    entry = entry[entry.index("(err-cuda-oom)="):entry.index("(err-cuda-oom-other-process)=")]
    found = [(m["file"], m["anchor"]) for m in LINK.finditer(entry)]
    assert {f for f, _ in found} == {"13_memory.ipynb"}, found
    slugs = [slug(h) for h in headings(ROOT / "chapters" / "13_memory.ipynb")]
    assert all(a in slugs for _, a in found), (found, slugs)
    for what in ("accumulation", "checkpointing", "mixed precision", "expandable_segments:True",
                 "torch.cuda.memory_summary", "_record_memory_history", "_dump_snapshot"):
        assert what in entry, f"the out-of-memory entry's fix does not mention {what}"


@pytest.mark.book
def test_links_land_on_a_section_of_the_built_book(built_book):
    """In the built page each such link points at an id its target page has."""
    html = (built_book / "chapters" / "symptoms.html").read_text()
    hrefs = re.findall(r'href="(\w+\.html)#([^"]+)"', html)
    assert len(hrefs) >= len(links()), hrefs
    for page, anchor in hrefs:
        target = (built_book / "chapters" / page).read_text()
        assert f'id="{anchor}"' in target, f"{page} has no id {anchor!r}"
