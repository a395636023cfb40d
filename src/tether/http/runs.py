"""Runs: API.md §4 (start, Stop) and the attachments that turns refer to."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse

from tether.events import ID_PATTERN
from tether.http.deps import App
from tether.http.errors import error
from tether.http.schemas import (
    CancelRun,
    EditQueued,
    QueueIdQuery,
    QueueMessage,
    StartTurn,
    SteerRun,
)
from tether.runs.intake import check_message, decode_uploads

router = APIRouter()

# Served inline only for types a browser renders without running anything.
_INLINE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


@router.post("/api/chat/start")
async def start_turn(app: App, body: StartTurn) -> dict:
    text = check_message(body.message, app.settings)
    uploads = decode_uploads([a.model_dump() for a in body.attachments], app.settings,
                             app.engine.runtime)
    return await app.engine.start(body.session_id, text, uploads, body.model)


@router.post("/api/chat/steer")
async def steer_run(app: App, body: SteerRun) -> dict:
    return await app.engine.steer(body.stream_id, check_message(body.text, app.settings))


@router.post("/api/chat/queue")
async def queue_message(app: App, body: QueueMessage) -> dict:
    text = check_message(body.message, app.settings)
    uploads = decode_uploads([a.model_dump() for a in body.attachments], app.settings,
                             app.engine.runtime)
    return await app.queue.add(body.session_id, text, uploads)


@router.patch("/api/chat/queue")
async def edit_queued(app: App, queue_id: QueueIdQuery, body: EditQueued) -> dict:
    return await app.queue.update(queue_id, check_message(body.text, app.settings))


@router.delete("/api/chat/queue")
async def remove_queued(app: App, queue_id: QueueIdQuery) -> dict:
    return await app.queue.remove(queue_id)


@router.post("/api/chat/cancel")
async def cancel_run(app: App, body: CancelRun) -> dict:
    if body.stream_id is None and body.session_id is None:
        return error(400, "invalid_request", "Send the stream_id (or session_id) to stop.")
    return await app.engine.cancel(stream_id=body.stream_id, session_id=body.session_id)


@router.get("/api/attachments/{attachment_id}")
async def get_attachment(app: App, attachment_id: str = Path(pattern=ID_PATTERN)) -> object:
    path = app.attachments.path(attachment_id)
    meta = app.attachments.meta(attachment_id)
    if path is None or meta is None:
        return error(404, "attachment_not_found", "There is no such attachment.")
    mime = meta["mime"] if meta["mime"] in _INLINE_TYPES else "application/octet-stream"
    return FileResponse(
        path, media_type=mime, filename=meta["name"],
        content_disposition_type="inline" if mime in _INLINE_TYPES else "attachment",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=3600",
                 "Content-Security-Policy": "default-src 'none'; sandbox"})
