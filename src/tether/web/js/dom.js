// Small DOM helpers: element creation (text only through textContent) and keyed patching,
// so rows keep their identity and are updated, never rebuilt, on each event.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) el.append(child);
  }
  return el;
}

// The key an element was built for, kept as a property too: reading `dataset` is an
// attribute lookup, paid for every row of the transcript on every frame of a run.
const keyOf = (el) => el.patchKey ?? el.dataset.key;

/**
 * Make `parent`'s children match `specs` (each with a unique `key`), in order: existing
 * elements are kept and updated, missing ones built, stale ones removed. Children already in
 * order (every frame of a run but the first) are matched as they come, without an index.
 */
export function patchChildren(parent, specs, build, update) {
  let cursor = parent.firstElementChild;
  let unused = null; // the children not matched yet, by key, once one is out of place
  for (const spec of specs) {
    let el;
    if (unused === null && cursor !== null && keyOf(cursor) === spec.key) el = cursor;
    else {
      if (unused === null) {
        unused = new Map();
        for (let c = cursor; c !== null; c = c.nextElementSibling) unused.set(keyOf(c), c);
      }
      el = unused.get(spec.key);
      if (el) unused.delete(spec.key);
      else {
        el = build(spec);
        el.dataset.key = spec.key;
        el.patchKey = spec.key;
      }
    }
    update(el, spec);
    if (el === cursor) cursor = cursor.nextElementSibling;
    else if (el.parentNode === parent && el.contains(document.activeElement)) {
      // Moving an element blurs what has focus in it (a rename box, an editor, a row reached
      // by the keyboard), and a blur may save half-typed text: the ones before it move instead.
      const after = el.nextSibling;
      while (cursor && cursor !== el) {
        const next = cursor.nextElementSibling;
        parent.insertBefore(cursor, after);
        cursor = next;
      }
      cursor = el.nextElementSibling;
    } else parent.insertBefore(el, cursor);
  }
  if (unused !== null) for (const el of unused.values()) el.remove();
  else
    while (cursor !== null) {
      const next = cursor.nextElementSibling;
      cursor.remove();
      cursor = next;
    }
}

/** Set what differs only: writing the same text or attribute again still invalidates the
 * element's style and layout, which a list repainted on every change pays for each row. */
export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

export function setHidden(el, hidden) {
  if (el.hidden !== hidden) el.hidden = hidden;
}

export function setAttr(el, name, value) {
  if (value === null) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else if (el.getAttribute(name) !== value) el.setAttribute(name, value);
}

/** A key the input method takes (the Enter picking a conversion, the Esc cancelling one):
 *  Chromium and Firefox mark it `isComposing`; Safari's Enter committing a conversion comes
 *  with keyCode 229 only. Such a key must not send, save, cancel or close anything. */
export function composing(event) {
  return event.isComposing || event.keyCode === 229;
}

export function formatDuration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const ss = String(s % 60).padStart(2, "0");
  if (s < 3600) return `${String(Math.floor(s / 60)).padStart(2, "0")}:${ss}`;
  return `${Math.floor(s / 3600)}:${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}:${ss}`;
}
