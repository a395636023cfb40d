// The sidebar's changes reach the page on one stream at a time: the open session's stream
// (`?sidebar=1`) or, with none open, the sidebar feed (`GET /api/events`). A stream that gives
// way is kept until a newer one has its first frame: the server follows a stream's changes
// from before that frame (docs/api.md §6), so no change falls between the two. A change may
// arrive on both, but never an older row after a newer one: the old stream is stopped while
// the new one's first frame is handled.

export class SidebarRelay {
  /** onGap(): a stream ended by itself before its successor followed: refetch the list. */
  constructor({ onGap }) {
    this.onGap = onGap;
    this.retiring = []; // [{ generation, stop }]
    this.generation = 0;
    // The page's first list is read before any stream follows: a change in between is
    // missed, so the first stream to follow has the list read again.
    this.gap = true;
  }

  /** A new stream of changes; `stop()` ends it. The handle's `followed()` is for its first
   *  frame, `retire()` for when it gives way, `lost()` for when it ended by itself. */
  add(stop) {
    const generation = ++this.generation;
    return {
      followed: () => this.followed(generation),
      retire: () => this.retiring.push({ generation, stop }),
      lost: () => {
        this.gap = true;
      },
    };
  }

  followed(generation) {
    for (const older of this.retiring.filter((r) => r.generation < generation)) older.stop();
    this.retiring = this.retiring.filter((r) => r.generation >= generation);
    if (this.gap) {
      this.gap = false;
      this.onGap();
    }
  }
}
