"""tools/troubleshooting_rank.py: the troubleshooting page's 'Seen in' lines and order follow
the committed searches, and bad evidence is refused with its row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import troubleshooting_rank as rank

PAGE = """# Troubleshooting index

- {ref}`Group A <grp-a>`: {ref}`one <err-one>` · {ref}`two <err-two>`
- {ref}`Group B <grp-b>`: {ref}`three <err-three>`

(grp-a)=
## Group A

Intro of group A.

(err-one)=
### One went wrong

```text
RuntimeError: one went wrong on cuda:0
```

**Fix:** do one.

<small>Checked with torch 2.14.1: reproduced live</small>

(err-two)=
### Two went wrong

```text
RuntimeError: two went wrong at step 3
```

**Fix:** do two.

<small>Checked with torch 2.14.1: reproduced live</small>

(grp-b)=
## Group B

(err-three)=
### Three

```text
ValueError: three is bad
```

<small>Quoted for macOS: found only in macOS builds</small>
"""
HEADER = "# a comment line\nlabel\tquery\tkey\tresults\tmatches\n"
A, B, C = (f"https://github.com/o/r/issues/{n}" for n in (1, 2, 3))


def evidence(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "evidence.tsv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


GOOD = [f"err-one\tone went wrong on\tone went wrong\t12\t{A}",
        f"err-two\ttwo went wrong at step\ttwo went wrong\t9\t{B} {C} {A}",
        "err-three\tthree is bad\tthree is bad\t4\t"]


def test_apply_writes_each_line_and_puts_the_most_reported_first(tmp_path: Path) -> None:
    found = rank.read_evidence(evidence(tmp_path, GOOD))
    page = rank.apply(PAGE, found)
    assert page.index("(err-two)=") < page.index("(err-one)=") < page.index("(grp-b)=")
    assert "Intro of group A.\n\n(err-two)=" in page
    assert "<small>Seen in: [o/r#2](https://github.com/o/r/issues/2) and 2 similar reports</small>" \
           "\n\n<small>Checked with" in page
    assert "[o/r#1](https://github.com/o/r/issues/1), the only report quoting it among the 12 " \
           "results</small>" in page
    assert "no report quoting it among the 4 results of a search for its message</small>\n\n" \
           "<small>Quoted for macOS" in page
    assert "{ref}`two <err-two>` · {ref}`one <err-one>`" in page  # the contents follow
    assert rank.problems(page, found) == []
    assert rank.apply(page, found) == page  # applying twice changes nothing
    assert "\n\n\n" not in page and page.endswith("</small>\n")


def test_check_finds_each_disagreement(tmp_path: Path) -> None:
    found = rank.read_evidence(evidence(tmp_path, GOOD))
    page = rank.apply(PAGE, found)
    wrong_count = page.replace("and 2 similar reports", "and 5 similar reports")
    assert any("err-two: the page says" in p for p in rank.problems(wrong_count, found))
    sections = rank.split_page(page)
    two, one = (i for i, sec in enumerate(sections) if sec.label in ("err-two", "err-one"))
    sections[two], sections[one] = sections[one], sections[two]
    swapped = "".join(sec.text for sec in sections)
    assert rank.problems(swapped, found) == [
        "the entries are not in the order of their evidence: run `apply`"]
    no_row = {k: v for k, v in found.items() if k != "err-three"}
    assert "err-three: no evidence row" in rank.problems(page, no_row)
    other_key = {**found, "err-three": rank.Evidence("err-three", "three is good", "three is good", 4, ())}
    assert any("not in the message it quotes" in p for p in rank.problems(page, other_key))
    extra = {**found, "err-four": rank.Evidence("err-four", "x y", "x y", 1, (A,))}
    assert "err-four: a row for an entry the page lacks" in rank.problems(page, extra)


@pytest.mark.parametrize("row, words", [
    (f"err-one\tone went wrong on\tsomething else\t12\t{A}", "key must be a part of the query"),
    (f"err-one\tone went wrong on\tone went\t13\t{A}", "results must be 0-12"),
    (f"err-one\tone went wrong on\tone went\t1\t{A} {B}", "results must be 0-12"),
    ("err-one\tone went wrong on\tone went\t3\thttps://example.com/x", "GitHub issue or PR"),
    (f"err-one\tone went wrong on\tone went\t3\t{A} {A}", "distinct"),
    ("err-one\tone went wrong on\tone went\t3", "tab-separated columns"),
    ("err-one\tone went wrong on\t \t3\t", "key must be a part"),
])
def test_bad_evidence_is_refused_with_its_row(tmp_path: Path, row: str, words: str) -> None:
    with pytest.raises(SystemExit) as info:
        rank.read_evidence(evidence(tmp_path, [row]))
    assert words in str(info.value) and "line 3 (err-one)" in str(info.value)


def test_a_second_row_or_a_wrong_header_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="a second row"):
        rank.read_evidence(evidence(tmp_path, GOOD + GOOD[:1]))
    path = tmp_path / "bad.tsv"
    path.write_text("label\tquery\n")
    with pytest.raises(SystemExit, match="the header must be"):
        rank.read_evidence(path)
    with pytest.raises(SystemExit, match="is missing"):
        rank.read_evidence(tmp_path / "absent.tsv")


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    path = evidence(tmp_path, GOOD[:2])
    args = ["--page", str(page), "--evidence", str(path)]
    assert rank.main(["queries", *args]) == 0
    assert capsys.readouterr().out == "err-three\tValueError: three is bad\n"  # still to search
    with pytest.raises(SystemExit, match=r"no evidence for \['err-three'\]"):
        rank.main(["apply", *args])
    assert page.read_text() == PAGE  # nothing half-written
    path = evidence(tmp_path, GOOD)
    assert rank.main(["check", *args]) == 1
    assert rank.main(["apply", *args]) == 0 and rank.main(["check", *args]) == 0


def test_the_committed_page_agrees_with_the_committed_evidence() -> None:
    assert rank.problems(rank.PAGE.read_text(), rank.read_evidence()) == []


def test_the_last_entry_moves_and_ties_keep_the_pages_order(tmp_path: Path) -> None:
    page = PAGE.replace("(grp-b)=\n## Group B\n\n", "")  # three entries in one group
    rows = [f"err-one\tone went wrong on\tone went wrong\t5\t{A}",
            f"err-two\ttwo went wrong at step\ttwo went wrong\t5\t{B}",
            f"err-three\tthree is bad\tthree is bad\t5\t{A} {B} {C}"]
    found = rank.read_evidence(evidence(tmp_path, rows))
    ordered = rank.apply(page, found)
    assert [s.label for s in rank.split_page(ordered) if s.label] == [
        "err-three", "err-one", "err-two"]
    assert "<small>Quoted for macOS: found only in macOS builds</small>\n\n(err-one)=" in ordered
    assert ordered.endswith("<small>Checked with torch 2.14.1: reproduced live</small>\n")


def test_a_dropdown_of_older_wordings_does_not_take_the_line(tmp_path: Path) -> None:
    older = ("**Fix:** do one.\n\n:::{dropdown} torch 2.9.1 prints it differently\n```text\n"
             "RuntimeError: one went wrong\n```\n<small>Checked with torch 2.9.1: live</small>\n"
             ":::\n")
    page = PAGE.replace("**Fix:** do one.\n", older)
    found = rank.read_evidence(evidence(tmp_path, GOOD))
    ordered = rank.apply(page, found)
    assert rank.problems(ordered, found) == []
    one = next(s.text for s in rank.split_page(ordered) if s.label == "err-one")
    assert one.index(":::\n") < one.index("Seen in") < one.index("<small>Checked with torch 2.14.1")
    misplaced = ordered.replace(found["err-one"].line() + "\n\n", "").replace(
        "<small>Checked with torch 2.9.1", found["err-one"].line() + "\n\n<small>Checked with torch 2.9.1")
    assert "err-one: its 'Seen in' line is not just before its own 'Checked with' line" in \
        rank.problems(misplaced, found)


def test_the_contents_list_is_checked_on_its_own(tmp_path: Path) -> None:
    found = rank.read_evidence(evidence(tmp_path, GOOD))
    page = rank.apply(PAGE, found)
    out_of_order = page.replace("{ref}`two <err-two>` · {ref}`one <err-one>`",
                                "{ref}`one <err-one>` · {ref}`two <err-two>`")
    assert rank.problems(out_of_order, found) == [
        "the contents list is not in the entries' order: run `apply`"]
    dangling = page.replace("{ref}`three <err-three>`", "{ref}`three <err-thre>`")
    assert rank.problems(dangling, found) == ["err-thre: the contents list links no such entry",
                                              "err-three: the contents list does not link it"]


def test_a_seen_line_without_its_blank_line_is_replaced_not_doubled(tmp_path: Path) -> None:
    found = rank.read_evidence(evidence(tmp_path, GOOD))
    page = rank.apply(PAGE, found)
    squeezed = page.replace(found["err-two"].line() + "\n\n", found["err-two"].line() + "\n")
    assert rank.apply(squeezed, found) == page
