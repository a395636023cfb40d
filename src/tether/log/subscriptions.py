"""Live fan-out of committed events to subscribers, on the event loop.

The writer thread hands each committed batch to `Hub.publish` from its own thread; the hub
moves it onto the loop with one `call_soon_threadsafe` per batch, so subscribers see events in
commit (= seq) order. A subscriber that falls too far behind is not allowed to grow without
bound: its buffer is dropped and it is told to re-read from the log after its last seq, so a
slow reader costs nothing to the writer or to other readers and still loses nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from tether.events import Event


class SessionDeleted(Exception):
    pass


class Overflowed(Exception):
    """The subscriber's buffer was dropped; re-read from the log after the last seq you sent."""


class Subscription:
    """One follower of one session. `wakeup` may be shared with other sources (the sidebar
    feed) so one SSE loop can wait on both."""

    def __init__(
        self, hub: Hub, session_id: str, max_buffer: int, wakeup: asyncio.Event | None = None
    ):
        self._hub = hub
        self.session_id = session_id
        self._max_buffer = max_buffer
        self._buffer: deque[Event] = deque()
        self.wakeup = wakeup or asyncio.Event()
        self._overflowed = False
        self._deleted = False

    def _push(self, event: Event) -> None:
        if self._overflowed:
            return
        if len(self._buffer) >= self._max_buffer:
            self._buffer.clear()
            self._overflowed = True
        else:
            self._buffer.append(event)
        self.wakeup.set()

    def _mark_deleted(self) -> None:
        self._deleted = True
        self.wakeup.set()

    def has_pending(self) -> bool:
        return bool(self._buffer) or self._overflowed or self._deleted

    def take(self) -> list[Event]:
        """What was published since the last take, without waiting; raises SessionDeleted,
        or Overflowed when the buffer was dropped (re-read from the log)."""
        if self._deleted:
            raise SessionDeleted(self.session_id)
        if self._overflowed:
            self._overflowed = False
            raise Overflowed()
        batch = list(self._buffer)
        self._buffer.clear()
        return batch

    async def next_batch(self, timeout: float) -> list[Event]:
        """Events published since the last call; [] after `timeout` seconds of silence."""
        if not self.has_pending():
            self.wakeup.clear()
            try:  # not wait_for: on Python 3.11 a wake-up as it is cancelled swallows the cancel
                async with asyncio.timeout(timeout):
                    await self.wakeup.wait()
            except TimeoutError:
                return []
        return self.take()

    def close(self) -> None:
        self._hub._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


BatchListener = Callable[[list[Event]], None]
DeleteListener = Callable[[str], None]


class Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_buffer: int = 4096):
        self._loop = loop
        self._max_buffer = max_buffer
        self._subs: dict[str, set[Subscription]] = {}
        self._batch_listeners: list[BatchListener] = []
        self._delete_listeners: list[DeleteListener] = []

    # -- called from any thread -------------------------------------------------------------
    def publish(self, events: list[Event]) -> None:
        self._loop.call_soon_threadsafe(self._dispatch, events)

    def publish_deleted(self, session_id: str) -> None:
        self._loop.call_soon_threadsafe(self._dispatch_deleted, session_id)

    # -- loop side ------------------------------------------------------------------------
    def subscribe(self, session_id: str, wakeup: asyncio.Event | None = None) -> Subscription:
        sub = Subscription(self, session_id, self._max_buffer, wakeup)
        self._subs.setdefault(session_id, set()).add(sub)
        return sub

    def on_batch(self, listener: BatchListener) -> None:
        self._batch_listeners.append(listener)

    def on_deleted(self, listener: DeleteListener) -> None:
        self._delete_listeners.append(listener)

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.session_id]

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            for sub in self._subs.get(event.session_id, ()):
                sub._push(event)
        for listener in self._batch_listeners:
            listener(events)

    def _dispatch_deleted(self, session_id: str) -> None:
        for sub in self._subs.pop(session_id, set()):
            sub._mark_deleted()
        for listener in self._delete_listeners:
            listener(session_id)
