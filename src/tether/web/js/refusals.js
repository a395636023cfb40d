// What the page does with a message the server refused (docs/page.md, "Composer"): nothing
// typed is lost. The text and attachments go back to the composer, or to the draft of the
// session they were sent from when another is shown now; a rotated session's go to its
// continuation; a view another tab changed (409 `transcript_changed`) is read again first.
import { ApiError, get, post, q } from "./api.js";
import { applySnapshot } from "./reducer.js";

/** The notice of a 409 `transcript_changed`: `what` was not done, and `where` the text is. */
export const changed = (what, where) =>
  `${what}: this conversation changed in another tab or on another device (another ` +
  `branch is shown, or a message was edited or cut). It now shows the current branch; ${where}`;

/** Where the page's view of session `sid` is folded to (`after_seq`, docs/api.md §4): sent
 *  with every message so the server refuses one whose rows were hidden since; none while
 *  nothing of it is shown yet. */
export function position(app, sid) {
  const entry = app.sessions.get(sid);
  return entry?.loaded ? entry.state.lastSeq : undefined;
}

/** After a 409 `transcript_changed` the page's view is behind (its stream is slow or
 *  reconnecting): the session is read again and shown as it is now, so what the user reads
 *  before sending again is what the model gets (contract invariant 1). Events the stream
 *  brings later fold after it; those it already holds are skipped (by seq). */
export async function catchUp(app, sid) {
  const entry = app.sessions.get(sid);
  try {
    const { session } = await get(`/api/session?${q({ session_id: sid })}`);
    if (entry && session.last_seq > entry.state.lastSeq) {
      applySnapshot(entry.state, session);
      entry.inherited = session.inherited_messages || entry.inherited;
    }
  } catch {
    // the stream brings the change when it can
  }
  if (sid === app.openId) app.renderNow();
}

/** POST `body` to `path` with the position of the view of session `sid` shown when it was
 *  clicked; a refusal is said (`notice` for a view another tab changed, which is read again
 *  first). The answer, or null when refused. */
async function fromView(app, sid, path, body, notice) {
  try {
    return await post(path, { ...body, after_seq: position(app, sid) });
  } catch (err) {
    if (err instanceof ApiError && err.code === "transcript_changed") {
      await catchUp(app, sid);
      app.notify(notice);
    } else app.notify(err.message);
    return null;
  }
}

/** "Send now" of a queued message, from the view shown when it is clicked; a refusal leaves
 *  it queued and says why. */
export function sendQueued(app, queueId) {
  const notice = changed("Not sent", "your message stays queued.");
  return fromView(app, app.openId, "/api/chat/queue/start", { queue_id: queueId }, notice);
}

/** Regenerate of the answer `rowId` (Retry after a Stop or an error is this), from the view
 *  shown when it is clicked: from a view another tab changed (a branch switched above or
 *  below it) the server refuses it rather than hide rows the user never saw, and the page
 *  shows the branch now current (contract invariant 1). */
export function regenerate(app, sid, rowId) {
  const notice = changed("Not regenerated", "regenerate again there if you still want to.");
  return fromView(app, sid, "/api/chat/regenerate", { session_id: sid, row_id: rowId }, notice);
}

/** A refused send never loses the text: it goes back to the composer (rotated: in the
 *  continuation, as a draft, never resent automatically). Sent from session `sid` while
 *  another is shown now: into `sid`'s own draft (or its continuation's), with a notice. */
export async function refused(app, err, text, files, sid) {
  const rotated = err instanceof ApiError && err.code === "session_rotated";
  if (sid && sid !== app.openId) {
    const target = rotated ? err.body.continuation_session_id : sid;
    app.drafts.add(target, text, files);
    const title = app.sidebar.rows.get(sid)?.title ?? app.sessions.get(sid)?.row?.title;
    app.notify(
      `Not sent in “${title ?? "another session"}”: ${err.message} Your text is in its composer.`,
      {
        label: "Open it",
        action: () => app.open(target, { push: true }),
      },
    );
    return;
  }
  if (rotated) {
    await app.open(err.body.continuation_session_id, { push: true });
    app.composer.restore(text, files);
    app.notify(
      "This conversation continues here. Your message is in the composer: " +
        "send it again when ready.",
    );
    return;
  }
  const moved = err instanceof ApiError && err.code === "transcript_changed";
  if (moved && sid) await catchUp(app, sid);
  app.composer.restore(text, files);
  app.notify(moved ? changed("Not sent", "your message is back in the composer.") : err.message);
}
