/* Searching the book for a pasted error message lands on its troubleshooting entry (chapter 9).
 *
 * Sphinx's search ranks whole pages by single words, so a pasted message ranks every chapter
 * that uses those words, and it links pages rather than entries. On the search page, this
 * script reads the troubleshooting index's entries (the messages each one quotes, in its
 * text blocks) and, when the query is one of those messages, or a part of one, or holds one
 * (a pasted traceback), lists those entries first, linked to their anchors, with their fix as
 * the result's summary. Numbers (sizes, device numbers, process ids) and words the message
 * takes from the run (a class name, a GPU name) may differ from the quote. A short query of
 * three words or more ("CUDA out of memory") that an entry's heading holds word for word, in
 * order, lists those entries first: the earlier in the heading, the better, then in the page's
 * order (the general entry of a group comes first). Those entries also rank above entries
 * whose messages merely hold the query's words.
 *
 * Jupyter Book loads every _static/*.js file on every page; this one acts on the search page
 * only. It is loaded before Sphinx's searchtools.js, so its DOMContentLoaded handler runs
 * before Sphinx starts the search. It reads the troubleshooting page from the book itself
 * (no network beyond the book's own server). Wherever that fails (a page opened as a file://
 * URL, a book without the troubleshooting page, a query with no match, an error in this
 * script), Sphinx's own search runs unchanged.
 */
"use strict";

const ERROR_INDEX = "chapters/09_troubleshooting";
const MIN_WORDS = 4; // a few keywords: Sphinx's own search is the right one
const MIN_PHRASE = 3; // a phrase of this many words (stop words included) may match a heading

/** Whether Sphinx's language data counts a word as a stop word (a list or, newer, a Set). */
const isStopword = (word) => {
  if (typeof stopwords === "undefined") return false;
  return typeof stopwords.has === "function" ? stopwords.has(word) : stopwords.includes(word);
};

/** The words of a text, with numbers and sizes made alike, stop words included. */
const allWords = (text) =>
  text
    .toLowerCase()
    .replace(/\d+(\.\d+)?\s*(bytes|[kmgt]ib)\b/g, " size ")
    .replace(/\d+/g, " 0 ")
    .split(/[^\p{L}\p{N}_]+/u)
    .filter((word) => word);

/** The words of a message, with numbers and sizes made alike, stop words left out. */
const errorWords = (text) => allWords(text).filter((word) => !isStopword(word));

/** Where the word list `part` first occurs, whole and in order, in `words`; -1 if nowhere. */
const phraseAt = (words, part) => {
  for (let i = 0; i + part.length <= words.length; i++)
    if (part.every((word, j) => words[i + j] === word)) return i;
  return -1;
};

/** The length of the longest common subsequence of two word lists. */
const commonWords = (a, b) => {
  let previous = new Array(b.length + 1).fill(0);
  for (const word of a) {
    const row = [0];
    for (let j = 0; j < b.length; j++)
      row.push(word === b[j] ? previous[j] + 1 : Math.max(previous[j + 1], row[j]));
    previous = row;
  }
  return previous[b.length];
};

/** Each entry of the index: its anchor, the id of its section (Sphinx's own results link
 * that), its heading, its fix, and the word lists of its messages. Read once per page. */
let errorEntries = null;
const loadErrorEntries = () => {
  errorEntries ??= (async () => {
    const root = document.documentElement.dataset.content_root || "";
    const response = await fetch(root + ERROR_INDEX + DOCUMENTATION_OPTIONS.FILE_SUFFIX);
    if (!response.ok) return [];
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const entries = [];
    page.querySelectorAll("section").forEach((section) => {
      const label = section.querySelector(":scope > span[id^='err-']");
      const heading = section.querySelector(":scope > h3");
      if (!label || !heading) return;
      const messages = [...section.querySelectorAll("div.highlight-text pre")].map((pre) =>
        errorWords(pre.textContent)
      );
      const fix = [...section.querySelectorAll(":scope > p")].find((p) =>
        p.textContent.startsWith("Fix:")
      );
      const title = heading.textContent.replace(/[#\u00b6]$/, "").trim();
      entries.push({
        anchor: "#" + label.id,
        sectionAnchor: "#" + section.id,
        title,
        titleWords: allWords(title.replace(/^[\d.]+\s+/, "")), // without the section number
        fix: fix ? fix.textContent.trim() : "",
        messages,
      });
    });
    return entries;
  })();
  return errorEntries;
};

/** The entries whose heading holds the query as a phrase, or whose messages match the query,
 * best first. `phrase`: the query's words with stop words, `words`: without them. */
const matchErrorEntries = (entries, phrase, words) => {
  const found = [];
  for (const entry of entries) {
    const at = phrase.length >= MIN_PHRASE ? phraseAt(entry.titleWords, phrase) : -1;
    let best = null;
    for (const message of words.length >= MIN_WORDS ? entry.messages : []) {
      const common = commonWords(words, message);
      // The shorter of the two (a part of a message, or a message inside a pasted traceback)
      // must be nearly all in the other; then the closer in length, the better.
      const cover = common / Math.min(words.length, message.length);
      const score = [cover, common / Math.max(words.length, message.length)];
      if (common >= MIN_WORDS && cover >= 0.8 && (!best || score[0] > best[0] ||
          (score[0] === best[0] && score[1] > best[1])))
        best = score;
    }
    if (best || at >= 0) found.push({ entry, at, score: best || [0, 0] });
  }
  // A heading that holds the phrase first (the earlier, the better), then the closer message;
  // the sort is stable, so ties keep the page's order.
  const heading = ({ at }) => (at < 0 ? Infinity : at);
  found.sort((a, b) => heading(a) - heading(b) || b.score[0] - a.score[0] ||
    b.score[1] - a.score[1]);
  return found.slice(0, 3).map(({ entry }) => entry);
};

/** Text shown as HTML by Sphinx (a result's title and summary): the messages' own <...>
 * must stay text. */
const escapeHtml = (text) =>
  text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** Sphinx's results with the matched entries first (Sphinx shows the list from its end). */
const withErrorEntries = (results, matched) => {
  const file = Search._index.docnames.indexOf(ERROR_INDEX);
  if (file < 0 || !matched.length) return results;
  const page = Search._index.titles[file]; // already HTML in Sphinx's index
  const filename = Search._index.filenames[file];
  // Sphinx's own results for the same entries link their sections: shown once, as ours.
  const anchors = new Set(matched.flatMap((entry) => [entry.anchor, entry.sectionAnchor]));
  const kept = results.filter((r) => !(r[0] === ERROR_INDEX && anchors.has(r[2])));
  const kind = typeof SearchResultKind !== "undefined" ? SearchResultKind.title : undefined;
  // The summary is the entry's fix: a non-empty summary also keeps Sphinx from fetching one
  // for the label's anchor, an empty <span> whose text would be empty.
  const first = matched.map((entry) => [
    ERROR_INDEX,
    `${page} > ${escapeHtml(entry.title)}`,
    entry.anchor,
    escapeHtml(entry.fix || entry.title),
    1000,
    filename,
    kind,
  ]);
  return kept.concat(first.reverse());
};

document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || !document.getElementById("search-results")) return;
  const query = Search.query;
  const performSearch = Search._performSearch;
  let matched = [];
  Search.query = (text) => {
    const phrase = allWords(text);
    const words = errorWords(text);
    if (words.length < MIN_WORDS && phrase.length < MIN_PHRASE) return query(text);
    loadErrorEntries()
      .then((entries) => matchErrorEntries(entries, phrase, words))
      .catch(() => [])
      .then((found) => {
        matched = found;
        try {
          query(text);
        } finally {
          matched = [];
        }
      });
  };
  Search._performSearch = (...args) => {
    const results = performSearch(...args);
    try {
      return withErrorEntries(results, matched);
    } catch (error) {
      console.warn("error-search.js: Sphinx's results shown unchanged:", error);
      return results;
    }
  };
});
