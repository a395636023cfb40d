// The sidebar's changes reach the page on one stream at a time: the open session's stream
// (`?sidebar=1`) or, with none open, the sidebar feed (`GET /api/events`). A stream that gives
// way keeps delivering until a newer one has had its first frame, and for GRACE_MS more: the
// server follows a stream's changes from before that frame (docs/api.md §6), and the grace
// lets the old stream send what it had already been told. Meanwhile a session's row from the
// old stream is dropped once the new one has sent that session's row: the new one is at
// least as new, and sends every later change itself. Where no stream was listening (one
// dropped, or the server ended it), the list is read again once the next stream follows.

const GRACE_MS = 500;

export class SidebarRelay {
  /** onChange(change): a `session.changed` for the sidebar; onGap(): refetch the list. */
  constructor({ onChange, onGap }) {
    this.onChange = onChange;
    this.onGap = onGap;
    this.generation = 0;
    this.retiring = new Map(); // generation -> stop()
    this.leader = { generation: 0, sent: new Set() }; // the newest stream that follows
    // The page's first list is read before any stream follows: a change in between would be
    // missed, so the first stream to follow has the list read again.
    this.gap = true;
  }

  /** A new stream of changes; `stop()` ends it. Its handle: `followed()` on its first frame,
   *  `change(c)` for each sidebar change it brings, `retire()` when it gives way, `lost()`
   *  when it dropped or the server ended it. */
  add(stop) {
    const generation = ++this.generation;
    return {
      followed: () => this.followed(generation),
      change: (change) => this.change(generation, change),
      retire: () => this.retiring.set(generation, stop),
      lost: () => this.lost(generation),
    };
  }

  followed(generation) {
    if (generation > this.leader.generation) {
      this.leader = { generation, sent: new Set() };
      setTimeout(() => this.stopRetiring((older) => older < generation), GRACE_MS);
    }
    if (this.gap) {
      this.gap = false;
      this.onGap();
    }
  }

  change(generation, change) {
    if (generation === this.leader.generation) this.leader.sent.add(change.session_id);
    else if (generation < this.leader.generation && this.leader.sent.has(change.session_id)) {
      return;
    }
    this.onChange(change);
  }

  /** Changes were missed: the list is read again when the next stream follows, so this
   *  stream, if it was giving way, and the older ones are of no more use (each holds one of
   *  the server's stream slots, which the next stream may need). */
  lost(generation) {
    this.gap = true;
    this.stopRetiring((other) => other <= generation);
  }

  stopRetiring(which) {
    for (const [generation, stop] of [...this.retiring]) {
      if (!which(generation)) continue;
      this.retiring.delete(generation);
      stop();
    }
  }
}
