// A session the page could not read when it opened it (`App.load` in main.js).

const RETRY_MS = 2000;

/**
 * An unreachable server (a restart, a dropped network) is no reason to leave the session the
 * user chose: showing a New chat there made a message typed next start another session. It
 * stays open (its address, its draft, what was read of it), the page says the server is
 * unreachable, and it is read again every 2 s until the server answers or another session is
 * opened. Any other refusal goes back to a New chat, saying why; a session gone takes its
 * draft to the composer (drafts.js).
 */
export function openFailed(app, sid, err, retry) {
  if (app.openId !== sid) return;
  if (err.code === "network") {
    app.setConn("reconnecting"); // the banner, and Stop waits (main.js setConn)
    setTimeout(() => {
      if (app.openId === sid && !app.stream) retry();
    }, RETRY_MS);
    return;
  }
  app.notify(
    err.code === "session_not_found" ? "That session does not exist (any more)." : err.message,
  );
  history.replaceState({}, "", "/");
  app.showEmpty();
  if (err.code === "session_not_found") app.drafts.rescue(sid);
}
