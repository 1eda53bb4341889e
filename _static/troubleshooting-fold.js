/* The troubleshooting index (chapter 9) folds its groups, so the page stays scannable.
 *
 * Each group is a <section> holding a <span id="grp-..."> and an <h2>; its entries are child
 * sections, each with a <span id="err-..."> and an <h3>. This script, on that page only, turns
 * each group's heading into a button and hides the rest of the group with
 * hidden="until-found": the browser's find-in-page still searches the folded text and opens
 * the group it finds a match in (the `beforematch` event); where a browser does not know
 * "until-found", the content is plainly hidden and the heading opens it.
 *
 * A group opens by itself when the address names it or anything inside it (#err-cuda-oom, as
 * the book's search results and the contents list link entries): on load, on every change of
 * the address's #fragment, and on a click of a link to the page's own anchors. The page's HTML
 * is unchanged (folding happens here), so the search script, which reads that HTML, sees every
 * entry; without JavaScript every group is simply open.
 */
"use strict";

(() => {
  const GROUP_LABEL = ":scope > span[id^='grp-']";
  const folded = new Map(); // group section -> { button, parts }

  const setOpen = (group, open) => {
    const state = folded.get(group);
    if (!state) return;
    state.button.setAttribute("aria-expanded", String(open));
    group.classList.toggle("ts-open", open);
    for (const part of state.parts) {
      if (open) part.removeAttribute("hidden");
      else part.setAttribute("hidden", "until-found");
    }
  };

  /** The folded group that holds the element with this id (or is it); null if none. */
  const groupOf = (id) => {
    if (!id) return null;
    let target = document.getElementById(id);
    if (!target) return null;
    for (let node = target; node; node = node.parentElement)
      if (folded.has(node)) return { group: node, target };
    return null;
  };

  /** Open the group that the address's #fragment points into, and show the target. */
  const openFromHash = (scroll) => {
    let id = "";
    try {
      id = decodeURIComponent(window.location.hash.slice(1));
    } catch (error) {
      return;
    }
    const found = groupOf(id);
    if (!found) return;
    setOpen(found.group, true);
    if (scroll) found.target.scrollIntoView();
  };

  const fold = () => {
    const labels = document.querySelectorAll("section > span[id^='grp-']");
    if (!labels.length || !document.querySelector("section > span[id^='err-']")) return;
    labels.forEach((label) => {
      const group = label.parentElement;
      const heading = group.querySelector(":scope > h2");
      if (!heading || !group.matches("section") || !group.querySelector(GROUP_LABEL)) return;
      const parts = [...group.children].filter(
        (child) => child !== label && child !== heading
      );
      if (!parts.length) return;
      const entries = group.querySelectorAll(":scope > section > span[id^='err-']").length;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "ts-fold-toggle";
      button.setAttribute("aria-expanded", "false");
      button.title = "Show or hide this group";
      const text = heading.firstChild; // the heading's text, before its # link
      button.append(text);
      if (entries) {
        const count = document.createElement("span");
        count.className = "ts-fold-count";
        count.textContent = ` (${entries})`;
        button.append(count);
      }
      heading.prepend(button);
      button.addEventListener("click", () =>
        setOpen(group, button.getAttribute("aria-expanded") !== "true")
      );
      folded.set(group, { button, parts });
      for (const part of parts)
        part.addEventListener("beforematch", () => setOpen(group, true));
      setOpen(group, false);
    });
    document.documentElement.classList.add("ts-folding");
    openFromHash(true);
    window.addEventListener("hashchange", () => openFromHash(true));
    // A click on a link to an anchor of this page opens its group before the browser scrolls
    // (clicking the link the address already holds fires no hashchange).
    document.addEventListener("click", (event) => {
      const link = event.target.closest && event.target.closest("a[href*='#']");
      if (!link || link.pathname !== window.location.pathname) return;
      const found = groupOf(decodeURIComponent(link.hash.slice(1)));
      if (found) setOpen(found.group, true);
    });
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fold);
  else fold();
})();
