/* Searching the book for a pasted error message lands on its troubleshooting entry (chapter 9).
 *
 * Sphinx's search ranks whole pages by single words, so a pasted message ranks every chapter
 * that uses those words, and it links pages rather than entries. On the search page, this
 * script reads the troubleshooting index's entries (the messages each one quotes, in its
 * text blocks) and, when the query is one of those messages, or a part of one, or holds one
 * (a pasted traceback), lists those entries first, linked to their anchors. Numbers (sizes,
 * device numbers, process ids) and words the message takes from the run (a class name, a GPU
 * name) may differ from the quote. Jupyter Book loads every _static/*.js file on every page;
 * this one acts on the search page only, before Sphinx's searchtools.js starts the search.
 */
"use strict";

const ERROR_INDEX = "chapters/09_troubleshooting";

/** The words of a message, with numbers and sizes made alike. */
const errorWords = (text) =>
  text
    .toLowerCase()
    .replace(/\d+(\.\d+)?\s*(bytes|[kmgt]ib)\b/g, " size ")
    .replace(/\d+/g, " 0 ")
    .split(/[^\p{L}\p{N}_]+/u)
    .filter((word) => word && !(typeof stopwords !== "undefined" && stopwords.includes(word)));

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

/** Each entry of the index: its anchor, its heading, and the word lists of its messages. */
const loadErrorEntries = async () => {
  const root = document.documentElement.dataset.content_root || "";
  const response = await fetch(root + ERROR_INDEX + DOCUMENTATION_OPTIONS.FILE_SUFFIX);
  const page = new DOMParser().parseFromString(await response.text(), "text/html");
  const entries = [];
  page.querySelectorAll("section").forEach((section) => {
    const label = section.querySelector(":scope > span[id^='err-']");
    const heading = section.querySelector(":scope > h3");
    if (!label || !heading) return;
    const messages = [...section.querySelectorAll("div.highlight-text pre")].map((pre) =>
      errorWords(pre.textContent)
    );
    const title = heading.textContent.replace(/[#\u00b6]$/, "").trim();
    entries.push({ anchor: "#" + label.id, title, messages });
  });
  return entries;
};

/** The entries whose messages the query matches, best first. */
const matchErrorEntries = (entries, query) => {
  const words = errorWords(query);
  if (words.length < 4) return [];  // a few keywords: Sphinx's own search is the right one
  const found = [];
  for (const entry of entries) {
    let best = null;
    for (const message of entry.messages) {
      const common = commonWords(words, message);
      // The shorter of the two (a part of a message, or a message inside a pasted traceback)
      // must be nearly all in the other; then the closer in length, the better.
      const cover = common / Math.min(words.length, message.length);
      const score = [cover, common / Math.max(words.length, message.length)];
      if (common >= 4 && cover >= 0.8 && (!best || score[0] > best[0] ||
          (score[0] === best[0] && score[1] > best[1])))
        best = score;
    }
    if (best) found.push({ entry, score: best });
  }
  found.sort((a, b) => b.score[0] - a.score[0] || b.score[1] - a.score[1]);
  return found.slice(0, 3).map(({ entry }) => entry);
};

document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || !document.getElementById("search-results")) return;
  let matched = [];
  const query = Search.query;
  const performSearch = Search._performSearch;
  Search.query = (text) => {
    loadErrorEntries()
      .then((entries) => (matched = matchErrorEntries(entries, text)))
      .catch(() => (matched = []))
      .finally(() => query(text));
  };
  Search._performSearch = (...args) => {
    const results = performSearch(...args);
    const docs = Search._index.docnames;
    const file = docs.indexOf(ERROR_INDEX);
    if (file < 0 || !matched.length) return results;
    const page = Search._index.titles[file];
    const filename = Search._index.filenames[file];
    const anchors = new Set(matched.map((entry) => entry.anchor));
    // Results are shown from the end of the list: the best match goes last.
    const kept = results.filter((r) => !(r[0] === ERROR_INDEX && anchors.has(r[2])));
    const escape = (text) =>
      text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    // Sphinx shows a result's title as HTML: the messages' own <...> must stay text.
    const first = matched.map((entry) =>
      [ERROR_INDEX, `${page} > ${escape(entry.title)}`, entry.anchor, null, 1000, filename]);
    return kept.concat(first.reverse());
  };
});
