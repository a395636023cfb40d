"""The event streams of docs/api.md §6.

A browser tab keeps one connection: `?sidebar=1` on a session stream also carries the sidebar
feed's `session.changed` frames (HTTP/1.1 allows six connections per origin across all tabs).

Per session: subscribe first, then replay from the log after the cursor, then follow the live
tail, dropping anything at or below the last seq sent. Subscribing before reading is what makes
the hand-off gap-free; the seq filter is what makes it duplicate-free. A cursor that cannot be
honoured gets one `session.snapshot`, never a refusal and never a silent skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from tether.errors import TooManyStreams
from tether.events import ID_PATTERN, Event
from tether.http.accounts import PRINCIPAL, Guard
from tether.http.auth import COOKIE_NAME
from tether.http.deps import App, Services
from tether.http.errors import documented
from tether.log import SessionDeleted, SessionNotFound, StorageError, compact_json
from tether.log.subscriptions import Overflowed, Subscription
from tether.sessions.feed import FeedClient
from tether.sessions.service import IDLE

router = APIRouter(tags=["events"])

_REPLAY_PAGE = 500
_CHUNK_BYTES = 64 * 1024
_OCCUPANCY_WAIT_SECONDS = 0.25  # a heartbeat's read of the shared log, at most


_dumps = compact_json.dumps


def parse_cursor(raw: str | None) -> int | None:
    """A valid cursor is a decimal seq >= 0; anything else is None (snapshot)."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return None
    return int(raw)


def _frame(event: Event) -> str:
    """One event as SSE text, written by hand: an event type has no line break and compact
    JSON has none either, so sse_starlette's per-line splitting has nothing to do. The
    separator is sse_starlette's default, as for the frames it encodes."""
    return f"id: {event.seq}\r\nevent: {event.type}\r\ndata: {_dumps(event.envelope())}\r\n\r\n"


def _frames(events: list[Event]) -> Iterator[bytes]:
    """Frames as body chunks of about `_CHUNK_BYTES`: one ASGI send (one socket write) per
    chunk instead of one per event, which was most of a replay's cost. The bound keeps each
    send short for a slow reader (the write deadline applies per send)."""
    parts: list[bytes] = []
    size = 0
    for event in events:
        frame = _frame(event).encode()
        parts.append(frame)
        size += len(frame)
        if size >= _CHUNK_BYTES:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


async def _heartbeat(app: Services, session_id: str, last_seq: int) -> ServerSentEvent:
    """On a shared log, whether another replica runs the session is read from the database;
    a heartbeat never waits for it long (contract invariant 7: observation has a degraded
    path): with the database slow or away it says what this process runs."""
    try:
        async with asyncio.timeout(_OCCUPANCY_WAIT_SECONDS):
            occupied = await app.sessions.occupancy_of(session_id)
    except SessionNotFound:  # deleted: its stream ends with `session.deleted` next
        occupied = IDLE
    except (StorageError, TimeoutError):
        occupied = app.sessions.own_occupancy(session_id)
    return ServerSentEvent(
        event="heartbeat",
        data=_dumps(
            {
                "last_seq": last_seq,
                "busy": occupied.busy,
                "active_stream_id": occupied.active_stream_id,
                "server_time": time.time(),
            }
        ),
    )


async def _changes(app: Services, changes: list[tuple[str, str]] | None) -> list[ServerSentEvent]:
    """The sidebar frames of these changes: only of sessions the stream's person may see
    (log/ownership.py), so another person's activity is never announced."""
    if changes is None:
        return [ServerSentEvent(event="resync", data=_dumps({"reason": "overflow"}))]
    return [
        ServerSentEvent(
            event="session.changed",
            data=_dumps({"session_id": sid, "reason": reason, "row": await app.sessions.row(sid)}),
        )
        for sid, reason in changes
        if await app.store.visible(sid)
    ]


def _guard(request: Request) -> Guard | None:
    accounts = request.app.state.accounts
    every = request.app.state.services.settings.heartbeat_seconds
    if accounts is not None:
        return accounts.guard(PRINCIPAL.get(), every)
    auth = request.app.state.auth
    if auth.password_required:  # a logout of this cookie ends the stream too
        return auth.guard(request.cookies.get(COOKIE_NAME), every)
    return None


async def _session_frames(
    app: Services,
    session_id: str,
    cursor_raw: str | None,
    with_sidebar: bool,
    guard: Guard | None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    interval = app.settings.heartbeat_seconds
    wakeup = asyncio.Event()
    feed = app.feed.connect(wakeup) if with_sidebar else None
    try:
        with (
            app.hub.subscribe(session_id, wakeup) as sub,
            guard.watching(wakeup) if guard else contextlib.nullcontext(),
        ):
            async for frame in _follow(app, session_id, cursor_raw, sub, feed, interval, guard):
                yield frame
    finally:
        if feed is not None:
            app.feed.disconnect(feed)


async def _follow(
    app: Services,
    session_id: str,
    cursor_raw: str | None,
    sub: Subscription,
    feed: FeedClient | None,
    interval: float,
    guard: Guard | None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    current = await app.store.last_seq(session_id)
    if current is None:
        return
    cursor = parse_cursor(cursor_raw)
    if cursor_raw is None:
        sent = current
    elif cursor is None or cursor > current:
        try:
            snapshot = await app.sessions.view(session_id)
        except SessionNotFound:
            return
        yield ServerSentEvent(event="session.snapshot", data=_dumps({"session": snapshot}))
        sent = snapshot["last_seq"]
    else:
        sent = cursor

    async def catch_up() -> AsyncIterator[bytes]:
        nonlocal sent
        while True:
            page = await app.store.read(session_id, after=sent, limit=_REPLAY_PAGE)
            for chunk in _frames(page):
                yield chunk
            if page:
                sent = page[-1].seq
            if len(page) < _REPLAY_PAGE:
                return

    async for frame in catch_up():
        yield frame
    if feed is not None:  # the sidebar is followed from before this frame (docs/api.md §6)
        yield await _heartbeat(app, session_id, sent)
    loop = asyncio.get_running_loop()
    quiet_until = loop.time() + interval
    while True:
        if not sub.has_pending() and not (feed and feed.has_pending()):
            sub.wakeup.clear()  # nothing pending, checked with no await since: no lost wakeup
            try:  # not wait_for: on Python 3.11 a wake-up as it is cancelled swallows the cancel
                async with asyncio.timeout_at(quiet_until):
                    await sub.wakeup.wait()
            except TimeoutError:
                if guard and not await guard.holds():
                    return  # logged out, token revoked or user removed: the stream ends
                yield await _heartbeat(app, session_id, sent)
                quiet_until = loop.time() + interval
                continue
        if guard and not await guard.holds():
            return
        quiet_until = loop.time() + interval
        if feed is not None and feed.has_pending():
            for change in await _changes(app, feed.take()):
                yield change
        try:
            batch = sub.take()
        except Overflowed:
            async for frame in catch_up():
                yield frame
            continue
        except SessionDeleted:
            yield ServerSentEvent(event="session.deleted", data=_dumps({"session_id": session_id}))
            return
        fresh: list[Event] = []
        gap = False
        for event in batch:
            if event.seq <= sent:
                continue
            if event.seq != sent + 1:  # never expected; the log is the authority
                gap = True
                break
            sent = event.seq
            fresh.append(event)
        for chunk in _frames(fresh):
            yield chunk
        if gap:
            async for frame in catch_up():
                yield frame


_EVENT_STREAM = {
    "text/event-stream": {
        "schema": {"type": "string", "description": "Server-Sent Events; the stream does not end"}
    }
}


@router.get(
    "/api/sessions/{session_id}/events",
    summary="Follow one session (SSE)",
    response_class=EventSourceResponse,
    response_model=None,
    responses=documented(400, 404, 429, content=_EVENT_STREAM),
)
async def session_events(
    request: Request,
    app: App,
    session_id: Annotated[str, Path(pattern=ID_PATTERN, description="A session id")],
    after: Annotated[
        str | None,
        Query(
            description="Resume after this seq (`0` replays everything); wins over Last-Event-ID. "
            "A cursor the server cannot honour gets one `session.snapshot` frame"
        ),
    ] = None,
    sidebar: Annotated[
        bool, Query(description="Also carry the sidebar feed's `session.changed` frames")
    ] = False,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="The standard SSE resume cursor")
    ] = None,
) -> EventSourceResponse:
    """Every durable event of the session as one frame (`id: <seq>`, `event: <type>`,
    `data: <envelope>`), replayed after the cursor and then live, with no gap and no
    duplicate; `heartbeat` frames while idle. No cursor means "from now"."""
    if await app.store.last_seq(session_id) is None:
        raise SessionNotFound(session_id)
    cursor = after if after is not None else last_event_id
    frames = _session_frames(app, session_id, cursor, sidebar, _guard(request))
    return _stream(request, app, frames)


def _stream(
    request: Request, app: Services, frames: AsyncIterator[ServerSentEvent | bytes]
) -> EventSourceResponse:
    """An SSE response holding one of the client's stream slots, with a write deadline: a
    subscriber that stops reading is disconnected without slowing the run or the others."""
    client = request.client.host if request.client else "unknown"
    slot = app.stream_slots.acquire(client)
    if slot is None:
        raise TooManyStreams(
            f"This client already has {app.stream_slots.per_client} event streams "
            "open; close some tabs or connections and retry.",
            limit=app.stream_slots.per_client,
        )

    async def held() -> AsyncIterator[ServerSentEvent | bytes]:
        try:
            async for frame in frames:
                yield frame
        finally:
            slot.release()

    return EventSourceResponse(
        held(),
        ping=max(app.settings.heartbeat_seconds * 3, 15),
        send_timeout=app.settings.sse_write_deadline_seconds,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        background=BackgroundTask(slot.release),  # also when the stream never started
    )


async def _sidebar_frames(app: Services, guard: Guard | None) -> AsyncIterator[ServerSentEvent]:
    client = app.feed.connect()
    try:
        with guard.watching(client.wakeup) if guard else contextlib.nullcontext():
            async for frame in _sidebar_follow(app, client, guard):
                yield frame
    finally:
        app.feed.disconnect(client)


async def _sidebar_follow(
    app: Services, client: FeedClient, guard: Guard | None
) -> AsyncIterator[ServerSentEvent]:
    yield _sidebar_heartbeat()  # at once: changes are followed from before it (docs/api.md §6)
    while True:
        changes = await client.next(timeout=app.settings.heartbeat_seconds)
        if guard and not await guard.holds():
            return  # logged out, token revoked or user removed: the stream ends
        if changes == []:
            yield _sidebar_heartbeat()
            continue
        for frame in await _changes(app, changes):
            yield frame


def _sidebar_heartbeat() -> ServerSentEvent:
    return ServerSentEvent(event="heartbeat", data=_dumps({"server_time": time.time()}))


@router.get(
    "/api/events",
    summary="Follow the sidebar (SSE)",
    response_class=EventSourceResponse,
    response_model=None,
    responses=documented(429, content=_EVENT_STREAM),
)
async def sidebar_events(request: Request, app: App) -> EventSourceResponse:
    """`session.changed` frames (`{session_id, reason, row}`, row null when deleted) and
    heartbeats; a reconnecting client refetches `GET /api/sessions`."""
    return _stream(request, app, _sidebar_frames(app, _guard(request)))
