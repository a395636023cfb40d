// Message search (docs/api.md §13, `GET /api/search`): a dialog opened by the sidebar's
// "Search messages" button, Ctrl+K / Cmd+K anywhere, or "/" outside a text field. Results are
// the best-matching user and assistant rows of every session; choosing one opens its session
// at that row. A row of a hidden branch (an edit, a regenerate or an undo hid it; `shown: false`)
// is marked "in another branch"; choosing it opens its session and shows that branch. Snippets arrive as {text, match} parts and are built as text nodes, the matched
// words in <mark> elements made here: nothing from the server is ever parsed as HTML.
import { get, q } from "./api.js";
import { composing, h } from "./dom.js";

const $ = (id) => document.getElementById(id);
const DEBOUNCE_MS = 200;
const LIMIT = 30; // the best rows asked for: when as many come back, there may be more

function typing(target) {
  return !!target?.closest?.(
    "input, textarea, select, [contenteditable=''], [contenteditable='true']",
  );
}

export function snippetNode(parts) {
  const el = h("span", { class: "search-snippet" });
  for (const part of parts) el.append(part.match ? h("mark", { text: part.text }) : part.text);
  return el;
}

export class MessageSearch {
  /** opts: onPick(session_id, row_id, shown) */
  constructor({ onPick }) {
    this.onPick = onPick;
    this.dialog = $("search-dialog");
    this.input = $("search-messages");
    this.results = $("search-results");
    this.status = $("search-status");
    this.timer = null;
    this.asked = 0;
    $("search-messages-btn").addEventListener("click", () => this.open());
    this.input.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.run(), DEBOUNCE_MS);
    });
    this.input.addEventListener("keydown", (e) => {
      if (composing(e)) return;
      if (e.key === "Escape") {
        e.preventDefault(); // a search field would clear itself first: close at once
        this.dialog.close();
      } else if (e.key === "Enter") {
        e.preventDefault();
        this.openFirst();
      } else if (e.key === "ArrowDown") {
        const first = this.results.querySelector("button");
        if (first) {
          e.preventDefault();
          first.focus();
        }
      }
    });
    this.results.addEventListener("keydown", (e) => this.onKey(e));
    document.addEventListener("keydown", (e) => {
      const chord = (e.ctrlKey || e.metaKey) && !e.altKey && e.key.toLowerCase() === "k";
      const slash = e.key === "/" && !e.ctrlKey && !e.metaKey && !e.altKey && !typing(e.target);
      if ((chord || slash) && !this.dialog.open && !document.querySelector("dialog[open]")) {
        e.preventDefault();
        this.open();
      }
    });
  }

  open() {
    this.dialog.showModal();
    this.input.select();
  }

  /** Enter in the box: the first result of the text in the box, not of an earlier text
   *  whose results are still shown while the new search waits out its debounce. */
  async openFirst() {
    if (this.shownFor !== this.input.value.trim()) {
      clearTimeout(this.timer);
      await this.run();
    }
    if (this.dialog.open && this.shownFor === this.input.value.trim()) {
      this.results.querySelector("button")?.click();
    }
  }

  onKey(e) {
    const buttons = [...this.results.querySelectorAll("button")];
    const at = buttons.indexOf(document.activeElement);
    if (at < 0) return;
    if (e.key === "ArrowDown" && at < buttons.length - 1) buttons[at + 1].focus();
    else if (e.key === "ArrowUp") (at > 0 ? buttons[at - 1] : this.input).focus();
    else return;
    e.preventDefault();
  }

  async run() {
    const text = this.input.value.trim();
    const asked = ++this.asked;
    this.shownFor = null; // what the results shown are for, once they are
    if (!text) {
      this.results.replaceChildren();
      this.status.textContent = "";
      return;
    }
    let results;
    try {
      ({ results } = await get(`/api/search?${q({ q: text, limit: LIMIT })}`));
    } catch (err) {
      if (asked !== this.asked) return;
      this.results.replaceChildren();
      this.status.textContent = err.message;
      return;
    }
    if (asked !== this.asked) return; // a newer query is on its way
    this.status.textContent =
      results.length >= LIMIT
        ? `The ${LIMIT} best matches; more words narrow it.`
        : results.length
          ? `${results.length} ${results.length === 1 ? "match" : "matches"}`
          : "No messages match.";
    this.results.replaceChildren(...results.map((r) => this.item(r)));
    this.shownFor = text;
  }

  item(result) {
    const who = result.role === "user" ? "You" : "Assistant";
    const when = new Date(result.at * 1000).toLocaleString();
    const where = result.shown === false ? " · in another branch" : "";
    const button = h(
      "button",
      {
        type: "button",
        class: "search-result",
        onclick: () => {
          this.dialog.close();
          this.onPick(result.session_id, result.row_id, result.shown);
        },
      },
      h("span", { class: "search-title", dir: "auto", text: result.title }),
      h("span", { class: "search-meta", text: `${who} · ${when}${where}` }),
      snippetNode(result.snippet_parts),
    );
    return h("li", {}, button);
  }
}
