// Markdown is rendered by the server (markdown-it-py + nh3): the only HTML this page ever
// inserts. Requests are batched per animation frame and cached by text.
import { post } from "./api.js";

const cache = new Map();
const CACHE_LIMIT = 1500;
let pending = new Map(); // text -> [resolve...]
let scheduled = false;

// The server takes at most 500 texts and 16 MiB a request (docs/api.md); 2M characters stay
// under that whatever the encoding. A longer text goes alone and comes back as plain text.
const BATCH_TEXTS = 500;
const BATCH_CHARS = 2_000_000;

function flush() {
  scheduled = false;
  const batch = pending;
  pending = new Map();
  let texts = [];
  let chars = 0;
  for (const text of batch.keys()) {
    if (texts.length && (texts.length >= BATCH_TEXTS || chars + text.length > BATCH_CHARS)) {
      send(texts, batch);
      texts = [];
      chars = 0;
    }
    texts.push(text);
    chars += text.length;
  }
  if (texts.length) send(texts, batch);
}

function send(texts, batch) {
  post("/api/render", { texts }).then(
    (res) => {
      texts.forEach((text, i) => {
        remember(text, res.html[i]);
        for (const resolve of batch.get(text)) resolve(res.html[i]);
      });
    },
    () => {
      for (const text of texts) for (const resolve of batch.get(text)) resolve(null);
    },
  );
}

function remember(text, html) {
  cache.set(text, html);
  if (cache.size > CACHE_LIMIT) cache.delete(cache.keys().next().value);
}

export function cachedHtml(text) {
  return cache.get(text);
}

/** Resolves with sanitized HTML for `text`, or null when the server could not render it. */
export function renderMarkdown(text) {
  if (cache.has(text)) return Promise.resolve(cache.get(text));
  return new Promise((resolve) => {
    if (!pending.has(text)) pending.set(text, []);
    pending.get(text).push(resolve);
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(flush);
    }
  });
}
