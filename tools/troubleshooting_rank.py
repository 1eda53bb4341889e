"""Rank the troubleshooting entries by public reports of their messages (issue 29, step 2).

The evidence lives in ``tools/troubleshooting-evidence.tsv``, one row per entry of
``chapters/09_troubleshooting.md``: the ``query`` searched for among public GitHub issue
threads (the entry's message without its exception class, cut before the first part that
varies from run to run), the ``key`` a report must quote to count (a fixed stretch of the
query), how many ``results`` the search returned (at most 12), and the addresses of the
``matches``: the results whose title or excerpt contains the key, compared case-insensitively
with runs of whitespace collapsed, in the search's order. Nothing is judged by eye, so anyone
can run the same queries again and compare.

    python tools/troubleshooting_rank.py queries   # entries without a row, and their messages
    python tools/troubleshooting_rank.py apply     # write each entry's "Seen in" line, order groups
    python tools/troubleshooting_rank.py check     # the page agrees with the evidence (exit 1 if not)

``apply`` gives each entry the line ``Seen in: <first match> and N similar reports`` (N, the
other matches) or, without a match, says that no report among the results quoted it; within
each group of the page the entries then go most matches first (ties keep the page's order).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "09_troubleshooting.md"
EVIDENCE = ROOT / "tools" / "troubleshooting-evidence.tsv"
COLUMNS = ["label", "query", "key", "results", "matches"]
LABEL = re.compile(r"^\((err-[\w-]+)\)=$", re.M)
SEEN_LINE = re.compile(r"^<small>Seen in: .*</small>\n+", re.M)
REPORT = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+)/(?:issues|pull)/(\d+)$")


@dataclass(frozen=True)
class Evidence:
    label: str
    query: str
    key: str
    results: int
    matches: tuple[str, ...]

    @property
    def rank(self) -> int:
        """How many results quoted the message (the page's order within a group)."""
        return len(self.matches)

    def line(self) -> str:
        """The entry's "Seen in" line."""
        if not self.matches:
            return (f"<small>Seen in: no report quoting it among the {self.results} results of a "
                    "search for its message</small>")
        owner, repo, number = REPORT.match(self.matches[0]).groups()
        link = f"[{owner}/{repo}#{number}]({self.matches[0]})"
        others = len(self.matches) - 1
        if not others:
            return (f"<small>Seen in: {link}, the only report quoting it among the "
                    f"{self.results} results</small>")
        noun = "report" if others == 1 else "reports"
        return f"<small>Seen in: {link} and {others} similar {noun}</small>"


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def read_evidence(path: Path = EVIDENCE) -> dict[str, Evidence]:
    """The evidence rows by label; a malformed row is refused with its line number."""
    if not path.is_file():
        raise SystemExit(f"{path} is missing: it holds the searches behind the page's ranking")
    numbered = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1)
                if not line.startswith("#")]
    reader = csv.DictReader([line for _, line in numbered], delimiter="\t",
                            quoting=csv.QUOTE_NONE)
    if reader.fieldnames != COLUMNS:
        raise SystemExit(f"{path.name}: the header must be {COLUMNS}, not {reader.fieldnames}")
    found: dict[str, Evidence] = {}
    for (number, _), row in zip(numbered[1:], reader, strict=True):
        where = f"{path.name}, line {number} ({row.get('label')})"
        if None in row.values() or None in row:
            raise SystemExit(f"{where}: needs exactly the {len(COLUMNS)} tab-separated columns "
                             f"{COLUMNS} (an empty last column still needs its tab)")
        matches = tuple(row["matches"].split())
        if not row["results"].isdigit() or not 0 <= len(matches) <= int(row["results"]) <= 12:
            raise SystemExit(f"{where}: results must be 0-12 and at least the matches")
        if not row["key"].strip() or normalise(row["key"]) not in normalise(row["query"]):
            raise SystemExit(f"{where}: the key must be a part of the query")
        bad = [url for url in matches if not REPORT.match(url)]
        if bad or len(set(matches)) != len(matches):
            raise SystemExit(f"{where}: matches must be distinct GitHub issue or PR addresses: {bad}")
        if row["label"] in found:
            raise SystemExit(f"{where}: a second row for this entry")
        found[row["label"]] = Evidence(row["label"], row["query"], row["key"],
                                       int(row["results"]), matches)
    return found


def _last_checked(entry_text: str) -> re.Match | None:
    """The entry's own "Checked with" (or "Quoted for") line: its last one, after any
    dropdown of older wordings, which may hold such lines of its own."""
    found = list(re.finditer(r"^<small>(?:Checked with|Quoted for)", entry_text, re.M))
    return found[-1] if found else None


@dataclass
class Section:
    label: str | None  # None: a group's heading and what comes before its first entry
    text: str


def split_page(text: str) -> list[Section]:
    """The page cut into its entries (from the ``(err-...)=`` label to the next label or
    group) and the text between them."""
    bounds = sorted({m.start() for m in LABEL.finditer(text)}
                    | {m.start() for m in re.finditer(r"^\(grp-[\w-]+\)=$", text, re.M)})
    sections = [Section(None, text[:bounds[0]])] if bounds else [Section(None, text)]
    for start, end in zip(bounds, bounds[1:] + [len(text)], strict=True):
        found = LABEL.match(text, start)
        sections.append(Section(found.group(1) if found else None, text[start:end]))
    return sections


def quoted(entry_text: str) -> str:
    """Everything an entry quotes in its ``text`` blocks, normalised."""
    return normalise(" ".join(re.findall(r"```text\n(.*?)```", entry_text, re.S)))


def apply(text: str, evidence: dict[str, Evidence]) -> str:
    """The page with each entry's "Seen in" line written and each group ordered by it."""
    sections = split_page(text)
    missing = [s.label for s in sections if s.label and s.label not in evidence]
    if missing:
        raise SystemExit(f"no evidence for {missing}: run `queries`, search, add their rows")
    out: list[Section] = []
    run: list[Section] = []

    def flush() -> None:
        out.extend(sorted(run, key=lambda s: -evidence[s.label].rank))
        run.clear()

    for section in sections:
        if section.label is None:
            flush()
            out.append(section)
            continue
        body = SEEN_LINE.sub("", section.text)
        at = _last_checked(body)
        if at is None:
            raise SystemExit(f"[{section.label}] has no 'Checked with' line to put its evidence before")
        body = body[:at.start()] + evidence[section.label].line() + "\n\n" + body[at.start():]
        if not body.endswith("\n\n"):  # an entry moved from the end of its group keeps its gap
            body = body.rstrip("\n") + "\n\n"
        run.append(Section(section.label, body))
    flush()
    joined = "".join(s.text for s in out)
    joined = joined if text.endswith("\n\n") else joined.rstrip("\n") + "\n"
    return contents_in_order(joined)


CONTENTS_LINK = re.compile(r"\{ref\}`[^`]*<(err-[\w-]+)>`")


def contents_in_order(text: str) -> str:
    """The page's contents list (one line per group, its entries' links joined by " · ") in
    the order the entries now stand."""
    where = {m.group(1): m.start() for m in LABEL.finditer(text)}

    def reorder(line: re.Match) -> str:
        head, links = line.group(1), line.group(2).split(" · ")
        labels = [CONTENTS_LINK.search(link) for link in links]
        if not all(labels) or any(label.group(1) not in where for label in labels):
            return line.group(0)
        ordered = sorted(zip(labels, links, strict=True), key=lambda pair: where[pair[0].group(1)])
        return head + " · ".join(link for _, link in ordered)

    return re.sub(r"^(- \{ref\}`[^`]*<grp-[\w-]+>`: )(.*)$", reorder, text, flags=re.M)


def problems(text: str, evidence: dict[str, Evidence]) -> list[str]:
    """Where the page and the evidence disagree (empty when they agree)."""
    found = []
    labels = [s.label for s in split_page(text) if s.label]
    found += [f"{label}: no evidence row" for label in labels if label not in evidence]
    found += [f"{label}: a row for an entry the page lacks" for label in evidence
              if label not in labels]
    for section in split_page(text):
        row = evidence.get(section.label or "")
        if row is None:
            continue
        if normalise(row.key) not in quoted(section.text):
            found.append(f"{row.label}: its key {row.key!r} is not in the message it quotes")
        lines = re.findall(r"^<small>Seen in: .*</small>$", section.text, re.M)
        if lines != [row.line()]:
            found.append(f"{row.label}: the page says {lines}, the evidence {row.line()!r}")
        elif not re.search(rf"^{re.escape(row.line())}\n\n<small>(?:Checked with|Quoted for)"
                           r"(?![\s\S]*^<small>(?:Checked with|Quoted for))",
                           section.text, re.M):
            found.append(f"{row.label}: its 'Seen in' line is not just before its own "
                         "'Checked with' line")
    linked = CONTENTS_LINK.findall("\n".join(re.findall(r"^- \{ref\}`[^`]*<grp-.*$", text, re.M)))
    found += [f"{label}: the contents list links no such entry" for label in linked
              if label not in labels]
    found += [f"{label}: the contents list does not link it" for label in labels
              if label not in linked]
    if not found:
        ordered = apply(text, evidence)
        if [s.label for s in split_page(ordered) if s.label] != labels:
            found.append("the entries are not in the order of their evidence: run `apply`")
        elif ordered != text:
            found.append("the contents list is not in the entries' order: run `apply`")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["queries", "apply", "check"])
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--evidence", type=Path, default=EVIDENCE)
    args = parser.parse_args(argv)
    text = args.page.read_text()
    evidence = read_evidence(args.evidence) if args.evidence.exists() or args.command != "queries" else {}
    if args.command == "queries":
        for section in split_page(text):
            if section.label and section.label not in evidence:
                message = re.search(r"```text\n(.*?)\n", section.text)
                print(f"{section.label}\t{message.group(1) if message else ''}")
        return 0
    if args.command == "apply":
        new = apply(text, evidence)
        args.page.write_text(new)
        print(f"{args.page.name}: {sum(1 for s in split_page(new) if s.label)} entries ranked")
        return 0
    found = problems(text, evidence)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
