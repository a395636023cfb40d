// The sidebar's changes reach the page on one stream at a time: the open session's stream
// (`?sidebar=1`) or, with none open, the sidebar feed (`GET /api/events`). A stream that gives
// way keeps delivering until a newer one has had its first frame, and for GRACE_MS more: the
// server follows a stream's changes from before that frame (docs/api.md §6), and the grace
// lets the old stream send what it had already been told. A session's row from a stream is
// dropped once a newer stream has sent that session's row: the newer one's is at least as
// new, and it sends every later change itself. Where no stream was listening (a stream
// dropped, or the server ended it), the list is read again once a stream follows.

const GRACE_MS = 500;

export class SidebarRelay {
  /** onChange(change): a `session.changed` for the sidebar; onGap(): refetch the list. */
  constructor({ onChange, onGap }) {
    this.onChange = onChange;
    this.onGap = onGap;
    this.generation = 0;
    this.retiring = new Map(); // generation -> stop()
    this.leader = 0; // the newest stream that follows
    this.sentBy = new Map(); // session_id -> the newest stream that sent its row
    // The page's first list is read before any stream follows: a change in between would be
    // missed, so the first stream to follow has the list read again.
    this.gap = true;
  }

  /** A new stream of changes; `stop()` ends it. Its handle: `frame()` for every frame it
   *  brings (a connection's first says it follows), `change(c)` for each sidebar change,
   *  `retire()` when it gives way, `lost()` when it dropped or the server ended it. */
  add(stop) {
    const generation = ++this.generation;
    let following = false; // until the connection's first frame
    return {
      frame: () => {
        if (following) return;
        following = true;
        this.followed(generation);
      },
      change: (change) => this.change(generation, change),
      retire: () => this.retiring.set(generation, stop),
      lost: () => {
        following = false; // a reconnection follows anew
        this.lost(generation);
      },
    };
  }

  followed(generation) {
    if (generation > this.leader) {
      this.leader = generation;
      setTimeout(() => this.stopRetiring((older) => older < generation), GRACE_MS);
    }
    if (this.gap) {
      this.gap = false;
      this.onGap();
    }
  }

  change(generation, change) {
    if ((this.sentBy.get(change.session_id) ?? 0) > generation) return;
    this.sentBy.set(change.session_id, generation);
    this.onChange(change);
  }

  /** Changes may have been missed, unless a newer stream already follows: the list is read
   *  again when a stream next follows. A stream that was giving way is stopped (it would
   *  reconnect and hold one of the server's stream slots for nothing); the older ones keep
   *  the sidebar current meanwhile. */
  lost(generation) {
    if (generation >= this.leader) this.gap = true;
    this.stopRetiring((other) => other === generation);
  }

  stopRetiring(which) {
    for (const [generation, stop] of [...this.retiring]) {
      if (!which(generation)) continue;
      this.retiring.delete(generation);
      stop();
    }
  }
}
