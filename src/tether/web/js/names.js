// Model ids and file names as a person sees them. `GET /api/models` labels the ids it lists,
// but the page also shows ids no list labels: a session's own model the list lacks, the
// command line's, a saved default, the model that answered a row (`ModelNames` labels them
// all, apart from the list's). An id is kept byte for
// byte (the endpoint gets it back), so it may carry bidi controls or zero-width characters
// that make it pass for another model: it is shown by the server's rule
// (`tether/visible_text.py`, docs/api.md §3), which this is a copy of
// (tests/browser/test_page_model_names.py proves the two agree). So is a file name a log
// recorded before names were cleaned where they enter.

const INVISIBLE = new Set(
  "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069" +
    "\u200b\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad" +
    "\u206a\u206b\u206c\u206d\u206e\u206f\ufff9\ufffa\ufffb",
);
const LINE_BREAKS = new Set("\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029");
const JOINERS = new Set("\u200c\u200d");
const BLANK_LETTERS = new Set("\u115f\u1160\u3164\uffa0\u2800");
const CONTROL = /^\p{Cc}$/u;
const SPACE = /^\s$/u;
const NOT_SHOWN = /^[\p{Zs}\p{Zl}\p{Zp}\p{Cc}\p{Cf}\p{Mn}\p{Me}\p{Cn}\p{Co}\p{Cs}]$/u;

/** `visible_line`: NFC; invisible and control characters removed, line breaks a space, a
 *  joiner kept only between two characters it can join, whitespace runs one space, trimmed. */
export function visibleLine(text) {
  const chars = [];
  for (const ch of text.normalize("NFC")) {
    if (LINE_BREAKS.has(ch)) chars.push(" ");
    else if (!INVISIBLE.has(ch) && !CONTROL.test(ch)) chars.push(ch);
  }
  const canJoin = (ch) =>
    ch !== undefined && ch.codePointAt(0) >= 0x80 && !SPACE.test(ch) && !JOINERS.has(ch);
  return chars
    .filter((ch, i) => !JOINERS.has(ch) || (canJoin(chars[i - 1]) && canJoin(chars[i + 1])))
    .join("")
    .replace(/\s{2,}/gu, " ")
    .trim();
}

/** A message's attachments with each file name as the download and the Markdown export
 *  name it (`shown_file_name`): visible text, or `attachment` when that shows nothing. The
 *  server cleans a name where it enters, but a log an older Tether wrote (or a replica
 *  running one) holds it as it was given, and the log is never rewritten. */
export function shownFiles(attachments) {
  return (attachments || []).map((a) => {
    const name = visibleLine(a.name);
    return { ...a, name: showsSomething(name) ? name : "attachment" };
  });
}

/** `shows_something`: a character that draws (not a space, format or control character, a
 *  lone combining mark, or a letter that renders blank). */
function showsSomething(text) {
  return [...text].some((ch) => !NOT_SHOWN.test(ch) && !BLANK_LETTERS.has(ch));
}

/** `model_label` (tether/http/models.py): the id as visible text, or, when that shows
 *  nothing, its code points. */
export function modelLabel(id) {
  const label = visibleLine(id);
  if (showsSomething(label)) return label;
  const points = [...id].map(
    (ch) => `U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`,
  );
  return points.join(" ") || "(no name)";
}

/** `escaped_id` (tether/http/models.py): the id with each character that does not show as
 *  itself written `\u{HEX}` (a space but a lone inner one; every non-ASCII one when the id
 *  is not NFC) and `\` as `\\`, so two ids never read alike. */
export function escapedId(id) {
  const chars = [...id];
  const nfc = id.normalize("NFC") === id;
  const lone = (i) => i > 0 && i < chars.length - 1 && chars[i - 1] !== " " && chars[i + 1] !== " ";
  const unshown = (ch, i) =>
    (NOT_SHOWN.test(ch) && !(ch === " " && lone(i))) ||
    BLANK_LETTERS.has(ch) ||
    (!nfc && ch.codePointAt(0) > 0x7f);
  return chars
    .map((ch, i) => {
      if (ch === "\\") return "\\\\";
      if (!unshown(ch, i)) return ch;
      return `\\u{${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}}`;
    })
    .join("");
}

/** The page's names for models, as the endpoint's list (`GET /api/models`, `list`) has them
 *  apart: an id it lists (or its default) by the list's label, any other by `modelLabel`, or
 *  by `escapedId` when that reads as one of the list's labels. Made once per list; an id is
 *  labelled once and then looked up (a live row's model is drawn every frame). */
export class ModelNames {
  constructor(list = { models: [] }) {
    this.labels = new Map((list.models ?? []).map((m) => [m.id, m.label]));
    if (list.default && !this.labels.has(list.default)) {
      this.labels.set(list.default, list.default_label);
    }
    this.listed = new Set(this.labels.values());
  }

  label(id) {
    let label = this.labels.get(id);
    if (label === undefined) {
      label = modelLabel(id);
      if (this.listed.has(label)) label = escapedId(id);
      this.labels.set(id, label);
    }
    return label;
  }
}

/** A model a picker offers that the endpoint's list does not (a session's own, a saved
 *  default): its label (`names`, a `ModelNames`), saying so. */
export function unlistedLabel(id, names) {
  return `${names.label(id)} (not listed)`;
}
