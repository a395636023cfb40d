// Markdown to sanitised HTML, in the page, with maintained libraries copied byte for byte
// from their pinned npm packages into vendor/ (docs/page.md says which and why):
// markdown-it parses CommonMark plus tables, strikethrough and bare http(s) URLs with raw HTML
// disabled, highlight.js colours code, DOMPurify keeps only an allowlist of tags, attributes
// and URL schemes. One renderer serves the live stream and settled history, so the live
// render of the final text is the settled render and nothing moves when a run ends.
import DOMPurify from "../vendor/purify.es.js";
import hljs from "../vendor/highlight.min.js";
import markdownit from "../vendor/markdown-it.esm.min.js";

const TAGS = [
  "p",
  "br",
  "hr",
  "em",
  "strong",
  "del",
  "s",
  "code",
  "pre",
  "span",
  "div",
  "a",
  "ul",
  "ol",
  "li",
  "blockquote",
  "h1",
  "h2",
  "h3",
  "h4",
  "h5",
  "h6",
  "table",
  "thead",
  "tbody",
  "tr",
  "th",
  "td",
  "input",
];
const PURIFY = {
  ALLOWED_TAGS: TAGS,
  ALLOWED_ATTR: ["href", "title", "class", "start", "type", "checked", "disabled", "aria-label"],
  ALLOW_DATA_ATTR: false,
  // http, https and mailto links, or links without a scheme (relative to this page)
  ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|(?![a-z][a-z0-9+.-]*:))/i,
  IN_PLACE: true,
};
DOMPurify.setConfig(PURIFY); // once: a config passed per call is parsed again on every call
// HTML is parsed into this inert document (no scripts run, nothing loads) and sanitised there
// in place, which spares the sanitiser building a document on every live render.
const INERT = document.implementation.createHTMLDocument("");
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A") node.setAttribute("rel", "noopener noreferrer nofollow");
  // the only input the renderer writes is a task list's read-only checkbox
  if (node.nodeName === "INPUT" && !(node.type === "checkbox" && node.disabled)) node.remove();
});

const escapeHtml = (s) =>
  s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

function highlighted(code, lang) {
  if (!lang || !hljs.getLanguage(lang)) return escapeHtml(code);
  return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
}

/** A code block: a head with its language (the Copy button is added by `decorate`). */
function codeBlock(code, lang) {
  const cls = lang ? ` class="language-${escapeHtml(lang)}"` : "";
  return (
    `<div class="code-block"><div class="code-head"><span class="code-lang">` +
    `${escapeHtml(lang || "text")}</span></div>` +
    `<pre><code${cls}>${highlighted(code, lang)}</code></pre></div>\n`
  );
}

const md = markdownit("commonmark", { html: false, linkify: true }).enable([
  "table",
  "strikethrough",
  "linkify",
]);
md.linkify.set({ fuzzyLink: false, fuzzyEmail: false }); // "README.md" is not a link
md.renderer.rules.fence = (tokens, idx) => {
  const info = md.utils.unescapeAll(tokens[idx].info).trim();
  return codeBlock(tokens[idx].content, info.split(/\s+/)[0]);
};
md.renderer.rules.code_block = (tokens, idx) => codeBlock(tokens[idx].content, "");
md.renderer.rules.task_checkbox = (tokens, idx) =>
  tokens[idx].meta.checked
    ? '<input type="checkbox" class="task-check" disabled checked aria-label="Done"> '
    : '<input type="checkbox" class="task-check" disabled aria-label="Not done"> ';

// Table alignment as a class: the page's CSP blocks inline style attributes.
md.core.ruler.push("align_classes", (state) => {
  for (const token of state.tokens) {
    const style = token.attrGet("style");
    if (style === null || !(token.type === "th_open" || token.type === "td_open")) continue;
    token.attrs = token.attrs.filter(([name]) => name !== "style");
    const align = /text-align:(left|right|center)/.exec(style);
    if (align) token.attrJoin("class", `align-${align[1]}`);
  }
});

// GitHub task lists: a list item whose text starts with "[ ] " or "[x] ". (The maintained
// plugin imports markdown-it by a bare module name, which a no-build page cannot resolve,
// and numbers its ids by source line, which differ between a live and a settled render.)
md.core.ruler.push("task_lists", (state) => {
  const tokens = state.tokens;
  for (let i = 2; i < tokens.length; i++) {
    const inline = tokens[i];
    if (inline.type !== "inline" || tokens[i - 1].type !== "paragraph_open") continue;
    if (tokens[i - 2].type !== "list_item_open") continue;
    const mark = /^\[([ xX])\][ \t]/.exec(inline.content);
    const first = inline.children[0];
    if (!mark || first?.type !== "text" || !first.content.startsWith(mark[0])) continue;
    first.content = first.content.slice(mark[0].length);
    const box = new state.Token("task_checkbox", "input", 0);
    box.meta = { checked: mark[1] !== " " };
    inline.children.unshift(box);
    tokens[i - 2].attrJoin("class", "task");
  }
});

/** Sanitised DOM for `html`: a <div> of the page's document holding it (the Copy buttons of
 *  code blocks added). Parsed and cleaned in the inert document, where nothing in it loads
 *  or runs, then cloned into the page's: moving the nodes over instead (adoption) cost
 *  30 times as much, half the time of opening a long session (docs/page.md). */
function sanitised(html) {
  const box = INERT.createElement("div");
  box.innerHTML = html;
  DOMPurify.sanitize(box);
  for (const head of box.querySelectorAll(".code-head")) {
    const button = INERT.createElement("button");
    button.type = "button";
    button.className = "btn copy-code";
    button.textContent = "Copy";
    head.append(button);
  }
  return document.importNode(box, true);
}

/** The top-level blocks of a token list: [{start, end, line}] (token indexes, first line). */
function topLevelBlocks(tokens) {
  const blocks = [];
  let depth = 0;
  tokens.forEach((token, index) => {
    if (depth === 0) blocks.push({ start: index, end: index + 1, line: token.map?.[0] ?? 0 });
    depth += token.nesting;
    blocks[blocks.length - 1].end = index + 1;
  });
  return blocks;
}

function lineOffset(text, line) {
  let offset = 0;
  for (let i = 0; i < line; i++) offset = text.indexOf("\n", offset) + 1;
  return offset;
}

/** Time spent rendering Markdown, for the budget test and profiling. */
export const renderStats = { ms: 0, renders: 0 };

/** A text longer than this is shown as plain text after a note, never parsed: a 3 MB answer
 *  would block the page's main thread. The note and classes are the server renderer's
 *  (http/markdown.py, for API clients); the threshold is higher here, since the page renders
 *  on the reader's own machine and incrementally (a 100 KB answer costs about one render). */
export const MAX_FORMATTED_CHARS = 200_000;

/** A plain part closes at the first newline after this many characters, or at four times as
 *  many without one: a line longer than that shows broken there, and a selection copied
 *  across the break gets a line break there (the message's Copy button copies it exactly). */
const PLAIN_PART_CHARS = 16_384;

/** Where the open plain part closes, or 0 while it stays open. It depends only on the first
 *  4 × PLAIN_PART_CHARS characters, so a text streamed in any pieces is cut where the whole
 *  text is; a forced cut never splits a surrogate pair. */
function plainPartEnd(pending) {
  if (pending.length < PLAIN_PART_CHARS) return 0;
  const longest = 4 * PLAIN_PART_CHARS;
  const newline = pending.indexOf("\n", PLAIN_PART_CHARS - 1);
  if (newline >= 0 && newline < longest) return newline + 1;
  if (pending.length < longest) return 0;
  const high = pending.charCodeAt(longest - 1);
  return high >= 0xd800 && high <= 0xdbff ? longest - 1 : longest;
}

/** About how many lines `text` takes: its newlines, and a line per 100 characters of one
 *  longer line (pre-wrap wraps it). Only a height until the part is laid out. */
function lineCount(text) {
  let lines = 0;
  let start = 0;
  for (let end = text.indexOf("\n"); end >= 0; end = text.indexOf("\n", start)) {
    lines += Math.max(1, Math.ceil((end - start) / 100));
    start = end + 1;
  }
  if (start < text.length) lines += Math.ceil((text.length - start) / 100);
  return Math.max(lines, 1);
}

const tooLongNote = (length) =>
  `Shown as plain text: ${length.toLocaleString("en-US")} characters is more than the ` +
  `${MAX_FORMATTED_CHARS.toLocaleString("en-US")} that are formatted.`;

/** Views shown as plain text until the page is idle (`showLater`), the newest last. */
const waiting = [];
let drawing = false;
const IDLE_SLICE_MS = 8; // a slice leaves the frame room for input and painting

/** Render waiting views, newest first (a session opens at its bottom), a slice at a time. A
 *  view whose element has left the page (another session opened) is dropped. */
function drawWaiting() {
  const until = performance.now() + IDLE_SLICE_MS;
  while (waiting.length && performance.now() < until) waiting.pop().showWaiting();
  drawing = waiting.length > 0;
  if (drawing) whenIdle(drawWaiting);
}

const whenIdle = (callback) =>
  window.requestIdleCallback
    ? requestIdleCallback(callback, { timeout: 250 })
    : setTimeout(callback, 0);

/**
 * One element's Markdown, rendered incrementally as its text grows. A top-level block is
 * frozen (never parsed or touched again) once a later block has started on a complete line:
 * CommonMark never reopens a closed block, so the frozen blocks plus the re-rendered tail are
 * exactly the render of the whole text. Reference definitions reach back to earlier blocks,
 * so a text with one is rendered whole.
 */
export class MarkdownView {
  constructor(el) {
    this.el = el;
    this.text = "";
    this.frozenEnd = 0; // characters of `text` whose blocks are frozen
    this.tailNodes = [];
    this.shown = false;
    this.plain = null; // {note, text} while the text is over MAX_FORMATTED_CHARS
    this.later = null; // the text shown plain until `showWaiting` renders it
  }

  /** `text` as plain text now (find-in-page and the accessibility tree have it), rendered
   *  when the page is idle: a 1,200-row session's history parsed and sanitised every answer
   *  before it showed anything (docs/page.md, "Long sessions"). */
  showLater(text) {
    if (this.shown) {
      this.show(text); // rendered once, it stays rendered
      return;
    }
    if (this.later === text) return;
    if (this.later === null) {
      waiting.push(this);
      if (!drawing) {
        drawing = true;
        whenIdle(drawWaiting);
      }
    }
    this.later = text;
    this.el.classList.add("later");
    this.el.textContent = text;
  }

  /** Render the text `showLater` left plain, if any (a search hit revealed, an idle slice). */
  showWaiting() {
    if (this.later !== null && this.el.isConnected) this.show(this.later);
  }

  show(text) {
    if (this.later !== null) {
      this.later = null;
      this.el.classList.remove("later");
      this.reset();
    }
    if (text === this.text && this.shown) return;
    this.shown = true;
    const began = performance.now();
    if (text.length > MAX_FORMATTED_CHARS) {
      this.showPlain(text);
      renderStats.ms += performance.now() - began;
      renderStats.renders += 1;
      return;
    }
    if (this.plain || !text.startsWith(this.text.slice(0, this.frozenEnd))) this.reset();
    this.text = text;
    const tail = text.slice(this.frozenEnd);
    const env = {};
    const tokens = md.parse(tail, env);
    if (env.references && this.frozenEnd > 0) {
      this.reset();
      this.show(text);
      return;
    }
    const blocks = topLevelBlocks(tokens);
    const completeLines = tail.split("\n").length - 1;
    let frozen = 0;
    const freezable = !env.references && !tail.includes("\r");
    while (freezable && frozen < blocks.length - 1 && blocks[frozen + 1].line < completeLines) {
      frozen++;
    }
    const split = frozen > 0 ? blocks[frozen - 1].end : 0;
    // one sanitiser pass: the newly frozen blocks and the tail
    const [done, rest] = sanitised(
      `<div>${md.renderer.render(tokens.slice(0, split), md.options, env)}</div>` +
        `<div>${md.renderer.render(tokens.slice(split), md.options, env)}</div>`,
    ).children;
    for (const node of this.tailNodes) node.remove();
    this.el.append(...done.childNodes);
    this.tailNodes = [...rest.childNodes];
    this.el.append(...this.tailNodes);
    if (frozen > 0) this.frozenEnd += lineOffset(tail, blocks[frozen].line);
    renderStats.ms += performance.now() - began;
    renderStats.renders += 1;
  }

  /** `text` as plain text (text nodes, never HTML) after the note. It is cut into parts of
   *  about PLAIN_PART_CHARS ending at a newline: a growing text only rewrites its last part, and
   *  Chromium lays out a part only when it changes or scrolls into view (content-visibility),
   *  where one text node of 3 MB was re-laid out whole on every append (half a second each). */
  showPlain(text) {
    const doc = this.el.ownerDocument;
    if (!this.plain || !text.startsWith(this.text)) {
      this.reset();
      this.shown = true;
      this.plain = { note: doc.createElement("p"), text: doc.createElement("pre"), open: null };
      this.plain.note.className = "render-note";
      this.plain.text.className = "render-plain";
      this.el.append(this.plain.note, this.plain.text);
      this.openPlainPart();
    }
    let pending = this.plain.open.data + text.slice(this.text.length);
    for (let cut = plainPartEnd(pending); cut > 0; cut = plainPartEnd(pending)) {
      this.plain.open.data = pending.slice(0, cut);
      const part = this.plain.open.parentNode;
      part.classList.add("closed");
      // a closed part not laid out yet takes the height of its lines, so the scrollbar is true
      part.style.containIntrinsicBlockSize = `auto ${lineCount(this.plain.open.data)}lh`;
      pending = pending.slice(cut);
      this.openPlainPart();
    }
    this.plain.open.data = pending;
    this.plain.note.textContent = tooLongNote(text.length);
    this.text = text;
  }

  openPlainPart() {
    const doc = this.el.ownerDocument;
    const part = doc.createElement("div");
    part.className = "render-plain-part";
    this.plain.open = doc.createTextNode("");
    part.append(this.plain.open);
    this.plain.text.append(part);
  }

  reset() {
    this.el.replaceChildren();
    this.text = "";
    this.frozenEnd = 0;
    this.tailNodes = [];
    this.shown = false;
    this.plain = null;
  }
}
